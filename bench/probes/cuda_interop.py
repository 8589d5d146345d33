"""Does memory shared between CUDA (PyTorch) and NVIDIA's OpenCL work on this machine? CUDA allocates exportable
memory (cuMemCreate with a POSIX file descriptor handle, mapped with cuMemMap), PyTorch views it as a tensor
(__cuda_array_interface__), OpenCL imports the descriptor (cl_khr_external_memory_opaque_fd,
clCreateBufferWithProperties); then an OpenCL kernel writes what torch reads and the other way round, and the cost of
the synchronisation between the two is timed. On the GPU machine:

    python3 bench/probes/cuda_interop.py

Prints what worked; asserts nothing.
"""
import ctypes
import time

import numpy as np
import pyopencl as cl
import torch


class MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class AllocProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", MemLocation),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", AllocFlags)]


class AccessDesc(ctypes.Structure):
    _fields_ = [("location", MemLocation), ("flags", ctypes.c_int)]


def check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what}: CUresult {rc}")


class Shared:
    """`nbytes` of device memory that CUDA maps and exports as a file descriptor."""

    def __init__(self, nbytes, device=0):
        cu = ctypes.CDLL("libcuda.so.1")
        prop = AllocProp(type=1, requestedHandleTypes=1, location=MemLocation(1, device))  # pinned, POSIX fd
        gran = ctypes.c_size_t()
        check(cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0), "granularity")
        self.size = -(-nbytes // gran.value) * gran.value
        self.handle = ctypes.c_ulonglong()
        check(cu.cuMemCreate(ctypes.byref(self.handle), ctypes.c_size_t(self.size), ctypes.byref(prop),
                             ctypes.c_ulonglong(0)), "cuMemCreate")
        fd = ctypes.c_int()
        check(cu.cuMemExportToShareableHandle(ctypes.byref(fd), self.handle, 1, ctypes.c_ulonglong(0)), "export")
        self.fd = fd.value
        self.ptr = ctypes.c_ulonglong()
        check(cu.cuMemAddressReserve(ctypes.byref(self.ptr), ctypes.c_size_t(self.size), ctypes.c_size_t(0),
                                     ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)), "reserve")
        check(cu.cuMemMap(self.ptr, ctypes.c_size_t(self.size), ctypes.c_size_t(0), self.handle,
                          ctypes.c_ulonglong(0)), "map")
        desc = AccessDesc(MemLocation(1, device), 3)
        check(cu.cuMemSetAccess(self.ptr, ctypes.c_size_t(self.size), ctypes.byref(desc), ctypes.c_size_t(1)),
              "access")

    def tensor(self, n, dtype=torch.float32):
        typestr = {torch.float32: "<f4", torch.float16: "<f2"}[dtype]
        holder = type("CAI", (), {"__cuda_array_interface__": {"shape": (n,), "typestr": typestr,
                                                               "data": (self.ptr.value, False), "version": 3}})()
        return torch.as_tensor(holder, device="cuda")

    def cl_buffer(self, ctx, device):
        lib = ctypes.CDLL("libOpenCL.so.1")
        fn = lib.clCreateBufferWithProperties
        fn.restype = ctypes.c_void_p
        fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.c_uint64, ctypes.c_size_t,
                       ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32)]
        props = (ctypes.c_uint64 * 6)(0x2060, self.fd, 0x2051, device.int_ptr, 0, 0)  # (handle list ends with 0)
        err = ctypes.c_int32()
        mem = fn(ctx.int_ptr, props, cl.mem_flags.READ_WRITE, self.size, None, ctypes.byref(err))
        if err.value != 0:
            raise RuntimeError(f"clCreateBufferWithProperties: {err.value}")
        return cl.Buffer.from_int_ptr(mem, retain=False)


def main():
    torch.zeros(1, device="cuda")
    plat = next(p for p in cl.get_platforms() if "NVIDIA" in p.name)
    dev = plat.get_devices()[0]
    ctx = cl.Context([dev])
    queue = cl.CommandQueue(ctx)
    n = 1 << 20
    shared = Shared(4 * n)
    print(f"CUDA: {shared.size} bytes at {shared.ptr.value:#x}, fd {shared.fd}")
    t = shared.tensor(n)
    buf = shared.cl_buffer(ctx, dev)
    print("OpenCL imported the buffer:", buf.size, "bytes")
    src = "__kernel void f(__global float* x) { int i = get_global_id(0); x[i] = 2.0f * x[i] + 1; }"
    knl = cl.Kernel(cl.Program(ctx, src).build(), "f")
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
