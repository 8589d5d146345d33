"""Probe: fp32 products on the tensor cores with each operand split in two tf32 halves (Options.fp32_tf32x3,
mma_tf32.cl's TF32X3: three mma a product), against the fp32 FMA core and cuBLAS SGEMM (TF32 off), at the
transformers' shapes; tf32 (one mma, PyTorch's TF32) beside them. Kernel ms (median over interleaved rounds, OpenCL
profiling events) and relative L2 error against float64, on plain normal inputs and on inputs spread over six
decades (each element scaled by 10^U(-3, 3)). On the GPU machine; asserts nothing.

    python3 bench/probes/tf32x3.py [--sizes 3152x768x2304,...] [--rounds 10]
"""
import argparse
import contextlib
import os
import statistics
import sys

import numpy as np

import dlnet
from dlnet.kernels import rules

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fp32_waves import product  # noqa: E402
from wgmma_layers import _median_ms  # noqa: E402

from tests.conftest import rel_l2  # noqa: E402

SIZES = "3152x768x2304,3152x768x768,3152x768x3072,3152x3072x768,4096x768x2304,4096x3072x768,4096x4096x4096"
VARIANTS = {"fp32 FMA core": ("fp32", {"fp32_tf32x3": False}), "3xtf32 gemm_mma": ("fp32", {"fp32_tf32x3": True}),
            "3xtf32 gemm_ldsm": ("fp32", {"fp32_tf32x3": True, "ldsm_min_rows": 128}),
            "tf32 (rules)": ("tf32", {})}


# tiles tried with --x3-tiles beside rules.GEMM_TILES["tf32"]'s: eight warps, so that a warp's MI x NI blocks are
# at most 16 and its six mma of 16 of depth go into one sum (gemm_mma.cl)
EXTRA_TILES = {"huge8w": dict(TM=128, TN=128, TK=16, WARPS_M=2, WARPS_N=4, STAGES=4),
               "huge96_8w": dict(TM=96, TN=128, TK=32, WARPS_M=2, WARPS_N=4, STAGES=3)}


@contextlib.contextmanager
def forced_tf32(shape):
    """rules.rule_shape fixed to the tf32 core's `shape`."""
    rule = rules.rule_shape
    rules.rule_shape = lambda *a, **k: (True, shape)
    try:
        yield
    finally:
        rules.rule_shape = rule


def spread(x, rng):
    return (x * 10.0 ** rng.uniform(-3, 3, x.shape)).astype(np.float32)


def tiles(net):
    return ",".join(n.schedule.get("tile", "") for n in net.graph.nodes if n.op in ("MatMul", "Gemm"))


def measure(ctx, model, x, w, xs, ws, M, K, N, errs, name, no_errors):
    """(ctx, net, its MatMul launches) for the product; errs[name]: relative L2 errors, plain and spread."""
    e1 = e2 = float("nan")
    if not no_errors:
        net = dlnet.Net(ctx).load_onnx(model)
        ref = np.maximum(x, 0).astype(np.float64) @ w
        e1 = rel_l2(np.asarray(list(net.run({"x": x}).values())[0]), ref)
        net.release()
        model_s, _, _ = product(M, K, N, np.random.default_rng(1))
        for init in model_s.graph.initializer:
            if init.name == "w":
                init.raw_data = ws.tobytes()
        net_s = dlnet.Net(ctx).load_onnx(model_s)
        ref_s = np.maximum(xs, 0).astype(np.float64) @ ws
        e2 = rel_l2(np.asarray(list(net_s.run({"x": xs}).values())[0]), ref_s)
        net_s.release()
    errs[name] = (e1, e2)
    net = dlnet.Net(ctx).load_onnx(model)
    return ctx, net, [la for la in net.launches if "Relu" not in la.label]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default=SIZES, help="MxKxN,...")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--x3-tiles", default="", help="also 3xtf32 on gemm_mma.cl with each tile forced, e.g. "
                    "huge,huge96,big,wide,tall,huge8w,huge96_8w")
    ap.add_argument("--no-errors", action="store_true", help="time only")
    args = ap.parse_args()
    rules.GEMM_TILES["tf32"].update(EXTRA_TILES)
    import torch
    base = dlnet.Context("gpu", profile=True)
    ctxs = {name: dlnet.Context(base.info, precision=p, profile=True, options=base.options.replace(**o))
            for name, (p, o) in VARIANTS.items()}
    rng = np.random.default_rng(0)
    print(f"{base.device.name}; kernel ms (median of {args.rounds}), TFLOP/s, of cuBLAS fp32; rel err plain / spread")
    for size in args.sizes.split(","):
        M, K, N = (int(v) for v in size.split("x"))
        model, x, w = product(M, K, N, rng)
        xs, ws = spread(x, rng), spread(w, rng)
        plans, errs = {}, {}
        variants = [(name, ctx, contextlib.nullcontext()) for name, ctx in ctxs.items()] + [
            (f"3xtf32 {t}", ctxs["3xtf32 gemm_mma"], forced_tf32(t)) for t in args.x3_tiles.split(",") if t]
        for name, ctx, patch in variants:
            with patch:
                plans[name] = measure(ctx, model, x, w, xs, ws, M, K, N, errs, name, args.no_errors)
        times = {name: [] for name in plans}
        for _ in range(args.rounds):
            for name, (ctx, net, launches) in plans.items():
                events = [la.enqueue(ctx.queue) for la in launches]
                ctx.queue.finish()
                times[name].append(sum((e.profile.end - e.profile.start) * 1e-6 for e in events))
        cub = {}
        for tf32 in (False, True):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            a, b = torch.relu(torch.as_tensor(x)).cuda(), torch.as_tensor(w).cuda()
            ms = _median_ms(lambda: a @ b, args.rounds)
            y = (a @ b).cpu().double().numpy()
            a_s, b_s = torch.relu(torch.as_tensor(xs)).cuda(), torch.as_tensor(ws).cuda()
            y_s = (a_s @ b_s).cpu().double().numpy()
            cub[tf32] = (ms, rel_l2(y, np.maximum(x, 0).astype(np.float64) @ w),
                         rel_l2(y_s, np.maximum(xs, 0).astype(np.float64) @ ws))
        torch.backends.cuda.matmul.allow_tf32 = False
        flop = 2.0 * M * N * K
        ref = cub[False][0]
        print(f"{M}x{K}x{N}")
        for name, (ms, e1, e2) in (("cuBLAS fp32", cub[False]), ("cuBLAS tf32", cub[True])):
            print(f"  {name:18s} {ms:.3f} ({flop / ms * 1e-9:5.1f}) {ref / ms:.2f}  err {e1:.1e} / {e2:.1e}")
        for name, (ctx, net, launches) in plans.items():
            ms = statistics.median(times[name])
            labels = "+".join(la.label.split(" ", 2)[-1] for la in launches)
            print(f"  {name:18s} {ms:.3f} ({flop / ms * 1e-9:5.1f}) {ref / ms:.2f}  err {errs[name][0]:.1e} / "
                  f"{errs[name][1]:.1e}  [{labels}] {tiles(net)}", flush=True)
            net.release()


if __name__ == "__main__":
    main()
