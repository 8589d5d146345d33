"""Device memory shared by PyTorch's CUDA tensors and dlnet's buffers on NVIDIA's OpenCL, so that the PyTorch bridge
moves no tensor through the host (bench/probes/cuda_interop.py found how, and what it costs).

CUDA allocates each of a Context's buffers (its plans' arenas) as memory that can be exported (cuMemCreate with
a POSIX file descriptor handle, mapped with cuMemMap), and OpenCL imports the descriptor
(cl_khr_external_memory_opaque_fd, clCreateBufferWithProperties): one memory, a cl.Buffer on one side, a device
pointer on the other, from which `view` makes torch tensors (__cuda_array_interface__). The two APIs run in two CUDA
contexts: a plan's kernels are launched by CUDA in torch's context, on torch's stream (CudaLaunches: their PTX, as
NVIDIA's OpenCL built it); where they cannot be, the caller hands the memory over in turn: torch's stream
synchronised before dlnet's launches on the queue, the queue finished (or waited for on the GPU) before torch reads
(about 0.15 ms each way on an H100: the GPU switches contexts).

    share_with_torch(ctx)  # ctx's later allocations are shared; False where the device or torch cannot
"""
import ctypes
import os
import re
import warnings
import weakref

import numpy as np

from .kernels.launch import Deferred
from .kernels.runtime import cl

EXTENSION = "cl_khr_external_memory_opaque_fd"
_CL_EXTERNAL_MEMORY_HANDLE_OPAQUE_FD, _CL_DEVICE_HANDLE_LIST, _CL_DEVICE_HANDLE_LIST_END = 0x2060, 0x2051, 0
_POSIX_FD, _PINNED, _ON_DEVICE, _READ_WRITE = 1, 1, 1, 3
_CU_WAIT_VALUE_GEQ = 0x0


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


def _check(rc, what):
    if rc != 0:
        raise RuntimeError(f"CUDA {what}: CUresult {rc}")


def _free(cu, ptr, size, handle):
    cu.cuMemUnmap(ctypes.c_ulonglong(ptr), ctypes.c_size_t(size))
    cu.cuMemAddressFree(ctypes.c_ulonglong(ptr), ctypes.c_size_t(size))
    cu.cuMemRelease(ctypes.c_ulonglong(handle))


