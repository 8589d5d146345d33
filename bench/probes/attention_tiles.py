"""Probe: attention.cl's fp32 kernel (TF32 off) at several tiles against PyTorch's fp32 SDPA, kernel time only.

    python3 bench/probes/attention_tiles.py [--shapes 16x12x197x64,16x12x256x64] [--tiles 32x32/8x8,64x32/8x8]
                                            [--causal] [--rounds 10]

Each tile (BQxBK/NTRxNTC) is forced through bench/attention.py's override of family.ATTENTION_TILES; "rules" is the
tile the family picks. Kernel ms: the median of --rounds OpenCL profiling events (PyTorch: CUDA events around
F.scaled_dot_product_attention, TF32 off, same process). Errors: relative L2 against float64. Runs on the GPU
machine; asserts nothing.
"""
import argparse
import os
import statistics
import sys

import numpy as np

import dlnet
from dlnet.plan import Plan

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from attention import forced_tile, graph, parse_tile  # noqa: E402


def kernel_ms(ctx, g, feeds, rounds):
    plan = Plan(ctx, g)
    try:
        out = plan.run(feeds)[0]
        times = []
        for _ in range(rounds):
            events = [launch.enqueue(ctx.queue) for launch in plan.launches if "Attention" in launch.label]
            ctx.queue.finish()
            times.append(sum((e.profile.end - e.profile.start) * 1e-6 for e in events))
        return statistics.median(times), out, g.nodes[-1].schedule.get("tile")
    finally:
        plan.release()


def reference(feeds, causal):
    q, k, v = (x.astype(np.float64) for x in feeds)
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = s + np.triu(np.full(s.shape[-2:], -np.inf), 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def torch_ms(feeds, causal, rounds):
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return float("nan")
    if not torch.cuda.is_available():
        return float("nan")
    torch.backends.cuda.matmul.allow_tf32 = False
    q, k, v = (torch.from_numpy(x).cuda() for x in feeds)
    times = []
    for _ in range(rounds + 2):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times[2:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="16x12x197x64,16x12x256x64,1x12x197x64")
    ap.add_argument("--tiles", default="32x32/8x8,64x32/8x8,64x32/16x8,32x64/8x8,48x32/8x8")
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--device", default="gpu", help="(cpu: attention.cl through matrix_core='portable', a check)")
    args = ap.parse_args()
    ctx = dlnet.Context(args.device, precision="fp32", profile=True).with_options(attention_mma=False)
    ctx = ctx if ctx.dev.tiled else ctx.with_options(matrix_core="portable")
    tiles = [parse_tile(t) for t in args.tiles.split(",") if t]
    print(f"device: {ctx.dev.name}; attention kernel ms (rel err against float64)")
    print(f"{'shape':>16} {'torch':>8} {'rules':>18}" + "".join(f" {t.label:>18}" for t in tiles))
    rng = np.random.default_rng(0)
    for text in args.shapes.split(","):
        shape = tuple(int(x) for x in text.split("x"))
        feeds = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
        want = reference(feeds, args.causal)
        g = graph(shape, args.causal, True)
        ms, got, tile = kernel_ms(ctx, g, feeds, args.rounds)
        row = f"{text:>16} {torch_ms(feeds, args.causal, args.rounds):8.3f} {ms:7.3f} {tile:>10}"
        for t in tiles:
            with forced_tile(ctx.dev.kind, t):
                ms, got, _ = kernel_ms(ctx, graph(shape, args.causal, True), feeds, args.rounds)
            row += f" {ms:8.3f} ({np.linalg.norm(got - want) / np.linalg.norm(want):.0e})"
        print(row, flush=True)


if __name__ == "__main__":
    main()
