"""optim.cl's Adam update alone on the CPU device (or --device), a work-item per element against eight a work-item
(VEC8, Options.optim_vectors), over --params parameters in tensors of a ViT layer's shapes: median ms of the update
launch and the largest difference between the two updates' parameters (both from the same state).

    python3 bench/probes/optim_cpu.py [--params 15500000] [--iters 8] [--device cpu]

Prints a table; asserts nothing.
"""
import argparse
import statistics
import time

import numpy as np

import dlnet
from dlnet.kernels.launch import chunk_table
from dlnet.kernels.runtime import cl, kernel_source
from dlnet.train import CHUNK, LOCAL, OPTIONS


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=int, default=15_500_000)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    ctx = dlnet.Context(args.device)
    n = args.params
    sizes = [768 * 3072, 3072, 768, 768 * 768] * 4
    sizes.append(n - sum(sizes))
    rows, off = [], 0
    for s in sizes:
        rows.append((off, off, off, s))
        off += s
    rng = np.random.default_rng(0)
    state = {k: rng.standard_normal(n).astype(np.float32) for k in "pgm"}
    state["v"] = np.abs(rng.standard_normal(n)).astype(np.float32)

    def buffer(a):
        buf = ctx.alloc(a.nbytes)
        ctx.upload(buf, a)
        return buf
    bufs = {k: buffer(a) for k, a in state.items()}
    hp = np.zeros(16, np.float32)
    hp[:9] = [1e-3, 0.9, 0.999, 1e-8, 0.01, 0.1, 0.001, 1, 0]  # (lr, betas, eps, wd, bias corrections, AdamW)
    hp_buf, scale = buffer(hp), buffer(np.array([1, 0], np.float32))
    table = chunk_table(rows, CHUNK)
    table_buf = buffer(table)
    queue, results, got = ctx.queue, [], {}
    for vec in (False, True):
        kernel = ctx.kernel(kernel_source("optim"), "adam", OPTIONS + (("-DVEC8",) if vec else ()))
        kernel.set_args(bufs["p"], bufs["g"], bufs["m"], bufs["v"], hp_buf, scale, table_buf)
        times = []
        for _ in range(args.iters + 2):
            t = time.perf_counter()
            cl.enqueue_nd_range_kernel(queue, kernel, (len(table) * LOCAL,), (LOCAL,))
            queue.finish()
            times.append(time.perf_counter() - t)
        for k, a in state.items():  # (one update from the same state, to compare)
            ctx.upload(bufs[k], a)
        cl.enqueue_nd_range_kernel(queue, kernel, (len(table) * LOCAL,), (LOCAL,))
        got[vec] = np.empty(n, np.float32)
        ctx.download(bufs["p"], got[vec])
        results.append(("float8 a work-item (VEC8)" if vec else "a work-item per element",
                        statistics.median(times[2:]) * 1e3))
    print(f"\nAdam over {n} parameters on {ctx.info}")
    print("| update | ms |\n|---|---|")
    for name, ms in results:
        print(f"| {name} | {ms:.1f} |")
    print(f"largest difference between the two: {float(np.abs(got[True] - got[False]).max()):.1e}")


if __name__ == "__main__":
    main()