class CudaShare:
    """The allocator of one Context whose buffers torch sees: cl.Buffer int_ptr -> (device pointer, bytes)."""

    def __init__(self, ctx, cuda_device=0):
        self._ctx, self.device = weakref.ref(ctx), cuda_device  # (ctx.allocator is this: no cycle to wait for the
        # garbage collector, which would tear the OpenCL context down at any later moment, a build's included)
        self.cu = ctypes.CDLL("libcuda.so.1")
        self.ocl = ctypes.CDLL("libOpenCL.so.1")
        self.create = self.ocl.clCreateBufferWithProperties
        self.create.restype = ctypes.c_void_p
        self.create.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.c_uint64, ctypes.c_size_t,
                                ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32)]
        self.prop = _AllocProp(type=_PINNED, requestedHandleTypes=_POSIX_FD, location=_Location(_ON_DEVICE,
                                                                                               cuda_device))
        gran = ctypes.c_size_t()
        _check(self.cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(self.prop), 0), "granularity")
        self.granularity = gran.value
        self.pointers = {}
        self.views = {}  # (buffer, byte offset, shape, dtype) -> its torch tensor (made once: ~25 us each)
        self._signal = None  # DeviceSignal; False where CUDA cannot wait on a value
        self.modules = {}  # program int_ptr -> (program, CUDA module of its PTX, {kernel name: CUDA function})
        self.cu.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3

    def signal(self):
        """The DeviceSignal of this context (made at the first call), or None."""
        if self._signal is None:
            self._signal = False
            if self.ctx.options.cuda_device_wait:
                try:
                    self._signal = DeviceSignal(self)
                except (RuntimeError, AttributeError, OSError):
                    pass
        return self._signal or None

    @property
    def ctx(self):
        return self._ctx()

    def alloc(self, nbytes):
        """`nbytes` (rounded up to the granularity) of memory mapped in CUDA and imported by OpenCL."""
        cu, size = self.cu, -(-max(int(nbytes), 4) // self.granularity) * self.granularity
        handle, ptr, fd = ctypes.c_ulonglong(), ctypes.c_ulonglong(), ctypes.c_int()
        _check(cu.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(self.prop),
                              ctypes.c_ulonglong(0)), "cuMemCreate")
        _check(cu.cuMemExportToShareableHandle(ctypes.byref(fd), handle, _POSIX_FD, ctypes.c_ulonglong(0)), "export")
        _check(cu.cuMemAddressReserve(ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0),
                                      ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)), "cuMemAddressReserve")
        _check(cu.cuMemMap(ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), handle, ctypes.c_ulonglong(0)), "cuMemMap")
        access = _AccessDesc(_Location(_ON_DEVICE, self.device), _READ_WRITE)
        _check(cu.cuMemSetAccess(ptr, ctypes.c_size_t(size), ctypes.byref(access), ctypes.c_size_t(1)), "access")
        props = (ctypes.c_uint64 * 6)(_CL_EXTERNAL_MEMORY_HANDLE_OPAQUE_FD, fd.value, _CL_DEVICE_HANDLE_LIST,
                                      self.ctx.device.int_ptr, _CL_DEVICE_HANDLE_LIST_END, 0)
        err = ctypes.c_int32()
        mem = self.create(self.ctx.cl.int_ptr, props, cl.mem_flags.READ_WRITE, size, None, ctypes.byref(err))
        os.close(fd.value)  # (the import holds its own reference to the memory)
        if err.value != 0:
            _free(cu, ptr.value, size, handle.value)
            raise RuntimeError(f"OpenCL could not import CUDA memory (clCreateBufferWithProperties: {err.value})")
        buf = cl.Buffer.from_int_ptr(mem, retain=False)
        self.pointers[buf.int_ptr] = (ptr.value, size, handle.value)
        self.ctx.allocated_bytes += size
        return buf

    __call__ = alloc  # (Context.allocator)

    def release(self, buf):
        """Context.free's: the OpenCL buffer, then (its launches done) CUDA's mapping and memory."""
        ptr, size, handle = self.pointers.pop(buf.int_ptr)
        self.views = {k: v for k, v in self.views.items() if k[0] != buf.int_ptr}
        import torch
        torch.cuda.synchronize()  # (torch's reads of it done, as well as the queue's)
        self.ctx.queue.finish()
        buf.release()
        _free(self.cu, ptr, size, handle)

    def view(self, buf, byte_offset, shape, dtype):
        """A torch tensor over `shape` elements of `dtype` at byte_offset in buf (no copy; the same tensor each time
        until buf is released)."""
        import torch
        dtype = np.dtype(dtype)
        key = (buf.int_ptr, byte_offset, tuple(shape), dtype.str)
        if key in self.views:
            return self.views[key]
        base, size, _ = self.pointers[buf.int_ptr]
        n = int(np.prod(shape, dtype=np.int64))
        assert byte_offset + n * dtype.itemsize <= size, "a view past the end of a shared buffer"
        holder = type("_Shared", (), {"__cuda_array_interface__": {
            "shape": (n,), "typestr": dtype.str, "data": (base + byte_offset, False), "version": 3}})()
        self.views[key] = torch.as_tensor(holder, device=f"cuda:{self.device}").view(tuple(shape))
        return self.views[key]


