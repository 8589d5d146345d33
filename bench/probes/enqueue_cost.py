"""What one kernel enqueue costs the host: pyopencl's enqueue_nd_range_kernel against clEnqueueNDRangeKernel called
through ctypes with the sizes prepared once and no event.

    python3 bench/probes/enqueue_cost.py [--device gpu] [--launches 2000] [--rounds 5]

A one-work-group kernel that does nothing (so the device keeps up), its arguments set once. Per round: enqueue
--launches times, then finish; prints the host time per enqueue (enqueue loop only) and per launch with the finish,
median of the rounds.
"""
import argparse
import ctypes
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import dlnet  # noqa: E402
from dlnet.kernels.runtime import cl  # noqa: E402

SRC = "__kernel void nop(__global float *x, int n) { if (get_global_id(0) == (size_t)n) x[0] = 1.0f; }"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--launches", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    ctx = dlnet.Context(args.device)
    q = ctx.queue
    prg = cl.Program(ctx.cl, SRC).build()
    buf = cl.Buffer(ctx.cl, cl.mem_flags.READ_WRITE, 64)
    kernels = []
    for _ in range(64):  # (a plan binds one kernel object per launch)
        k = prg.nop
        k.set_args(buf, np.int32(-1))
        kernels.append(k)
    from dlnet.kernels.runtime import _opencl_library
    lib = _opencl_library()
    enq = lib.clEnqueueNDRangeKernel
    enq.restype = ctypes.c_int32
    enq.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_void_p,
                    ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_void_p]
    gsize, lsize = (ctypes.c_size_t * 1)(64), (ctypes.c_size_t * 1)(64)
    qp, kps = q.int_ptr, [k.int_ptr for k in kernels]
    flush = lib.clFlush
    flush.argtypes = [ctypes.c_void_p]

    def py_loop(n):
        for i in range(n):
            cl.enqueue_nd_range_kernel(q, kernels[i & 63], (64,), (64,))
            if i % 16 == 0:
                q.flush()

    def ct_loop(n):
        for i in range(n):
            rc = enq(qp, kps[i & 63], 1, None, gsize, lsize, 0, None, None)
            if rc:
                raise RuntimeError(f"clEnqueueNDRangeKernel: {rc}")
            if i % 16 == 0:
                flush(qp)

    rows = []
    for name, loop in (("pyopencl", py_loop), ("ctypes, no event", ct_loop)):
        enq_t, all_t = [], []
        loop(100)
        q.finish()
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            loop(args.launches)
            t1 = time.perf_counter()
            q.finish()
            t2 = time.perf_counter()
            enq_t.append((t1 - t0) / args.launches * 1e6)
            all_t.append((t2 - t0) / args.launches * 1e6)
        rows.append((name, statistics.median(enq_t), statistics.median(all_t)))
    print(f"device {ctx.info}; {args.launches} launches a round, median of {args.rounds}")
    print("| enqueue | host us per enqueue | us per launch with finish |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]:.2f} | {r[2]:.2f} |")


if __name__ == "__main__":
    main()
