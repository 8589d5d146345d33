"""Probe: gemm.cl's epilogue on gemm_ldsm.cl (precision "fp16" on NVIDIA): a Linear layer (bias, and a fused GELU or
none) with y's column pairs stored as one (Y_PAIRS) and one by one, both plans in one process, kernel time by
OpenCL profiling events, interleaved rounds; the outputs' relative difference. Asserts nothing.

    python3 bench/probes/gemm_epilogue.py [--sizes 4096x768x3072,4096x3072x768] [--precision fp16] [--rounds 15]
"""
import argparse
import os
import statistics
import sys

import numpy as np
import pyopencl as cl
from onnx import helper

import dlnet
from dlnet.kernels.families import matmul

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from tests.conftest import make_model, rel_l2  # noqa: E402

ORIGINAL = matmul.gemm_source


def without_pairs(core, tiles, strides, idx, act=None, has_c=False, aligned=(True, True), halves=None):
    halves = {k: v for k, v in (halves or {}).items() if k != "Y_PAIRS"}
    return ORIGINAL(core, tiles, strides, idx, act, has_c, aligned, halves)


def layer(M, K, N, act, rng):
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = (rng.standard_normal((K, N)) / np.sqrt(K)).astype(np.float32)
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Gemm", ["a", "w", "b"], ["p"])]
    nodes.append(helper.make_node("Gelu", ["p"], ["q"], approximate="tanh") if act else
                 helper.make_node("Identity", ["p"], ["q"]))
    nodes.append(helper.make_node("Tanh", ["q"], ["y"]))
    return make_model(nodes, {"x": x}, ["y"], {"w": w, "b": rng.standard_normal(N).astype(np.float32)},
                      opset=20), {"x": x}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4096x768x3072,4096x3072x768,4096x768x2304,3152x768x3072")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--ptx", default="", help="a folder for the Gemm kernels' PTX (NVIDIA's program binaries)")
    args = ap.parse_args()
    ctx = dlnet.Context("gpu", precision=args.precision, profile=True)
    rng = np.random.default_rng(0)
    print("| M x K x N | act | one by one ms | pairs ms | TFLOP/s (pairs) | rel diff |\n|---|---|---|---|---|---|")
    for size in args.sizes.split(","):
        M, K, N = (int(v) for v in size.split("x"))
        for act in (False, True):
            model, feeds = layer(M, K, N, act, rng)
            nets = []
            for source in (without_pairs, ORIGINAL):
                matmul.gemm_source = source
                nets.append(dlnet.Net(ctx).load_onnx(model))
            matmul.gemm_source = ORIGINAL
            outs = [net.run(feeds)["y"] for net in nets]
            if args.ptx:
                os.makedirs(args.ptx, exist_ok=True)
                for name, net in zip(("single", "pairs"), nets):
                    kernel = next(launch.kernel for launch in net.launches if "Gemm" in launch.label)
                    with open(os.path.join(args.ptx, f"{size}_{int(act)}_{name}.ptx"), "wb") as f:
                        f.write(kernel.program.get_info(cl.program_info.BINARIES)[0])
            times = [[], []]
            for _ in range(args.rounds):
                for i, net in enumerate(nets):
                    events = [(launch.label, launch.enqueue(ctx.queue)) for launch in net.launches]
                    ctx.queue.finish()
                    times[i].append(sum((e.profile.end - e.profile.start) * 1e-6 for lb, e in events if "Gemm" in lb))
            a, b = (statistics.median(t) for t in times)
            print(f"| {size} | {'GeluTanh' if act else '-'} | {a:.4f} | {b:.4f} | {2e-9 * M * N * K / b:.0f} | "
                  f"{rel_l2(outs[1], outs[0]):.1e} |", flush=True)


if __name__ == "__main__":
    main()
