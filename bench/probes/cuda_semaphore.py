"""Can torch's CUDA stream wait for dlnet's OpenCL queue on the GPU, without the host waiting?

    python3 bench/probes/cuda_semaphore.py [--rounds 200]

Prints the device's semaphore import and export handle types (cl_khr_external_semaphore: NVIDIA's OpenCL imports
opaque-fd semaphores but exports none, and CUDA cannot make one to export), then checks dlnet.cuda_share's
DeviceSignal (the queue writes a counter into shared memory, torch's stream waits for it with cuStreamWaitValue32):
--rounds alternating increments of one shared counter (torch adds 1, an OpenCL kernel adds 1), handed over by host
waits and by the signal, with the host time of each round. Prints a table.
"""
import argparse
import ctypes
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import dlnet  # noqa: E402
from dlnet import cuda_share  # noqa: E402
from dlnet.kernels.runtime import cl  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    ctx = dlnet.Context("gpu")
    share = cuda_share.share_with_torch(ctx)
    ocl = share.ocl
    info = ocl.clGetDeviceInfo
    info.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_size_t, ctypes.c_void_p,
                     ctypes.POINTER(ctypes.c_size_t)]
    for name, param in (("import", 0x204D), ("export", 0x204E)):
        vals = (ctypes.c_uint32 * 8)()
        n = ctypes.c_size_t()
        rc = info(ctx.device.int_ptr, param, ctypes.sizeof(vals), vals, ctypes.byref(n))
        print(f"semaphore {name} handle types: rc {rc}, {[hex(vals[i]) for i in range(n.value // 4)]}")
    signal = cuda_share.DeviceSignal(share)
    prg = cl.Program(ctx.cl, "__kernel void inc(__global float* x) { x[0] += 1.0f; }").build()
    buf = ctx.alloc(4096)
    k = prg.inc
    k.set_args(buf)
    t = share.view(buf, 0, (1,), np.float32)
    t.zero_()
    torch.cuda.synchronize()
    q = ctx.queue

    def host_round():
        t.add_(1.0)
        torch.cuda.current_stream().synchronize()
        cl.enqueue_nd_range_kernel(q, k, (1,), (1,))
        q.finish()

    def signal_round():
        t.add_(1.0)
        torch.cuda.current_stream().synchronize()
        cl.enqueue_nd_range_kernel(q, k, (1,), (1,))
        signal.to_torch()

    rows = []
    for name, fn in (("host waits", host_round), ("stream waits on the GPU", signal_round)):
        t.zero_()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.rounds):
            fn()
        torch.cuda.synchronize()
        q.finish()
        ms = (time.perf_counter() - start) * 1e3 / args.rounds
        got = float(t.cpu()[0])
        rows.append((name, ms, got))
    print(f"| hand-over | ms a round (torch op + OpenCL kernel) | counter after {args.rounds} rounds (want "
          f"{2 * args.rounds}) |")
    print("|---|---|---|")
    for name, ms, got in rows:
        print(f"| {name} | {ms:.3f} | {got:.0f} |")


if __name__ == "__main__":
    main()
