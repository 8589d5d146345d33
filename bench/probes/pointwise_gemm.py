"""Probe: a 1x1 stride-1 convolution against the same product written as a MatMul, per layer shape of resnet50 at
batch 16 (fp32): is the convolution path's fetch (window tables, implicit columns) what holds the 1x1 layers at
15-25 TFLOP/s, or the GEMM core itself?

    python3 bench/probes/pointwise_gemm.py [--batch 16] [--iters 10] [--precision fp32] [--device gpu]

Per shape: kernel time (median of --iters runs, profiling events) and TFLOP/s of Conv(x, w) with x [N, C, H, W],
and of MatMul(w [K, C], x [N, C, H*W]) (batched, w broadcast); the tile each took. Runs on the GPU machine;
asserts nothing.
"""
import argparse
import os
import statistics
import sys

import numpy as np
from onnx import helper

import dlnet

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from tests.conftest import make_model, rel_l2  # noqa: E402

SHAPES = [(64, 256, 56), (256, 64, 56), (128, 512, 28), (512, 128, 28), (256, 1024, 14), (1024, 256, 14),
          (512, 2048, 7), (2048, 512, 7)]  # (C, K, H = W)


def timed(ctx, model, feeds, iters):
    net = dlnet.Net(ctx).load_onnx(model)
    out = np.array(list(net.run(feeds).values())[0])
    times = []
    for _ in range(iters):
        events = [launch.enqueue(ctx.queue) for launch in net.launches]
        ctx.queue.finish()
        times.append(sum((e.profile.end - e.profile.start) * 1e-6 for e in events))
    tiles = [n.schedule.get("tile") for n in net.graph.nodes if n.op in ("Conv", "Gemm", "MatMul")]
    labels = [launch.label.split(" ", 1)[-1] for launch in net.launches]
    net.release()
    return statistics.median(times), out, tiles, labels


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--device", default="gpu", help="dlnet device: gpu, cpu or ocl:N")
    args = ap.parse_args()
    ctx = dlnet.Context(args.device, precision=args.precision, profile=True)
    rng = np.random.default_rng(0)
    n = args.batch
    print(f"{'C -> K at HxW':20s} {'conv ms':>8s} {'TFLOP/s':>8s} {'matmul ms':>9s} {'TFLOP/s':>8s}  tiles, launches")
    for c, k, h in SHAPES:
        x = rng.standard_normal((n, c, h, h)).astype(np.float32)
        w = (rng.standard_normal((k, c)) / np.sqrt(c)).astype(np.float32)
        conv = make_model([helper.make_node("Conv", ["x", "w"], ["y"])], {"x": x}, ["y"], {"w": w[:, :, None, None]})
        mm = make_model([helper.make_node("MatMul", ["w", "x"], ["y"])], {"x": x.reshape(n, c, h * h)}, ["y"],
                        {"w": w})
        t_conv, y_conv, tiles_conv, l_conv = timed(ctx, conv, {"x": x}, args.iters)
        t_mm, y_mm, tiles_mm, l_mm = timed(ctx, mm, {"x": x.reshape(n, c, h * h)}, args.iters)
        want = np.einsum("kc,ncp->nkp", w.astype(np.float64), x.reshape(n, c, h * h))
        err = max(rel_l2(y_conv.reshape(want.shape), want), rel_l2(y_mm.reshape(want.shape), want))
        fl = 2 * n * h * h * c * k
        print(f"{c:5d} -> {k:5d} at {h:3d}   {t_conv:8.3f} {fl / t_conv * 1e-9:8.1f} {t_mm:9.3f} "
              f"{fl / t_mm * 1e-9:8.1f}  {tiles_conv} {l_conv} | {tiles_mm} {l_mm} (err {err:.1e})", flush=True)


if __name__ == "__main__":
    main()