class DeviceSignal:
    """dlnet's queue -> torch's stream without the host waiting: after the launches the queue writes a counter into
    memory both share, and torch's stream waits for it on the GPU (cuStreamWaitValue32), so the host goes on with
    torch's own work while the launches run. (The other way the host waits: NVIDIA's OpenCL imports semaphores but
    exports none, and OpenCL has no wait on a value. bench/probes/cuda_semaphore.py checks and times both.)"""

    def __init__(self, share):
        self._share, self.count = weakref.ref(share), 0  # (share._signal is this: no cycle)
        cu = share.cu
        self._wait = getattr(cu, "cuStreamWaitValue32_v2", None) or cu.cuStreamWaitValue32
        self._wait.argtypes = [ctypes.c_void_p, ctypes.c_ulonglong, ctypes.c_uint32, ctypes.c_uint]
        self.buf = share.alloc(4)
        self.ptr = share.pointers[self.buf.int_ptr][0]
        cl.enqueue_fill_buffer(share.ctx.queue, self.buf, np.uint32(0), 0, 4)
        share.ctx.queue.finish()

    def to_torch(self):
        """torch's later work waits (on the GPU) for the queue's commands so far."""
        import torch
        q = self._share().ctx.queue
        if self.count == 0xFFFFFFFF:  # (the counter starts again, with nothing in flight)
            torch.cuda.synchronize()
            q.finish()
            self.count = 0
            cl.enqueue_fill_buffer(q, self.buf, np.uint32(0), 0, 4)
        self.count += 1
        cl.enqueue_fill_buffer(q, self.buf, np.uint32(self.count), 0, 4)
        q.flush()
        stream = torch.cuda.current_stream().cuda_stream
        _check(self._wait(stream, self.ptr, self.count, _CU_WAIT_VALUE_GEQ), "cuStreamWaitValue32")


def share_with_torch(ctx):
    """Make ctx's later allocations CUDA memory torch can view (ctx.allocator); the CudaShare, or None where ctx is
    not an NVIDIA OpenCL device with EXTENSION, or torch has no CUDA device."""
    if isinstance(ctx.allocator, CudaShare):
        return ctx.allocator
    try:
        import torch
        if not (ctx.is_nvidia and EXTENSION in ctx.device.extensions and torch.cuda.is_available()):
            return None
        torch.zeros(1, device="cuda")  # (CUDA's primary context, which the allocations belong to)
        share = CudaShare(ctx, torch.cuda.current_device())
    except (ImportError, OSError, AttributeError, RuntimeError):
        return None
    ctx.allocator = share
    return share


# ------------------------------------------------------------------- VJPPlan's halves on torch's tensors --------
def _view(share, buf, elem_offset, value):
    return share.view(buf, elem_offset * np.dtype(value.dtype).itemsize, value.shape, value.dtype)


def shared_plan(share, plan):
    """Does `plan` live in memory torch can view (its arenas allocated by `share`)?"""
    return share is not None and all(b is None or b.int_ptr in share.pointers for b in (plan.act_buf, plan.const_buf))


def copy_all(targets, sources):
    """targets[i].copy_(sources[i]) for every i: pairs of one dtype and device in torch's multi-tensor copy (a few
    launches for all of them: its fast path takes only lists of one dtype and device), the rest one by one."""
    import torch
    groups, rest = {}, []
    for t, s in zip(targets, sources):
        if t.dtype == s.dtype and t.device == s.device and s.is_contiguous():
            dst, src = groups.setdefault((t.dtype, t.device), ([], []))
            dst.append(t)
            src.append(s)
        else:
            rest.append((t, s))
    for dst, src in groups.values():
        if hasattr(torch, "_foreach_copy_"):
            torch._foreach_copy_(dst, src)
        else:
            rest.extend(zip(dst, src))
    for t, s in rest:
        t.copy_(s)


def _clones(tensors):
    """New tensors equal to `tensors` (copied in a few launches)."""
    import torch
    out = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    copy_all(out, tensors)
    return out


class _PlanViews:
    """A VJP plan's inputs (the dys included) and outputs as torch tensors over its memory, made once per plan;
    outputs the plan does not compute (constants) as tensors of their values."""

    def __init__(self, share, plan):
        import torch
        self.inputs = [_view(share, *plan.input_locs[i], v) for i, v in enumerate(plan.graph.inputs)]
        self.outputs = [torch.as_tensor(np.array(v.const), device="cuda") if loc is None else
                        _view(share, loc[0], loc[1], v) for v, loc in zip(plan.graph.outputs, plan.output_locs)]


