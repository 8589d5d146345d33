"""The fused attention kernel (attention.cl) against the unfused decomposition dlnet ran before (a batched Gemm for
the scores, a Softmax, a Gemm for the output: the Tq x Tk scores in memory), on one device, in one run.

    python bench/attention.py [--device cpu] [--iters 10] [--shapes 1x8x128x64,...] [--tiles 32x32/8x8,...]

Each shape BxHxTxD runs self-attention without a mask and causal (the decomposition adds a constant -inf
triangle). Times: the median of --iters calls of Plan.run (inputs up and the output down included, the same for
both) after two warm-up calls. The fused column is the algorithm the schedule picks (flash_cpu on CPUs, flash
elsewhere); --tiles also times attention.cl's work-group kernel ("flash", run on a CPU through
matrix_core="portable") at each of these tiles (BQxBK/NTRxNTC). Prints a table; asserts nothing (the tests check the
values).
"""
import argparse
import contextlib
import statistics
import time

import numpy as np

import dlnet
from dlnet.graph.ir import Builder, Graph
from dlnet.kernels.families import attention as family
from dlnet.plan import Plan

SHAPES = ["1x8x128x64", "1x8x512x64", "2x12x256x64", "1x4x1024x128", "4x8x200x80"]


def graph(shape, causal, fused):
    b, h, t, d = shape
    g = Graph("bench")
    bld = Builder(g)
    q, k, v = (g.add_input(n, "float32", (b, h, t, d)) for n in "qkv")
    scale = float(1 / np.sqrt(d))
    if fused:
        y = bld.op("Attention", [q, k, v], {"scale": scale, "causal": int(causal)})
    else:
        s = bld.op("Gemm", [q, k], {"transB": 1, "alpha": scale})
        if causal:
            s = bld.op("Add", [s, bld.const(np.triu(np.full((t, t), -np.inf, np.float32), 1))])
        y = bld.op("Gemm", [bld.op("Softmax", [s], {"axis": 3}), v])
    g.outputs, g.output_names = [y], ["y"]
    return g


def timed(ctx, g, feeds, iters):
    """(median ms, output, the last node's schedule)"""
    plan = Plan(ctx, g)
    try:
        for _ in range(2):
            out = plan.run(feeds)[0]
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            plan.run(feeds)
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3, out, g.nodes[-1].schedule
    finally:
        plan.release()


@contextlib.contextmanager
def forced_tile(kind, tile):
    """family.ATTENTION_TILES[kind] replaced by `tile` inside the block."""
    default = family.ATTENTION_TILES[kind]
    family.ATTENTION_TILES[kind] = tile
    try:
        yield
    finally:
        family.ATTENTION_TILES[kind] = default


def parse_tile(text):
    blocks, grid = text.split("/")
    bq, bk = (int(x) for x in blocks.split("x"))
    ntr, ntc = (int(x) for x in grid.split("x"))
    return family.AttentionTile(bq, bk, ntr, ntc)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--tiles", default="", help="fused kernel tiles to time too, e.g. 32x32/8x8,16x64/4x16")
    args = ap.parse_args()
    ctx = dlnet.Context(args.device)
    portable = ctx if ctx.dev.tiled else ctx.with_options(matrix_core="portable")
    tiles = [parse_tile(t) for t in args.tiles.split(",") if t]
    kind = ctx.dev.kind
    print(f"device: {ctx.dev.name} ({kind})")
    head = f"{'shape BxHxTxD':>16} {'causal':>6} {'unfused ms':>10} {'fused ms':>9} {'algo tile':>18} " \
           f"{'speed-up':>8} {'rel err':>8}"
    print(head + "".join(f" {'flash ' + t.label:>20}" for t in tiles))
    rng = np.random.default_rng(0)
    for text in args.shapes.split(","):
        shape = tuple(int(x) for x in text.split("x"))
        feeds = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
        for causal in (False, True):
            unfused, want, _ = timed(ctx, graph(shape, causal, False), feeds, args.iters)
            fused, got, how = timed(ctx, graph(shape, causal, True), feeds, args.iters)
            err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
            algo = f"{how['algo']} {how['tile']}"
            row = f"{text:>16} {str(causal):>6} {unfused:10.2f} {fused:9.2f} {algo:>18} {unfused / fused:7.2f}x " \
                  f"{err:8.1e}"
            for t in tiles:
                with forced_tile(kind, t):
                    row += f" {timed(portable, graph(shape, causal, True), feeds, args.iters)[0]:17.2f} ms"
            print(row, flush=True)


if __name__ == "__main__":
    main()
