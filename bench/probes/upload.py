"""Probe: uploading an ordinary (pageable) numpy array to the device: the driver's own staging against copying it
into pinned memory first (by T threads, in chunks of C MiB with the device copy of one chunk overlapping the host
copy of the next), and against an already pinned array. Median ms of 50 uploads each, with the check that the device
holds the array.

    python3 bench/probes/upload.py [--mib 9.6] [--threads 1,2,4,8] [--chunks 1,2,4,0]     (chunk 0: one piece)
"""
import argparse
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyopencl as cl

import dlnet


def median_ms(fn, iters=50):
    fn()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def staged(queue, buf, src, stage, pool, threads, chunk):
    """src (uint8, contiguous) -> buf through the pinned uint8 array `stage` (2 chunks long, or src's size)."""
    n = src.size
    chunk = chunk or n
    events = [None, None]
    for i, off in enumerate(range(0, n, chunk)):
        slot = i % 2 if chunk < n else 0
        if events[slot] is not None:
            events[slot].wait()
        m = min(chunk, n - off)
        base = slot * chunk
        step = -(-m // threads)
        list(pool.map(lambda p: np.copyto(stage[base + p:base + min(p + step, m)], src[off + p:off + min(p + step, m)]),
                      range(0, m, step)))
        events[slot] = cl.enqueue_copy(queue, buf, stage[base:base + m], dst_offset=off, is_blocking=False)
    queue.finish()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=float, default=16 * 3 * 224 * 224 * 4 / 2**20)
    ap.add_argument("--threads", default="1,2,4,8")
    ap.add_argument("--chunks", default="0,1,2,4")
    args = ap.parse_args()
    ctx = dlnet.Context(os.environ.get("DLNET_DEVICE", "gpu"))
    q = ctx.queue
    nbytes = int(args.mib * 2**20) // 4 * 4
    a = np.random.default_rng(0).standard_normal(nbytes // 4).astype(np.float32)
    src = a.view(np.uint8)
    buf = ctx.alloc(nbytes)
    back = np.empty_like(a)

    def check():
        cl.enqueue_copy(q, back, buf)
        assert np.array_equal(back, a)

    rows = [("driver (pageable)", median_ms(lambda: (cl.enqueue_copy(q, buf, a, is_blocking=False), q.finish())))]
    check()
    pinned = ctx.pinned((nbytes,), np.uint8)
    pinned[:] = src
    rows.append(("pinned array", median_ms(lambda: (cl.enqueue_copy(q, buf, pinned, is_blocking=False), q.finish()))))
    check()
    rows.append(("host memcpy alone, 1 thread", median_ms(lambda: np.copyto(pinned, src))))
    for threads in map(int, args.threads.split(",")):
        with ThreadPoolExecutor(threads) as pool:
            for c in map(float, args.chunks.split(",")):
                chunk = int(c * 2**20)
                stage = ctx.pinned((2 * chunk if chunk else nbytes,), np.uint8)
                buf_fill = np.zeros_like(a)
                cl.enqueue_copy(q, buf, buf_fill)
                rows.append((f"staged: {threads} threads, chunks {c:g} MiB",
                             median_ms(lambda: staged(q, buf, src, stage, pool, threads, chunk))))
                check()
    print(f"{nbytes / 2**20:.1f} MiB host -> device on {ctx.info.name}")
    for name, ms in rows:
        print(f"{name:36s} {ms:7.3f} ms  {nbytes / ms / 1e6:6.1f} GB/s")


if __name__ == "__main__":
    main()