def _plan_views(share, vjp):
    if getattr(vjp, "torch_views", None) is None:
        vjp.torch_views = _PlanViews(share, vjp.plan)
    return vjp.torch_views


def _hand_over(share, plan, start, stop):
    """dlnet's launches start..stop run after torch's writes so far and before torch's later work: on torch's stream
    (CudaLaunches) where they can, else on the queue, the host waiting for torch's stream, and torch's stream for the
    queue on the GPU (DeviceSignal), else the host for the queue."""
    import torch
    launches = cuda_launches(share, plan)
    if launches is not None:
        launches.run(start, stop, torch.cuda.current_stream().cuda_stream)
        return
    torch.cuda.current_stream().synchronize()
    plan.run_launches(start, stop)
    signal = share.signal()
    if signal is not None:
        signal.to_torch()
    else:
        share.ctx.queue.finish()


def vjp_forward(share, vjp, inputs, params):
    """VJPPlan.forward on CUDA tensors: inputs and changed parameters (and running statistics) copied into the plan's
    memory on the GPU."""
    plan, views = vjp.plan, _plan_views(share, vjp)
    targets = views.inputs[:len(inputs)]
    for name in params:
        value = vjp.constant(name)
        targets.append(share.view(plan.const_buf, plan.memory.const_offsets[value.id], value.shape, value.dtype))
    copy_all(targets, list(inputs) + list(params.values()))
    _hand_over(share, plan, 0, vjp.split)
    return _clones(views.outputs[:vjp.n_out])


def vjp_backward(share, vjp, dys):
    """VJPPlan.backward on CUDA tensors: ({wrt name: gradient tensor}, [new running statistics: views of the plan's
    memory, to be copied before its next run])."""
    import torch
    plan, views = vjp.plan, _plan_views(share, vjp)
    copy_all(views.inputs[vjp.n_in:vjp.n_in + len(dys)], dys)
    _hand_over(share, plan, vjp.split, len(plan.launches))
    first_state = len(plan.graph.outputs) - vjp.n_states
    grads = dict(zip(range(vjp.n_out, first_state), _clones(views.outputs[vjp.n_out:first_state])))
    grads = {n: grads[vjp.grad_index[n]] if n in vjp.grad_index else
             torch.zeros(vjp.grad_shapes[n], dtype=torch.float32, device="cuda") for n in vjp.wrt_names}
    return grads, views.outputs[first_state:]


# ------------------------------------------------------------------- a plan's kernels launched by CUDA ----------
# NVIDIA's OpenCL program binaries are PTX. Loaded into torch's CUDA context (cuModuleLoadData), a plan's kernels run
# on torch's stream with the arguments they were bound with: buffers as device pointers (shared ones as CUDA maps
# them, the rest copied once into CUDA memory), scalars as they are. OpenCL's PTX reads the launch's group and global
# offsets from %envreg0-5, which CUDA leaves unset: they are 0 for dlnet's launches, and written so into the PTX.
_ENVREG_OFFSETS = re.compile(rb"%envreg[0-5]\b")
_CL_SCALARS = {np.dtype(np.int32): ctypes.c_int32, np.dtype(np.uint32): ctypes.c_uint32,
               np.dtype(np.int64): ctypes.c_int64, np.dtype(np.uint64): ctypes.c_uint64,
               np.dtype(np.float32): ctypes.c_float}
_CUDA_GRID_YZ = 65535


