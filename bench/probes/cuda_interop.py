"""Does memory shared between CUDA (PyTorch) and NVIDIA's OpenCL work on this machine? CUDA allocates exportable
memory (cuMemCreate with a POSIX file descriptor handle, mapped with cuMemMap), PyTorch views it as a tensor
(__cuda_array_interface__), OpenCL imports the descriptor (cl_khr_external_memory_opaque_fd,
clCreateBufferWithProperties); then an OpenCL kernel writes what torch reads and the other way round, and the cost of
the synchronisation between the two is timed. On the GPU machine:

    python3 bench/probes/cuda_interop.py

Prints what worked; asserts nothing.
"""
import time

import numpy as np
import pyopencl as cl
import torch

import dlnet
from dlnet.cuda_share import share_with_torch


def main():
    ctx = dlnet.Context("gpu")
    shared = share_with_torch(ctx)  # (dlnet/cuda_share.py: cuMemCreate's memory, imported by OpenCL)
    if shared is None:
        print("no sharing: not an NVIDIA OpenCL device with cl_khr_external_memory_opaque_fd, or no CUDA device")
        return
    queue = ctx.queue
    n = 1 << 20
    buf = ctx.alloc(4 * n)
    print(f"CUDA memory at {shared.pointers[buf.int_ptr][0]:#x}; OpenCL imported it: {buf.size} bytes")
    t = shared.view(buf, 0, (n,), np.float32)
    src = "__kernel void f(__global float* x) { int i = get_global_id(0); x[i] = 2.0f * x[i] + 1; }"
    knl = cl.Kernel(cl.Program(ctx.cl, src).build(), "f")
    knl.set_args(buf)
    t.copy_(torch.arange(n, device="cuda", dtype=torch.float32))
    torch.cuda.synchronize()
    cl.enqueue_nd_range_kernel(queue, knl, (n,), None)
    queue.finish()
    ok = torch.equal(t.cpu(), 2 * torch.arange(n, dtype=torch.float32) + 1)
    print("torch reads what OpenCL wrote:", ok)
    t.mul_(3)
    torch.cuda.synchronize()
    host = np.empty(n, np.float32)
    cl.enqueue_copy(queue, host, buf, is_blocking=True)
    print("OpenCL reads what torch wrote:", np.array_equal(host, 3 * (2 * np.arange(n, dtype=np.float32) + 1)))
    # the cost of the hand-overs: each side's launch and wait alone, then one after the other on the shared memory
    def timed(fn, reps=200):
        for _ in range(5):
            fn()
        times = []
        for _ in range(reps):
            s = time.perf_counter()
            fn()
            times.append((time.perf_counter() - s) * 1e6)
        return float(np.median(times))

    def torch_side():
        t.add_(1)
        torch.cuda.current_stream().synchronize()

    def cl_side():
        cl.enqueue_nd_range_kernel(queue, knl, (n,), None)
        queue.finish()

    print(f"torch add_ + stream sync: {timed(torch_side):.1f} us; OpenCL kernel + finish: {timed(cl_side):.1f} us; "
          f"both in turn: {timed(lambda: (torch_side(), cl_side())):.1f} us")
    x = torch.randn(n, device="cuda")
    print(f"a 4 MiB device-to-device copy into the shared memory + sync: "
          f"{timed(lambda: (t.copy_(x), torch.cuda.current_stream().synchronize())):.1f} us")

if __name__ == "__main__":
    main()
