"""Probe: fp32 products at the transformers' shapes on gemm_core.cl against cuBLAS SGEMM (TF32 off), and what the
last, partial wave of tiles costs: each product with dlnet's pick, with each GPU tile forced (split-K by the rule,
or none), and as two bands of rows (the rows whose tiles fill whole waves of 128 x 128 tiles, then the rest with the
rule's pick: split-K where they leave the device short), their kernel times summed. Median kernel ms over
interleaved rounds (OpenCL profiling events); cuBLAS in the same process. On the GPU machine; asserts nothing.

    python3 bench/probes/fp32_waves.py [--sizes 3152x768x3072,...] [--rounds 10] [--tiles huge,wide,mid,big]
                                         [--splits 2,3]
"""
import argparse
import contextlib
import os
import statistics
import sys

import numpy as np
from onnx import helper

import dlnet
from dlnet.kernels import rules
from dlnet.kernels.families import matmul

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tests.conftest import make_model, rel_l2  # noqa: E402

SIZES = "3152x768x2304,3152x768x768,3152x768x3072,3152x3072x768,4096x768x2304,4096x768x768,4096x768x3072," \
        "4096x3072x768,2816x768x3072"


@contextlib.contextmanager
def forced(shape=None, splits=None):
    """rules.rule_shape fixed to the fp32 core's `shape`, matmul.pick_splits to `splits` (None: the rule's)."""
    rule, split = rules.rule_shape, matmul.pick_splits
    if shape:
        rules.rule_shape = lambda *a, **k: (False, shape)
    if splits:
        matmul.pick_splits = lambda *a, **k: splits
    try:
        yield
    finally:
        rules.rule_shape, matmul.pick_splits = rule, split


def product(M, K, N, rng):
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("MatMul", ["a", "w"], ["y"])]
    return make_model(nodes, {"x": x}, ["y"], {"w": w}, opset=17), x, w


def plan(ctx, model, x, w):
    """A loaded net, its MatMul launches (the Relu's left out) and its error against float64."""
    net = dlnet.Net(ctx).load_onnx(model)
    y = np.asarray(list(net.run({"x": x}).values())[0])
    err = rel_l2(y, np.maximum(x, 0).astype(np.float64) @ w)
    return net, [la for la in net.launches if "Relu" not in la.label], err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default=SIZES, help="MxKxN,...")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--tiles", default="huge,wide,mid,big")
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--splits", default="", help="also each tile with K split so many ways (forced), e.g. 2,3")
    args = ap.parse_args()
    ctx = dlnet.Context(args.device, profile=True)
    units = ctx.device.max_compute_units
    rng = np.random.default_rng(0)
    print(f"{ctx.device.name}: {units} compute units; kernel ms (median of {args.rounds}), TFLOP/s in brackets")
    for size in args.sizes.split(","):
        M, K, N = (int(v) for v in size.split("x"))
        model, x, w = product(M, K, N, rng)
        variants = {"dlnet": forced()}
        for s in args.tiles.split(","):
            variants[f"{s}"] = forced(s)
            variants[f"{s}/1"] = forced(s, 1)
            for n in (int(v) for v in args.splits.split(",") if v):
                variants[f"{s}/{n}"] = forced(s, n)
        plans = {}
        for name, patch in variants.items():
            with patch:
                plans[name] = [plan(ctx, model, x, w)]
        per_wave = 2 * units // -(-N // 128)  # row tiles of 128 x 128 whole waves hold
        rows = -(-M // 128) // per_wave * per_wave * 128
        if 0 < rows < M:  # the rows of whole waves, then the rest: two products, two plans
            pa, xa, wa = product(rows, K, N, rng)
            pb, xb, wb = product(M - rows, K, N, rng)
            plans[f"bands {rows}+{M - rows}"] = [plan(ctx, pa, xa, wa), plan(ctx, pb, xb, wb)]
        times = {name: [] for name in plans}
        for _ in range(args.rounds):
            for name, parts in plans.items():
                total = 0.0
                for net, launches, _ in parts:
                    events = [la.enqueue(ctx.queue) for la in launches]
                    ctx.queue.finish()
                    total += sum((e.profile.end - e.profile.start) * 1e-6 for e in events)
                times[name].append(total)
        ref = cublas_ms(x, w, args.rounds) if args.device == "gpu" else float("nan")
        flop = 2.0 * M * N * K
        line = [f"{M}x{K}x{N}: cuBLAS {ref:.3f} ({flop / ref * 1e-9:.1f})"]
        for name, parts in plans.items():
            ms = statistics.median(times[name])
            labels = "+".join(la.label.split(" ", 2)[-1] for _, launches, _ in parts for la in launches)
            err = max(e for _, _, e in parts)
            line.append(f"  {name:18s} {ms:.3f} ({flop / ms * 1e-9:.1f}) {ref / ms:.2f} of cuBLAS  [{labels}] "
                        f"err {err:.1e}")
            for net, _, _ in parts:
                net.release()
        print("\n".join(line), flush=True)


def cublas_ms(x, w, rounds):
    import torch
    from wgmma_layers import _median_ms
    torch.backends.cuda.matmul.allow_tf32 = False
    a, b = torch.relu(torch.as_tensor(x)).cuda(), torch.as_tensor(w).cuda()
    return _median_ms(lambda: a @ b, rounds)


if __name__ == "__main__":
    main()