class CudaLaunches:
    """A plan's launches as cuLaunchKernel calls (bench/probes/cuda_launch.py found how): built once per plan, run
    on a torch stream. Raises ValueError where a launch cannot go this way (the caller keeps the OpenCL queue)."""

    def __init__(self, share, plan):
        self.share, self.cu, self.queue = share, share.cu, plan.ctx.queue
        self.launch = self.cu.cuLaunchKernel
        self.mirrors, self.calls = {}, []
        for launch in plan.launches:
            if launch.pending is None or launch.wait is not None:
                raise ValueError(f"{launch.label}: no recorded arguments")
            args = [self._arg(a) for a in launch.pending.args]
            params = (ctypes.c_void_p * max(len(args), 1))(*[ctypes.addressof(a) for a in args])
            self.calls.append((self._function(launch.kernel), *self._shape(launch), params, args, launch.label))

    def _function(self, kernel):
        program, name = kernel.program, kernel.function_name
        modules = self.share.modules
        if program.int_ptr not in modules:
            ptx = bytes(program.get_info(cl.program_info.BINARIES)[0]).rstrip(b"\0")
            if b"%envreg" in _ENVREG_OFFSETS.sub(b"", ptx):
                raise ValueError(f"kernel {name}: its PTX reads OpenCL's launch environment")
            module = ctypes.c_void_p()
            _check(self.cu.cuModuleLoadData(ctypes.byref(module), _ENVREG_OFFSETS.sub(b"0", ptx) + b"\0"),
                   f"cuModuleLoadData ({name})")
            modules[program.int_ptr] = (program, module, {})  # (the program held: its int_ptr stays its own)
        _, module, functions = modules[program.int_ptr]
        if name not in functions:
            f = ctypes.c_void_p()
            _check(self.cu.cuModuleGetFunction(ctypes.byref(f), module, name.encode()), f"cuModuleGetFunction {name}")
            functions[name] = f
        return functions[name]

    @staticmethod
    def _shape(launch):
        """(grid, block): the launch's work-groups; where OpenCL would pick the local size, the largest divisor of
        the global size up to 256 along x."""
        g = list(launch.gsize) + [1] * (3 - len(launch.gsize))
        if launch.lsize is not None:
            b = list(launch.lsize) + [1] * (3 - len(launch.lsize))
        else:
            b = [next(d for d in range(min(256, g[0]), 0, -1) if g[0] % d == 0), 1, 1]
        grid = [n // d for n, d in zip(g, b)]
        if any(n % d for n, d in zip(g, b)) or max(grid[1:]) > _CUDA_GRID_YZ or min(grid) < 1:
            raise ValueError(f"{launch.label}: grid {g} / {b}")
        return grid, b

    def _arg(self, a):
        if isinstance(a, Deferred):
            a = a.get()
        if a is None:
            return ctypes.c_uint64(0)
        if isinstance(a, cl.Buffer):
            if a.int_ptr in self.share.pointers:
                return ctypes.c_uint64(self.share.pointers[a.int_ptr][0])
            if a.int_ptr not in self.mirrors:  # a buffer OpenCL alone holds (the plan's tables): copied once
                import torch
                host = np.empty(a.size, np.uint8)
                cl.enqueue_copy(self.queue, host, a, is_blocking=True)
                self.mirrors[a.int_ptr] = (a, torch.from_numpy(host).to(f"cuda:{self.share.device}"))
            return ctypes.c_uint64(self.mirrors[a.int_ptr][1].data_ptr())
        kind = _CL_SCALARS.get(np.asarray(a).dtype)
        if kind is None:
            raise ValueError(f"an argument of type {type(a).__name__}")
        return kind(np.asarray(a).item())

    def run(self, start, stop, stream):
        for f, grid, block, params, _, label in self.calls[start:stop]:
            rc = self.launch(f, *grid, *block, 0, stream, params, None)
            if rc:
                raise RuntimeError(f"{label}: cuLaunchKernel failed ({rc})")


def cuda_launches(share, plan):
    """plan's CudaLaunches (made at the first call, after the queue's work so far), or None where Options.cuda_launch
    is off or some launch cannot go through CUDA."""
    made = getattr(plan, "cuda_launches", None)
    if made is None:
        made = False
        if plan.ctx.options.cuda_launch:
            plan.ctx.queue.finish()
            try:
                made = CudaLaunches(share, plan)
            except (ValueError, RuntimeError, cl.Error) as e:
                warnings.warn(f"dlnet: the plan's kernels stay on the OpenCL queue ({e})", stacklevel=2)
        plan.cuda_launches = made
    return made or None
