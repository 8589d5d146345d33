"""ConvNeXt's layout copies, with and without graph/passes/transposes.py: Transpose nodes left in the graph, launches,
and kernel time per op kind (OpenCL events, each launch's fastest run) for torchvision's ConvNeXt written in plain
torch (tests/onnx/test_convnext.py; torchvision is not needed) at convnext_small's widths and depths.

    python bench/convnext_layout.py [--depths 3,3,27,3] [--dims 96,192,384,768] [--image 224] [--batch 1] [--iters 3]
                                    [--device cpu] [--precision fp32] [--portable]

--device gpu times the GPU (its profile events); --portable runs the GPU kernels on PoCL. Random weights; the two
graphs' outputs are compared. Prints tables; asserts nothing.
"""
import argparse
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import dlnet  # noqa: E402
from dlnet.graph import passes  # noqa: E402
from dlnet.graph.passes.transposes import layernorm_layouts, transposes_into_pointwise  # noqa: E402


def profile(net, feeds, ctx, iters):
    """{op kind: ms}: each launch's fastest of `iters` runs (the CPU is shared: the minimum is the stable number)."""
    net.run(feeds)
    best = [float("inf")] * len(net.launches)
    for _ in range(iters):
        events = [launch.enqueue(ctx.queue) for launch in net.launches]
        ctx.queue.finish()
        best = [min(b, (ev.profile.end - ev.profile.start) * 1e-6) for b, ev in zip(best, events)]
    totals = {}
    for launch, ms in zip(net.launches, best):
        key = launch.layer.split(" ")[-1] if launch.layer else launch.label  # the node's op
        totals[key] = totals.get(key, 0.0) + ms
    return totals


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", default="96,192,384,768")
    ap.add_argument("--depths", default="3,3,27,3")
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", default="fp32", help="fp32, tf32 or fp16")
    ap.add_argument("--portable", action="store_true")
    args = ap.parse_args()
    import torch

    from tests.onnx.test_convnext import _export, _model
    dims, depths = [int(v) for v in args.dims.split(",")], [int(v) for v in args.depths.split(",")]
    module = _model(tuple(dims), tuple(depths))
    shape = (args.batch, 3, args.image, args.image)
    ctx = dlnet.Context(args.device, precision=args.precision, profile=True)
    if args.portable:
        ctx = ctx.with_options(matrix_core="portable")
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    with tempfile.TemporaryDirectory(prefix="dlnet-convnext-") as folder:
        path = _export(module, shape, os.path.join(folder, "model.onnx"), "ts17")
        results = {}
        full = list(passes.INFERENCE_PASSES)
        for name, drop in (("with copies", (layernorm_layouts, transposes_into_pointwise)), ("without", ())):
            passes.INFERENCE_PASSES[:] = [p for p in full if p not in drop]
            try:
                net = dlnet.Net(ctx).load_onnx(path)
                y = net.run({"x": x})["y"]
                ops = [n.op for n in net.graph.nodes]
                results[name] = (y, ops.count("Transpose"), len(net.launches), profile(net, {"x": x}, ctx, args.iters))
                net.release()
            finally:
                passes.INFERENCE_PASSES[:] = full
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    print(f"ConvNeXt dims {dims} depths {depths}, {shape}, {args.device} {args.precision}"
          f"{' (GPU kernels on PoCL)' if args.portable else ''}, {args.iters} runs")
    print(f"{'graph':12s} {'Transposes':>10} {'launches':>8} {'kernel ms':>10} {'rel err vs torch':>17}")
    for name, (y, transposes, launches, totals) in results.items():
        err = np.linalg.norm(y - want) / np.linalg.norm(want)
        print(f"{name:12s} {transposes:10d} {launches:8d} {sum(totals.values()):10.2f} {err:17.2e}")
    kinds = sorted(set().union(*[r[3] for r in results.values()]),
                   key=lambda k: -max(r[3].get(k, 0.0) for r in results.values()))
    print(f"\n{'kind':40s} " + " ".join(f"{name:>12s}" for name in results))
    for key in kinds[:16]:
        print(f"{key:40s} " + " ".join(f"{r[3].get(key, 0.0):12.2f}" for r in results.values()))


if __name__ == "__main__":
    main()
