"""Where a data-parallel bucket's time goes on one host: the host-side primitives an all-reduce through host memory
is made of, on 2 ranks, each on its own device (rank r: the r-th OpenCL GPU, --device cpu: PoCL).

    mpirun -np 2 --bind-to none python bench/probes/host_reduce.py            # the 2-GPU machine
    mpirun -np 2 --oversubscribe python bench/probes/host_reduce.py --device cpu

Rank 0 prints, per bucket size, the median ms (and GB/s of the bucket's bytes) of: CPU copies between page-locked
(Context.pinned) and ordinary memory, and a shared-memory segment (/dev/shm, mapped by both ranks), on 1 and 4
threads; the device's copies into and out of pinned, ordinary and shared memory; MPI's blocking Allreduce on
ordinary and pinned arrays. Prints a table; asserts nothing.
"""
import argparse
import mmap
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import dlnet  # noqa: E402
from dlnet.distributed import local_rank  # noqa: E402
from dlnet.kernels.runtime import cl  # noqa: E402


def median_ms(fn, iters, comm=None):
    times = []
    for _ in range(iters + 1):
        if comm is not None:
            comm.barrier()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times[1:]) * 1e3


def threaded(pool, threads, fn, *arrays):
    """fn(*chunks) over `threads` equal chunks of the arrays, on the pool."""
    n = arrays[0].size
    step = -(-n // threads)
    list(pool.map(lambda i: fn(*(a[i:i + step] for a in arrays)), range(0, n, step)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--mib", default="25,100")
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    comm = dlnet.distributed.MPI()
    ctx = dlnet.Context(f"ocl:{local_rank()}" if args.device == "gpu" else args.device)
    pool = ThreadPoolExecutor(4)
    rows = []
    for mib in (float(m) for m in args.mib.split(",")):
        n = int(mib * 2 ** 20) // 4
        gb = 4 * n / 1e9
        dev = ctx.alloc(4 * n)
        pinned = ctx.pinned((n,), np.float32)
        plain = np.random.default_rng(comm.rank).standard_normal(n, dtype=np.float32)
        other = np.empty_like(plain)
        # the shared segment: a file in /dev/shm that rank 0 makes and both map (a slot per rank)
        name = comm.bcast(tempfile.mktemp(prefix="dlnet-probe-", dir="/dev/shm") if comm.rank == 0 else None)
        if comm.rank == 0:
            with open(name, "wb") as f:
                f.truncate(2 * 4 * n)
        comm.barrier()
        with open(name, "r+b") as f:
            mm = mmap.mmap(f.fileno(), 2 * 4 * n)
        comm.barrier()
        if comm.rank == 0:
            os.unlink(name)
        shm = np.frombuffer(mm, np.float32).reshape(2, n)
        mine, theirs = shm[comm.rank], shm[1 - comm.rank]
        it = args.iters
        cases = {
            "cpu copy plain -> plain": lambda: np.copyto(other, plain),
            "cpu copy pinned -> plain": lambda: np.copyto(other, pinned),
            "cpu copy plain -> pinned": lambda: np.copyto(pinned, plain),
            "cpu copy plain -> shm": lambda: np.copyto(mine, plain),
            "cpu copy pinned -> shm": lambda: np.copyto(mine, pinned),
            "cpu copy shm -> pinned": lambda: np.copyto(pinned, theirs),
            "cpu add shm + shm -> pinned": lambda: np.add(mine, theirs, out=pinned),
            "4 threads copy pinned -> shm": lambda: threaded(pool, 4, np.copyto, mine, pinned),
            "4 threads add shm + shm -> pinned": lambda: threaded(pool, 4, lambda a, b, o: np.add(a, b, out=o),
                                                                  mine, theirs, pinned),
            "4 threads copy plain -> plain": lambda: threaded(pool, 4, np.copyto, other, plain),
            "device -> pinned": lambda: cl.enqueue_copy(ctx.queue, pinned, dev, is_blocking=True),
            "pinned -> device": lambda: cl.enqueue_copy(ctx.queue, dev, pinned, is_blocking=True),
            "device -> plain": lambda: cl.enqueue_copy(ctx.queue, other, dev, is_blocking=True),
            "plain -> device": lambda: cl.enqueue_copy(ctx.queue, dev, plain, is_blocking=True),
            "device -> shm": lambda: cl.enqueue_copy(ctx.queue, mine, dev, is_blocking=True),
            "shm -> device": lambda: cl.enqueue_copy(ctx.queue, dev, theirs, is_blocking=True),
        }
        for label, fn in cases.items():
            ms = median_ms(fn, it)
            rows.append((mib, label, ms, gb / ms * 1e3))
        # a USE_HOST_PTR buffer over the shared slot: device -> it, then a map (the host's bytes up to date)
        try:
            hb = cl.Buffer(ctx.cl, cl.mem_flags.READ_WRITE | cl.mem_flags.USE_HOST_PTR, hostbuf=mine)

            def via_host_ptr():
                cl.enqueue_copy(ctx.queue, hb, dev)
                m, _ = cl.enqueue_map_buffer(ctx.queue, hb, cl.map_flags.READ, 0, (n,), np.float32)
                m.base.release(ctx.queue)
                ctx.queue.finish()

            def host_ptr_up():
                m, _ = cl.enqueue_map_buffer(ctx.queue, hb, cl.map_flags.WRITE_INVALIDATE_REGION, 0, (n,),
                                             np.float32)
                m.base.release(ctx.queue)
                cl.enqueue_copy(ctx.queue, dev, hb)
                ctx.queue.finish()
            for label, fn in (("device -> USE_HOST_PTR(shm) + map", via_host_ptr),
                              ("map + USE_HOST_PTR(shm) -> device", host_ptr_up)):
                ms = median_ms(fn, it)
                rows.append((mib, label, ms, gb / ms * 1e3))
        except cl.Error as e:
            rows.append((mib, f"USE_HOST_PTR: {e}", float("nan"), float("nan")))
        for label, arr in (("MPI Allreduce plain (2 ranks)", plain), ("MPI Allreduce pinned (2 ranks)", pinned),
                           ("MPI Allreduce shm slot (2 ranks)", mine)):
            ms = median_ms(lambda: comm.comm.Allreduce(comm._mpi.IN_PLACE, arr, op=comm._mpi.SUM), it, comm)
            rows.append((mib, label, ms, gb / ms * 1e3))
        ms = median_ms(lambda: comm.barrier(), 20)
        rows.append((mib, "MPI barrier", ms, float("nan")))
        ctx.free(dev)
    if comm.rank == 0:
        print(f"device {ctx.info.name}; median of {args.iters} (ms, GB/s of the bucket's bytes); rank 0's view")
        print(f"{'MiB':>5}  {'what':<38} {'ms':>9} {'GB/s':>7}")
        for mib, label, ms, gbs in rows:
            print(f"{mib:>5g}  {label:<38} {ms:>9.3f} {gbs:>7.2f}")


if __name__ == "__main__":
    main()
