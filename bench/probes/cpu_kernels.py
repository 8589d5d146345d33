"""Per-kernel time of the CPU device's layers that dense models spend their time in, from OpenCL profiling events:
GEMMs of resnet50's 1x1 convolutions and fully connected layer (as Gemm with a constant B) and of BERT-base's
linear layers over 128 tokens, resnet50's 3x3 convolutions, and a transformer's attention, bias+GELU and LayerNorm.

    python bench/probes/cpu_kernels.py [--only gemm,conv,attention,pointwise] [--iters 7] [--threads N]

Per case the minimum over --iters runs of each kernel (the least disturbed by other processes on a shared machine)
and GFLOP/s for the products; for the products also onnxruntime's MLAS on the same MatMul (the minimum wall time of
--iters runs, intra_op_num_threads = --threads). Asserts nothing; checks each output against numpy (rel err column).
"""
import argparse
import os
import sys
import time

import numpy as np
from onnx import helper

import dlnet

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from tests.conftest import make_model, rel_l2  # noqa: E402

# (name, M, K, N): resnet50 batch 1 1x1 convolutions as products (M = output pixels), its fc; BERT-base linears
GEMMS = [("r50 56x56 64->256", 3136, 64, 256), ("r50 28x28 512->128", 784, 512, 128),
         ("r50 14x14 1024->256", 196, 1024, 256), ("r50 7x7 2048->512", 49, 2048, 512),
         ("r50 fc 2048->1000", 1, 2048, 1000), ("bert qkv 768->2304", 128, 768, 2304),
         ("bert ff1 768->3072", 128, 768, 3072), ("bert ff2 3072->768", 128, 3072, 768)]
# (name, C, H, K): resnet50 batch 1 3x3 stride-1 convolutions (pad 1)
CONVS = [("r50 3x3 64 56x56", 64, 56, 64), ("r50 3x3 128 28x28", 128, 28, 128), ("r50 3x3 256 14x14", 256, 14, 256),
         ("r50 3x3 512 7x7", 512, 7, 512)]


def profile(ctx, model, feeds, iters):
    """{kernel label: min ms}, the output, of a model run `iters` times."""
    net = dlnet.Net(ctx).load_onnx(model)
    out = list(net.run(feeds).values())[0]
    times = {}
    for _ in range(iters):
        events = [(launch.label, launch.enqueue(ctx.queue)) for launch in net.launches]
        ctx.queue.finish()
        for label, ev in events:
            times.setdefault(label, []).append((ev.profile.end - ev.profile.start) * 1e-6)
    tiles = {n.name: n.schedule.get("tile") for n in net.graph.nodes}
    net.release()
    return {k: min(v) for k, v in times.items()}, out, tiles


def row(name, times, flops, err, tiles):
    ms = sum(times.values())
    gf = f"{flops / ms * 1e-6:8.1f}" if flops else f"{'':8s}"
    print(f"{name:24s} {ms:9.3f} {gf} {err:9.1e}  {' + '.join(times)} {list(tiles.values())}", flush=True)


