"""Probe: the GEMM tile tuner (dlnet/kernels/tuner.py) on this GPU: its first-use time, the throughput of grids of
c = 1..10 work-groups per compute unit for each tile (what per_cu is read from), and the nets at batch 16 planned by
the H100 database values against this device's measured model, alternated in one process.

    python3 bench/probes/tuner.py --nets resnet50,vgg16,resnet18
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("DLNET_CACHE", tempfile.mkdtemp(prefix="dlnet-tuner-"))  # a first use, not a cached one

import dlnet  # noqa: E402
import gpu  # noqa: E402
from dlnet.kernels import lowering, tuner  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nets", default="resnet50,vgg16,resnet18")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--iters", type=int, default=15)
    args = ap.parse_args()
    ctx = dlnet.Context("gpu")
    model, seconds, path = tuner.tune(ctx)
    print(f"{ctx.info}: tuned in {seconds:.2f} s (first use: compiling included), cached in {path}")
    again = time.perf_counter()
    tuner.measure(ctx)
    print(f"measured again in {time.perf_counter() - again:.2f} s (programs built)")
    print(f"{'shape':5s} {'measured':40s} database")
    for shape, m in model.items():
        print(f"{shape:5s} {str(m):40s} {lowering.GPU_TILE_MODEL[shape]}")
    for K in (256, 1024):
        sizes = dict(tuner.SIZES["gpu"], depths=(K // 4, K), max_per_cu=10)
        print(f"\nthroughput of c work-groups per compute unit over the best, K = {K}: c = 1..10")
        for shape, times in per_cu_curves(ctx, sizes).items():
            rates = [c / t for c, t in enumerate(times, 1)]
            print(f"{shape:5s} " + " ".join(f"{r / max(rates):5.2f}" for r in rates) +
                  f"   per_cu {tuner.per_cu_of(times[:6])}")
    for name in filter(None, args.nets.split(",")):
        import torchvision
        proto = gpu.export(getattr(torchvision.models, name)(weights=None).eval(), 1)
        x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
        times = {}
        for label, m in [("database", lowering.GPU_TILE_MODEL), ("measured", model)] * 2:
            tuner._MEMO[ctx.device] = m
            net = dlnet.Net(ctx).load_onnx(proto, batch=args.batch)
            times.setdefault(label, []).append(gpu.median_ms(lambda net=net: net.run({"x": x}), args.iters))
        print(f"{name} b{args.batch} ms: " + "  ".join(
            f"{k} {' '.join(f'{v:.2f}' for v in vs)}" for k, vs in times.items()))


def per_cu_curves(ctx, sizes):
    """{shape: seconds of c * CUs work-groups at depth sizes["depths"][1], c = 1..max_per_cu}, through measure()'s
    own timing."""
    curves = {}
    time_ = tuner._time

    def timed(queue, kernel, bufs, tiles, groups, K, reps):
        t = time_(queue, kernel, bufs, tiles, groups, K, reps)
        if K == sizes["depths"][1]:
            curves.setdefault(tuple(sorted(tiles.items())), []).append(t)
        return t
    tuner._time = timed
    try:
        tuner.measure(ctx, sizes)
    finally:
        tuner._time = time_
    names = {tuple(sorted(t.items())): s for s, t in tuner._tiles(ctx).items()}
    return {names[k]: v[:sizes["max_per_cu"]] for k, v in curves.items()}


if __name__ == "__main__":
    main()
