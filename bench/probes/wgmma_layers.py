"""Probe: fp16 (or tf32) Linear layers (bias, GELU's tanh form or none, half in and out in fp16: the transformers'
products) on dlnet's core without wgmma (Options.wgmma off: gemm_ldsm.cl in fp16, gemm_mma.cl in tf32), on
gemm_wgmma.cl with dlnet's rules and with several tile tables, all plans in one process; median Gemm kernel ms over
interleaved rounds (OpenCL profiling events); beside them PyTorch CUDA's F.linear (cuBLAS, with GELU when the layer
has it) in the same process. On a Hopper GPU; asserts nothing.

    python3 bench/probes/wgmma_layers.py [--precision fp16|tf32] [--bare] [--sizes 4096x768x3072,...]
                                         [--tiles 128,256,4;128,128,3] [--rounds 10] [--set name=value ...]
"""
import argparse
import ast
import os
import statistics
import sys

import numpy as np

import dlnet
from dlnet.kernels import rules

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gemm_epilogue import layer, make_model  # noqa: E402
from onnx import helper  # noqa: E402


def build(ctx, model, tile):
    """A net with gemm_wgmma.cl's tile table set to `tile` (TM, TN, STAGES), dlnet's own (an empty tuple), or wgmma
    off (None)."""
    table = rules.GEMM_TILES["wgmma_f16" if ctx.precision == "fp16" else "wgmma_tf32"]
    saved = dict(table)
    if tile:
        TM, TN, ST = tile
        for shape in [k for k, v in table.items() if isinstance(v, dict)]:
            table[shape] = dict(table[shape], TM=TM, TN=TN, STAGES=ST)
    try:
        return dlnet.Net(ctx.with_options(wgmma=tile is not None)).load_onnx(model)
    finally:
        table.update(saved)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4096x768x3072,4096x3072x768,4096x768x2304,4096x768x768,3152x768x3072,"
                                       "4096x4096x4096")
    ap.add_argument("--tiles", default="128,256,4;128,128,4;128,128,3;128,256,3")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--precision", default="fp16", choices=("fp16", "tf32"))
    ap.add_argument("--bare", action="store_true", help="the product alone: MatMul(x, w), no bias, nothing fused")
    ap.add_argument("--set", nargs="*", default=[], help="dlnet.Options fields, name=value (Python literals)")
    args = ap.parse_args()
    ctx = dlnet.Context("gpu", precision=args.precision, profile=True).with_options(
        **{k: ast.literal_eval(v) for k, v in (kv.split("=", 1) for kv in args.set)})
    tiles = [None, ()] + [tuple(int(v) for v in t.split(",")) for t in args.tiles.split(";")]
    names = ["ldsm" if args.precision == "fp16" else "mma.sync", "wgmma (rules)"] + \
        [f"wgmma {t[0]}x{t[1]}/{t[2]}" for t in tiles[2:]]
    print("| M x K x N | act | " + " | ".join(names) + " | cuBLAS (torch linear) | best TFLOP/s | of cuBLAS |\n"
          "|---|---|" + "---|" * (len(names) + 3))
    rng = np.random.default_rng(0)
    for size in args.sizes.split(","):
        M, K, N = (int(v) for v in size.split("x"))
        for act in ((None,) if args.bare else (False, True)):
            model, feeds = bare_product(M, K, N, rng) if args.bare else layer(M, K, N, act, rng)
            nets = [build(ctx, model, t) for t in tiles]
            for net in nets:
                net.run(feeds)
            times = [[] for _ in nets]
            for _ in range(args.rounds):
                for i, net in enumerate(nets):
                    events = [(launch.label, launch.enqueue(ctx.queue)) for launch in net.launches]
                    ctx.queue.finish()
                    times[i].append(sum((e.profile.end - e.profile.start) * 1e-6 for lb, e in events if "Gemm" in lb))
            ms = [statistics.median(t) for t in times]
            ref = cublas_ms(model, feeds, args.precision, act, args.rounds)
            cells = " | ".join(f"{t:.4f}" for t in ms)
            kind = "bare" if act is None else "GeluTanh" if act else "-"
            print(f"| {size} | {kind} | {cells} | {ref:.4f} | {2e-9 * M * N * K / min(ms):.0f} | "
                  f"{ref / min(ms):.2f} |", flush=True)


def bare_product(M, K, N, rng):
    """MatMul(a, w) of a constant w, nothing fused: the product alone, as the GEMM bars count it (a = Relu(x): in
    fp16 the graph's float input would keep A in float)."""
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("MatMul", ["a", "w"], ["y"])]
    return make_model(nodes, {"x": x}, ["y"], {"w": w}, opset=20), {"x": x}


def cublas_ms(model, feeds, precision, act, rounds):
    """PyTorch CUDA's median ms for the layer's product (F.linear with bias, then GELU; act None: x @ w alone), in
    half or TF32."""
    import torch
    from onnx import numpy_helper
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    dt = torch.float16 if precision == "fp16" else torch.float32
    x = torch.relu(torch.as_tensor(feeds["x"])).to("cuda", dt)
    if act is None:
        w = torch.as_tensor(inits["w"]).to("cuda", dt)
        return _median_ms(lambda: x @ w, rounds)
    w, b = (torch.as_tensor(inits[k]).to("cuda", dt) for k in ("w", "b"))
    wt = w.t().contiguous()
    f = (lambda: torch.nn.functional.gelu(torch.nn.functional.linear(x, wt, b), approximate="tanh")) if act else \
        (lambda: torch.nn.functional.linear(x, wt, b))
    return _median_ms(f, rounds)


def _median_ms(f, rounds, reps=20):
    """Median over `rounds` of the mean ms of `reps` calls of f back to back between two CUDA events: one call alone
    between events also times its launch (about 0.01-0.04 ms more than the kernels of a 0.03 ms layer)."""
    import torch
    for _ in range(3):
        f()
    ts = []
    for _ in range(rounds):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(reps):
            f()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) / reps)
    return statistics.median(ts)


if __name__ == "__main__":
    main()
