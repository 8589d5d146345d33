"""Probe: a 1x1 stride-1 convolution against the same product written as a MatMul, per layer shape of resnet50 at
batch 16 (fp32): is the convolution path's fetch (window tables, implicit columns) what holds the 1x1 layers at
15-25 TFLOP/s, or the GEMM core itself?

    python3 bench/probes/pointwise_gemm.py [--batch 16] [--iters 10] [--precision fp32] [--device gpu]

Per shape: kernel time (median of --iters runs, profiling events) and TFLOP/s of Conv(x, w) with x [N, C, H, W],
and of MatMul(w [K, C], x [N, C, H*W]) (batched, w broadcast); the tile each took. --residual: the convolution is a
bottleneck's last, Relu(Conv(x, w, b) + r), and `--shapes wide` takes wide_resnet50_2's 1x1 layers; --torch adds
PyTorch's time for the same layer (cuDNN, TF32 as --precision says; CUDA events). Runs on the GPU machine; asserts
nothing.
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

SHAPES = {"resnet50": [(64, 256, 56), (256, 64, 56), (128, 512, 28), (512, 128, 28), (256, 1024, 14), (1024, 256, 14),
          (512, 2048, 7), (2048, 512, 7)],  # (C, K, H = W)
          "wide": [(256, 128, 56), (128, 256, 56), (256, 256, 56), (512, 256, 28), (256, 512, 28), (1024, 512, 14),
                   (512, 1024, 14), (2048, 1024, 7), (1024, 2048, 7)]}


def torch_ms(x, w, b, r, tf32, iters):
    """PyTorch's time for the same layer (None without torch or CUDA)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cudnn.allow_tf32 = tf32
    dev = [torch.from_numpy(a).cuda() if a is not None else None for a in (x, w[:, :, None, None], b, r)]
    tx, tw, tb, tr = dev

    def layer():
        y = torch.nn.functional.conv2d(tx, tw, tb)
        return torch.relu(y + tr) if tr is not None else y
    times = []
    with torch.no_grad():
        for _ in range(3):
            layer()
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            layer()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    return statistics.median(times)


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
    ap.add_argument("--shapes", default="resnet50", choices=sorted(SHAPES))
    ap.add_argument("--residual", action="store_true")
    ap.add_argument("--torch", action="store_true")
    args = ap.parse_args()
    ctx = dlnet.Context(args.device, precision=args.precision, profile=True)
    rng = np.random.default_rng(0)
    n = args.batch
    print(f"{'C -> K at HxW':20s} {'conv ms':>8s} {'TFLOP/s':>8s} {'matmul ms':>9s} {'TFLOP/s':>8s} {'torch ms':>8s}"
          f"  tiles, launches")
    for c, k, h in SHAPES[args.shapes]:
        x = rng.standard_normal((n, c, h, h)).astype(np.float32)
        w = (rng.standard_normal((k, c)) / np.sqrt(c)).astype(np.float32)
        b = rng.standard_normal(k).astype(np.float32) if args.residual else None
        r = rng.standard_normal((n, k, h, h)).astype(np.float32) if args.residual else None
        feeds = {"x": x, **({"r": r} if args.residual else {})}
        if args.residual:
            nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Add", ["c", "r"], ["s"]),
                     helper.make_node("Relu", ["s"], ["y"])]
            conv = make_model(nodes, feeds, ["y"], {"w": w[:, :, None, None], "b": b})
        else:
            conv = make_model([helper.make_node("Conv", ["x", "w"], ["y"])], feeds, ["y"], {"w": w[:, :, None, None]})
        mm = make_model([helper.make_node("MatMul", ["w", "x"], ["y"])], {"x": x.reshape(n, c, h * h)}, ["y"],
                        {"w": w})
        t_conv, y_conv, tiles_conv, l_conv = timed(ctx, conv, feeds, args.iters)
        t_mm, y_mm, tiles_mm, l_mm = timed(ctx, mm, {"x": x.reshape(n, c, h * h)}, args.iters)
        want = np.einsum("kc,ncp->nkp", w.astype(np.float64), x.reshape(n, c, h * h))
        err = rel_l2(y_mm.reshape(want.shape), want)
        if args.residual:
            want = np.maximum(want + b[:, None] + r.reshape(want.shape), 0)
        err = max(err, rel_l2(y_conv.reshape(want.shape), want))
        t_torch = torch_ms(x, w, b, r, args.precision == "tf32", args.iters) if args.torch else None
        fl = 2 * n * h * h * c * k
        print(f"{c:5d} -> {k:5d} at {h:3d}   {t_conv:8.3f} {fl / t_conv * 1e-9:8.1f} {t_mm:9.3f} "
              f"{fl / t_mm * 1e-9:8.1f} {t_torch or 0:8.3f}  {tiles_conv} {l_conv} | {tiles_mm} {l_mm} (err {err:.1e})",
              flush=True)

if __name__ == "__main__":
    main()
