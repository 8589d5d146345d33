"""Probe: does an upload from pinned memory on a second queue overlap kernels on the first? A 9.6 MB input in C
chunks, each chunk's kernel waiting for its chunk's copy (event), against the copy then the kernels on one queue.
Median ms of 50 runs each.

    python3 bench/probes/overlap.py [--mib 9.6] [--chunks 4] [--work 64]
"""
import argparse
import statistics
import time

import numpy as np
import pyopencl as cl

import dlnet

SRC = """
__kernel void busy(__global const float* x, __global float* y, int work) {
    const size_t i = get_global_id(0);
    float v = x[i], a = 0.0f;
    for (int k = 0; k < work; k++) a = fma(a, 0.999f, v);
    y[i] = a;
}
"""


def median_ms(fn, iters=50):
    fn()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=float, default=9.6)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--work", type=int, default=64)
    args = ap.parse_args()
    ctx = dlnet.Context("gpu")
    q, q2 = ctx.queue, cl.CommandQueue(ctx.cl, ctx.device)
    n = int(args.mib * 2**20 / 4) // (args.chunks * 1024) * args.chunks * 1024  # sub-buffers 4 KiB aligned
    step = n // args.chunks
    mf = cl.mem_flags
    pinned = cl.Buffer(ctx.cl, mf.ALLOC_HOST_PTR, n * 4)
    host, _ = cl.enqueue_map_buffer(q, pinned, cl.map_flags.WRITE, 0, (n,), np.float32)
    host[:] = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    d, out = cl.Buffer(ctx.cl, mf.READ_WRITE, n * 4), cl.Buffer(ctx.cl, mf.READ_WRITE, n * 4)
    k = cl.Program(ctx.cl, SRC).build().busy
    subs = [(d.get_sub_region(i * step * 4, step * 4), out.get_sub_region(i * step * 4, step * 4))
            for i in range(args.chunks)]

    def kernels(waits=None):
        for i, (a, b) in enumerate(subs):
            k.set_args(a, b, np.int32(args.work))
            cl.enqueue_nd_range_kernel(q, k, (step,), (256,), wait_for=[waits[i]] if waits else None)

    def copy_only():
        cl.enqueue_copy(q, d, host, is_blocking=False)
        q.finish()

    def kernels_only():
        kernels()
        q.finish()

    def serial():
        cl.enqueue_copy(q, d, host, is_blocking=False)
        kernels()
        q.finish()

    def overlapped():
        evs = [cl.enqueue_copy(q2, subs[i][0], host[i * step:(i + 1) * step], is_blocking=False)
               for i in range(args.chunks)]
        q2.flush()
        kernels(evs)
        q.finish()

    rows = [("copy", copy_only), ("kernels", kernels_only), ("serial", serial), ("overlapped", overlapped)]
    res = {name: median_ms(fn) for name, fn in rows}
    cl.enqueue_copy(q, host, out)
    for name, ms in res.items():
        print(f"{name:12s} {ms:7.3f} ms")
    print(f"saved by overlap: {res['serial'] - res['overlapped']:.3f} ms (at most min(copy, kernels) = "
          f"{min(res['copy'], res['kernels']):.3f})")


if __name__ == "__main__":
    main()