def ort_ms(model, feeds, iters, threads):
    """onnxruntime's minimum wall time of one run (ORT_ENABLE_ALL)."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    sess.run(None, feeds)
    best = float("inf")
    for _ in range(iters):
        t = time.perf_counter()
        sess.run(None, feeds)
        best = min(best, (time.perf_counter() - t) * 1e3)
    return best


def gemms(ctx, rng, iters):
    for name, M, K, N in GEMMS:
        a = rng.standard_normal((M, K)).astype(np.float32)
        b = rng.standard_normal((K, N)).astype(np.float32)
        model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": a}, ["y"], {"b": b})
        times, out, tiles = profile(ctx, model, {"a": a}, iters)
        ms = ort_ms(model, {"a": a}, iters, ctx.threads)
        tiles["ort"] = f"MLAS {ms:.3f} ms {2 * M * K * N / ms * 1e-6:.1f} GFLOP/s"
        row(name, times, 2 * M * K * N, rel_l2(out, a.astype(np.float64) @ b), tiles)


def convs(ctx, rng, iters):
    import torch
    for name, C, H, K in CONVS:
        x = rng.standard_normal((1, C, H, H)).astype(np.float32)
        w = (rng.standard_normal((K, C, 3, 3)) / np.sqrt(9 * C)).astype(np.float32)
        model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])], {"x": x}, ["y"],
                           {"w": w})
        times, out, tiles = profile(ctx, model, {"x": x}, iters)
        want = torch.nn.functional.conv2d(torch.from_numpy(x).double(), torch.from_numpy(w).double(), padding=1)
        row(name, times, 2 * K * C * 9 * H * H, rel_l2(out, want.numpy()), tiles)


def attention(ctx, rng, iters):
    for t, causal in [(128, 0), (128, 1), (197, 0)]:  # BERT's and GPT-2's 128 tokens, ViT-B/16's 197
        q, k, v = (rng.standard_normal((1, 12, t, 64)).astype(np.float32) for _ in range(3))
        model = make_model([helper.make_node("Attention", ["q", "k", "v"], ["y"], is_causal=causal)],
                           {"q": q, "k": k, "v": v}, ["y"], opset=23)
        times, out, tiles = profile(ctx, model, {"q": q, "k": k, "v": v}, iters)
        s = q.astype(np.float64) @ k.transpose(0, 1, 3, 2) / 8.0
        if causal:
            s = s + np.triu(np.full((t, t), -np.inf), 1)
        p = np.exp(s - s.max(-1, keepdims=True))
        want = (p / p.sum(-1, keepdims=True)) @ v
        row(f"attention 12x{t}x64{' causal' if causal else ''}", times, 4 * 12 * t * t * 64,
            rel_l2(out, want), tiles)


def pointwise(ctx, rng, iters):
    import math
    x = rng.standard_normal((1, 128, 3072)).astype(np.float32)
    bias = rng.standard_normal(3072).astype(np.float32)
    s = x.astype(np.float64) + bias
    erf = np.vectorize(math.erf)
    for op, want in [("Gelu", s * 0.5 * (1 + erf(s / math.sqrt(2)))), ("Tanh", np.tanh(s)), ("Relu", np.maximum(s, 0))]:
        nodes = [helper.make_node("Add", ["x", "b"], ["s"]), helper.make_node(op, ["s"], ["y"])]
        times, out, tiles = profile(ctx, make_model(nodes, {"x": x}, ["y"], {"b": bias}, opset=20), {"x": x}, iters)
        row(f"bias+{op} 128x3072", times, 0, rel_l2(out, want), tiles)
    x = rng.standard_normal((1, 128, 768)).astype(np.float32)
    g, b = rng.standard_normal(768).astype(np.float32), rng.standard_normal(768).astype(np.float32)
    model = make_model([helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], axis=-1)], {"x": x}, ["y"],
                       {"g": g, "b": b}, opset=17)
    x64 = x.astype(np.float64)
    want = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5) * g + b
    times, out, tiles = profile(ctx, model, {"x": x}, iters)
    row("LayerNorm 128x768", times, 0, rel_l2(out, want), tiles)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="gemm,conv,attention,pointwise")
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    ctx = dlnet.Context("cpu", profile=True, threads=args.threads)
    print(f"device: {ctx.info}, {ctx.threads} threads; min of {args.iters} runs per kernel")
    print(f"{'case':24s} {'ms':>9} {'GFLOP/s':>8} {'rel err':>9}  kernels [tiles]")
    rng = np.random.default_rng(0)
    for part, fn in [("gemm", gemms), ("conv", convs), ("attention", attention), ("pointwise", pointwise)]:
        if part in args.only.split(","):
            fn(ctx, rng, args.iters)


if __name__ == "__main__":
    main()
