"""OpenCL devices, contexts, the program cache and the launch list."""
import ctypes
import functools
import hashlib
import math
import mmap
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib import resources

import numpy as np

from ..errors import DeviceError
from . import compile_worker
from .compile_worker import claim, device_identity, finished, for_sm90a, trace, write_binary
from .device import Device, fix_threads, is_nvidia
from .options import Options

try:
    import pyopencl as cl
except ImportError as e:  # pragma: no cover - pyopencl is a hard dependency
    raise DeviceError(f"pyopencl is not installed ({e}); install dlnet with: pip install 'pyopencl[pocl]'") from e


def _remember_invokers():
    """Each new cl.Kernel has pyopencl generate its set_args and enqueue functions from a disk cache that keeps none in
    memory: a sqlite read and a compile() per kernel, 0.04 s of resnet50's warm start (92 kernels). What it generates
    depends only on its arguments (the name and argument count, no types here), so it is kept for the process."""
    try:
        from pyopencl import invoker
        generate = invoker.generate_enqueue_and_set_args
    except (ImportError, AttributeError):  # pragma: no cover - another pyopencl
        return
    if getattr(generate, "remembered", False):
        return
    memo = {}

    def remembered(*args, **kwargs):
        devs = kwargs.get("devs", ())
        try:
            key = (args, tuple(sorted((k, v) for k, v in kwargs.items() if k != "devs")),
                   tuple(d.int_ptr for d in devs))
            hash(key)
        except (TypeError, AttributeError):
            return generate(*args, **kwargs)
        if key not in memo:
            memo[key] = generate(*args, **kwargs)
        return memo[key]
    remembered.remembered = True
    invoker.generate_enqueue_and_set_args = remembered


_remember_invokers()

HOW_TO_GET_A_DEVICE = (
    "no OpenCL device found. Install a CPU device with `pip install pocl-binary-distribution` "
    "(or `pip install 'pyopencl[pocl]'`), or a GPU driver's OpenCL ICD; in containers where the driver's "
    "libnvidia-opencl.so.1 exists but no ICD file registers it, run "
    "`mkdir -p /tmp/icd && echo libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd && export OCL_ICD_VENDORS=/tmp/icd`")

DTYPE_TO_C = {"float32": "float", "float64": "double", "int64": "long", "int32": "int", "bool": "uchar",
              "int8": "char", "uint8": "uchar", "float16": "half", "int16": "short", "uint16": "ushort",
              "uint32": "uint", "uint64": "ulong"}


@dataclass
class DeviceInfo:
    index: int
    platform: str
    name: str
    vendor: str
    type: str
    global_mem: int
    compute_units: int
    fp16: bool
    fp64: bool
    device: object = field(repr=False, compare=False)

    def __str__(self):
        return f"ocl:{self.index} {self.name} ({self.platform}, {self.type}, {self.global_mem / 2**30:.1f} GiB)"


def _type_name(t):
    if t & cl.device_type.GPU:
        return "GPU"
    if t & cl.device_type.CPU:
        return "CPU"
    if t & cl.device_type.ACCELERATOR:
        return "ACCELERATOR"
    return "OTHER"


def devices():
    """Every OpenCL device on every platform, GPUs first; the list index is what `ocl:N` names."""
    fix_threads()  # (the platform starts here where no Context started it: PoCL's thread count is then fixed)
    found = []
    try:
        platforms = cl.get_platforms()
    except cl.Error:
        platforms = []
    for p in platforms:
        try:
            devs = p.get_devices()
        except cl.Error:
            continue
        for d in devs:
            ext = d.extensions
            found.append(DeviceInfo(0, p.name.strip(), d.name.strip(), d.vendor.strip(), _type_name(d.type),
                                    d.global_mem_size, d.max_compute_units, "cl_khr_fp16" in ext,
                                    "cl_khr_fp64" in ext or d.double_fp_config != 0, d))
    found.sort(key=lambda i: i.type != "GPU")  # stable: GPUs first, platform order kept
    for n, info in enumerate(found):
        info.index = n
    return found


def _device_spec(spec):
    """The device a spec asks for, checked before any device is looked up: ('index', N), ('type', 'gpu'|'cpu') or
    None (the first GPU, else the first CPU). spec: 'ocl:N', 'gpu', 'cpu' or None (DLNET_DEVICE, else None)."""
    spec = spec if spec is not None else os.environ.get("DLNET_DEVICE") or None
    if spec is None:
        return None
    s = str(spec).strip().lower()
    if s.startswith("ocl:"):
        try:
            return "index", int(s[4:]), spec
        except ValueError:
            raise DeviceError(f"device {spec!r}: expected ocl:N with N an integer") from None
    if s in ("gpu", "cpu"):
        return "type", s, spec
    raise DeviceError(f"device {spec!r}: expected 'ocl:N', 'gpu' or 'cpu'")


def pick_device(spec=None):
    """Resolve 'ocl:N', 'gpu', 'cpu' or None (DLNET_DEVICE, else first GPU, else first CPU)."""
    want = _device_spec(spec)
    found = devices()
    if not found:
        raise DeviceError(HOW_TO_GET_A_DEVICE)
    if want is None:
        return found[0]
    kind, value, spec = want
    if kind == "index":
        if not 0 <= value < len(found):
            raise DeviceError(f"device {spec!r}: there are {len(found)} OpenCL devices (ocl:0..ocl:{len(found) - 1}); "
                              "`dlnet devices` lists them")
        return found[value]
    for info in found:
        if info.type.lower() == value:
            return info
    raise DeviceError(f"device {spec!r}: no OpenCL {value.upper()} device found; `dlnet devices` lists what there is")


def build_threads(ctx):
    """Programs compiled at once by Context.build_all (options.build_threads; 1 builds one at a time)."""
    return ctx.options.build_threads or min(8, os.cpu_count() or 1)


def build_options(options, extra=()):
    """The options of every build: a program's own between IEEE division and sqrt (OpenCL 1.2 lets them be 2.5 ulp
    off otherwise, and NVIDIA's are, which moves round-half cases (quantisation) away from numpy's answers) and
    the Options' build_options (DLNET_BUILD_OPTIONS, e.g. -cl-nv-verbose: registers and spills in NVIDIA's logs)."""
    return ["-cl-fp32-correctly-rounded-divide-sqrt"] + list(options) + list(extra)


def build_processes(ctx):
    """How many processes Context.build_all compiles a plan's new programs in (this one and workers; 0 or 1: this
    one alone). DLNET_BUILD_PROCS=N; by default 8 on NVIDIA, whose compiler mostly serializes the builds of one
    process (resnet50 cold: 7-8.6 s on 1 thread, 5.0 on 8, 6.1 on 16), and 1 elsewhere: PoCL compiles every kernel
    of a program to machine code to hand out its binary (resnet50's 22 programs: 3.6 s on one core, 8.6 s on two
    processes)."""
    default = min(8, os.cpu_count() or 1) if ctx.dev.is_nvidia else 1
    return ctx.options.build_processes or default


@functools.lru_cache(maxsize=1)
def _opencl_library():
    """The OpenCL ICD loader pyopencl itself is linked to (already in this process), through ctypes; None where it
    cannot be found. Found once, by Context() on the caller's thread: reading /proc/self/maps takes a system call per
    chunk, each letting go of Python's lock, and a thread that must win it back from a busy main thread 20-40 times
    took 0.09 s for what takes 0.001 s alone (2 cores, torch imported)."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libOpenCL" in line and "/" in line}
        return ctypes.CDLL(sorted(paths)[0]) if len(paths) == 1 else None
    except (OSError, IndexError):
        return None


_SWITCH = {"opening": 0, "interval": None}
_SWITCH_LOCK = threading.Lock()
OPENING_SWITCH_INTERVAL = 0.0005  # s


def _quick_switch(opening):
    """Python's switch interval is OPENING_SWITCH_INTERVAL while a Context's thread opens its device (5 ms
    otherwise): that thread waits for Python's lock after each driver call, and a busy main thread (parsing and
    planning the model) would hold it for up to the interval each time. H100, resnet50 batch 1 warm start (`python3
    bench/probes/startup.py --warm 4 --variants`): 0.585-0.663 s -> 0.525-0.610 s."""
    with _SWITCH_LOCK:
        if opening:
            if _SWITCH["opening"] == 0:
                _SWITCH["interval"] = sys.getswitchinterval()
                sys.setswitchinterval(min(_SWITCH["interval"], OPENING_SWITCH_INTERVAL))
            _SWITCH["opening"] += 1
        else:
            _SWITCH["opening"] -= 1
            if _SWITCH["opening"] == 0:
                sys.setswitchinterval(_SWITCH["interval"])


def wake_driver():
    """Ask the ICD loader for every platform's devices through ctypes, which lets go of Python's lock: the first ask
    loads and starts the drivers (0.01-0.2 s on an NVIDIA machine), which pyopencl would do holding the lock."""
    lib = _opencl_library()
    if lib is None:
        return
    n = ctypes.c_uint32(0)
    if lib.clGetPlatformIDs(0, None, ctypes.byref(n)) != 0 or not n.value:
        return
    platforms = (ctypes.c_void_p * n.value)()
    if lib.clGetPlatformIDs(n.value, platforms, None) != 0:
        return
    for p in platforms:
        count = ctypes.c_uint32(0)
        lib.clGetDeviceIDs(ctypes.c_void_p(p), ctypes.c_uint64(0xFFFFFFFF), 0, None, ctypes.byref(count))


def open_context(device):
    """cl.Context([device]), created through ctypes where the ICD loader is found: ctypes lets go of Python's lock
    for the call, pyopencl's constructor holds it (other threads then ran at 0.2-0.25 of their speed on an H100
    while it lasted, 0.13-0.38 s)."""
    lib = _opencl_library()
    if lib is not None:
        create = lib.clCreateContext
        create.restype = ctypes.c_void_p
        create.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                           ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32)]
        handle, err = ctypes.c_void_p(device.int_ptr), ctypes.c_int32(0)
        context = create(None, 1, ctypes.byref(handle), None, None, ctypes.byref(err))
        if context and err.value == 0:
            return cl.Context.from_int_ptr(context, retain=False)
    return cl.Context([device])  # (raises cl.Error with the driver's reason where creation fails)


def cache_dir(options):
    """options.cache_dir (DLNET_CACHE), else ~/.cache/dlnet (XDG_CACHE_HOME's), made where missing; None where it
    cannot be (or is "none")."""
    if options.cache_dir == "none":
        return None
    root = options.cache_dir or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                             "dlnet")
    try:
        os.makedirs(root, exist_ok=True)
        return root
    except OSError:
        return None


@functools.lru_cache(maxsize=None)
def kernel_source(name):
    """The text of a hand-written kernel file dlnet/kernels/cl/<name>.cl (read once per process)."""
    return resources.files("dlnet.kernels").joinpath("cl", name + ".cl").read_text()


def _mib(nbytes):
    return f"{nbytes / 2**20:.1f} MiB"


def _probe_host_memory(nbytes):  # OSError where the process cannot map nbytes (and slack for the driver) more
    mmap.mmap(-1, nbytes + (64 << 20)).close()


class Context:
    """One OpenCL device, its queue and the programs built for it.

    precision: "fp32" (exact FMA, the default), "tf32" (tensor cores where there are) or "fp16" (kernels/half.py).
    options: an Options (kernels/options.py); None reads the environment's documented knobs.
    threads: the CPU device's worker threads (options.threads; fixed for the process by its first Context).
    """

    def __init__(self, device=None, precision="fp32", profile=False, options=None, threads=None):
        if precision not in ("fp32", "tf32", "fp16"):
            raise DeviceError(f"precision {precision!r}: expected 'fp32', 'tf32' or 'fp16'")
        self.precision = precision
        options = options if options is not None else Options.from_env()
        self.options = options if threads is None else options.replace(threads=threads)
        self.threads = fix_threads(self.options.threads)  # (before anything starts the platform: PoCL reads it then)
        self.profile = profile
        self._programs = {}
        self.allocated_bytes = 0  # live arena bytes of this context (plans release theirs)
        self.allocator = None  # alloc(nbytes) and free(buf) go to its __call__ and release (cuda_share.py)
        # The device is looked up and its OpenCL context opened in the background (0.01-0.2 s and 0.15-0.3 s on
        # NVIDIA, while the caller parses and plans a model): the device's attributes (DEVICE_FIELDS), `cl` and
        # `queue` wait for it. A malformed spec is an error at once, a device that is not there at first use.
        self._opened = None
        self._copy_queue = None
        self._found = threading.Event()
        self._ready = threading.Event()
        if isinstance(device, DeviceInfo):
            self._set_device(device)
        else:
            _device_spec(device)
        _opencl_library()
        _quick_switch(True)
        threading.Thread(target=self._open, args=(device,), name="dlnet-context", daemon=True).start()

    DEVICE_FIELDS = ("info", "device", "is_cpu", "is_nvidia", "fp64")

    def _set_device(self, info):
        """The device's attributes (setdefault: what a caller set meanwhile stays, as a test's is_cpu = False)."""
        for name, value in (("info", info), ("device", info.device), ("is_cpu", info.type == "CPU"),
                            ("is_nvidia", is_nvidia(info.vendor, info.platform)),
                            ("fp64", info.fp64)):
            self.__dict__.setdefault(name, value)
        self._found.set()

    @property
    def dev(self):
        """The device's facts (device.py) for this precision and options."""
        return Device.resolve(self.info, self.precision, self.options, self.is_cpu, self.is_nvidia)

    def with_options(self, options=None, **changes):
        """A Context on the same device, queue and programs with other options (Options, or fields to change)."""
        self._ready.wait()  # (the opening thread sets this context's state: share it once it is there)
        other = object.__new__(Context)
        other.__dict__.update(self.__dict__)
        other.options = (options if options is not None else self.options).replace(**changes)
        fix_threads(other.options.threads)  # (the same device and workers: another count is an error)
        return other

    def __getattr__(self, name):
        """A device attribute before the background lookup has set it: wait for it."""
        if name in Context.DEVICE_FIELDS and "_found" in self.__dict__:
            self._found.wait()
            if name in self.__dict__:
                return self.__dict__[name]
            raise self._opened
        raise AttributeError(f"'Context' object has no attribute {name!r}")

    def __repr__(self):
        return f"Context({self.info})"

    def _open(self, spec):
        try:
            if not self._found.is_set():
                wake_driver()
                self._set_device(pick_device(spec))
            context = open_context(self.device)
            props = cl.command_queue_properties.PROFILING_ENABLE if self.profile else 0
            self._opened = (context, cl.CommandQueue(context, properties=props))
        except DeviceError as e:
            self._opened = e
        except (cl.Error, OSError) as e:
            where = self.__dict__.get("info", spec)  # (self.info would wait for this thread)
            self._opened = DeviceError(f"device {where}: could not create an OpenCL context ({e})")
        finally:
            self._found.set()
            self._ready.set()
            _quick_switch(False)
        trace("parent context")

    def _wait_open(self):
        self._ready.wait()
        if isinstance(self._opened, Exception):
            raise self._opened
        return self._opened

    @property
    def cl(self):
        """The pyopencl Context."""
        return (self._opened if isinstance(self._opened, tuple) else self._wait_open())[0]

    @property
    def queue(self):
        """The in-order command queue every launch and copy goes to."""
        return (self._opened if isinstance(self._opened, tuple) else self._wait_open())[1]

    @property
    def copy_queue(self):
        """A second in-order queue, for uploads of inputs in chunks that the first launches of a plan overlap
        (Plan.run; they wait for their chunk's event)."""
        if self._copy_queue is None:
            props = cl.command_queue_properties.PROFILING_ENABLE if self.profile else 0
            self._copy_queue = cl.CommandQueue(self.cl, self.device, properties=props)
        return self._copy_queue

    def program(self, source, options=()):
        """Build (once per process) and return a cl.Program. Binaries are cached on disk by the driver where it
        caches source builds itself (PoCL's kcache, NVIDIA's ComputeCache: pyopencl then defers to it), else by
        pyopencl in DLNET_CACHE (default ~/.cache/dlnet); with DLNET_BINARY_CACHE=1 by dlnet in DLNET_CACHE/bin."""
        key = (source, tuple(options))
        prg = self._programs.get(key)
        if prg is None:
            opts = build_options(options, self.options.build_options)
            root = cache_dir(self.options) if self.options.binary_cache else None
            prg = self._build(source, opts, self._binary_path(source, opts, root) if root else None)
            self._programs[key] = prg
        return prg

    def _binary_path(self, source, opts, root):
        """Where this device's binary of a program lives in the cache folder `root`."""
        dev = self.device
        key = hashlib.sha256("\0".join([dev.platform.name, dev.name, dev.driver_version, source] + opts)
                             .encode()).hexdigest()
        return os.path.join(root, "bin", key[:40])

    def _build(self, source, opts, binary=None):
        """Build a program from `binary`, the path of its device binary, where that file exists and loads, else from
        source and write the binary there; with no path, from source through pyopencl's cache."""
        if binary and os.path.exists(binary):
            try:
                with open(binary, "rb") as f:
                    return cl.Program(self.cl, [self.device], [f.read()]).build(options=opts)
            except (OSError, cl.Error):
                pass  # a stale or damaged binary: build from source and write it again
        try:
            where = False if binary else cache_dir(self.options)
            prg = for_sm90a(cl.Program(self.cl, source).build(options=opts, cache_dir=where), source, opts)
        except cl.Error as e:
            digest = hashlib.sha1(source.encode()).hexdigest()[:8]
            raise DeviceError(f"OpenCL build failed for program {digest} with {opts}: {e}") from e
        if binary:
            write_binary(binary, prg)
        return prg

    def kernel(self, source, name, options=()):
        """A fresh cl.Kernel (each launch binds its own arguments once)."""
        return cl.Kernel(self.program(source, options), name)

    def build_all(self, keys):
        """Build the programs (source, options) not built yet, several at a time: the OpenCL compiler runs outside
        Python's lock, so a cold plan's programs compile in parallel; in several processes where
        build_processes says so."""
        todo = list(dict.fromkeys(k for k in keys if k not in self._programs))
        procs = build_processes(self)
        if len(todo) > 1 and procs > 1:
            with tempfile.TemporaryDirectory(prefix="dlnet-build-") as tmp:
                self._build_in_processes(todo, procs, tmp)
            return
        if len(todo) > 1 and build_threads(self) > 1:
            with ThreadPoolExecutor(min(build_threads(self), len(todo))) as pool:
                list(pool.map(lambda k: self.program(*k), todo))
        for k in todo:
            self.program(*k)

    def _build_in_processes(self, todo, procs, tmp):
        """build_all's programs through the binary cache (DLNET_CACHE/bin, else the scratch folder `tmp`): those
        missing from it, if more than one, are compiled by worker processes and this one, each taking the
        largest one left; then every program not built here loads from its binary, a few at a time."""
        root = cache_dir(self.options) or tmp
        opts = {k: build_options(k[1], self.options.build_options) for k in todo}
        paths = {k: self._binary_path(k[0], opts[k], root) for k in todo}
        missing = sorted((k for k in todo if not os.path.exists(paths[k])), key=lambda k: -len(k[0]))
        workers, status = [], []
        if len(missing) > 1:
            jobs = os.path.join(tmp, "jobs")
            with open(jobs, "wb") as f:
                loader = _opencl_library()
                pickle.dump({"device": device_identity(self.device), "claims": tmp,
                             "loader": loader._name if loader is not None else None,
                             "jobs": [(k[0], opts[k], paths[k]) for k in missing]}, f)
            trace(f"parent jobs {len(missing)} of {len(todo)}")
            env = None
            if loader is not None:  # an ICD file may name its driver without a path, beside the loader (PoCL's)
                env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(
                    filter(None, [os.path.dirname(loader._name), os.environ.get("LD_LIBRARY_PATH")])))
            for n in range(min(procs, len(missing)) - 1):
                # by file path, not -m: `import dlnet` would cost each worker 0.1 s more
                command = [sys.executable, compile_worker.__file__, jobs]
                with open(os.path.join(tmp, f"worker{n}.err"), "wb") as err:
                    try:
                        workers.append(subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                                        stderr=err, env=env))
                    except OSError:
                        break  # no interpreter to start (an embedded Python): the rest is built here
            try:
                for n, k in enumerate(missing):
                    if claim(tmp, n):
                        self._programs[k] = self._build(k[0], opts[k], paths[k])
                        trace(f"parent built {n}")
            except BaseException:
                for w in workers:
                    w.kill()
                    w.wait()
                raise
            while any(finished(tmp, w) is None for w in workers):
                time.sleep(0.002)
            status = [finished(tmp, w) for w in workers]
            # (their exits are reaped in the background)
            threading.Thread(target=lambda: [w.wait() for w in workers], daemon=True).start()
        trace("parent workers done")
        rest = [k for k in todo if k not in self._programs]

        def load(k):
            self._programs[k] = self._build(k[0], opts[k], paths[k])  # from source where a worker failed
        with ThreadPoolExecutor(max(1, min(build_threads(self), len(rest)))) as pool:
            list(pool.map(load, rest))
        trace(f"parent loaded {len(rest)}")
        for n, w in enumerate(workers):
            if status[n]:  # yet every program built here: the worker, not a program, failed
                with open(os.path.join(tmp, f"worker{n}.err"), errors="replace") as f:
                    lines = f.read().strip().splitlines() or ["(no message)"]
                warnings.warn(f"dlnet: a compile worker exited with status {status[n]} ({lines[-1]}); its "
                              "programs were built in this process", RuntimeWarning, stacklevel=3)

    GUARD = 1 << 16  # DLNET_DEBUG_BOUNDS=1: bytes of guard pattern after every arena, checked after each run

    def check_room(self, sizes, where=""):
        """A DeviceError, before anything is allocated, where buffers of `sizes` bytes do not fit the device: one over
        CL_DEVICE_MAX_MEM_ALLOC_SIZE, or all with what this context holds over CL_DEVICE_GLOBAL_MEM_SIZE."""
        largest, total = self.device.max_mem_alloc_size, self.info.global_mem
        where = f"{where}: " if where else ""
        for n in sizes:
            if n > largest:
                raise DeviceError(f"{where}a buffer of {_mib(n)} is larger than device {self.info} allows in one "
                                  f"buffer ({_mib(largest)}, CL_DEVICE_MAX_MEM_ALLOC_SIZE)")
        if self.allocated_bytes + sum(sizes) > total:
            held = f" with the {_mib(self.allocated_bytes)} already held" if self.allocated_bytes else ""
            raise DeviceError(f"{where}{_mib(sum(sizes))} of buffers{held} do not fit device {self.info} "
                              f"({_mib(total)}, CL_DEVICE_GLOBAL_MEM_SIZE)")

    def alloc(self, nbytes):
        """A device buffer, committed now (a one-byte write): drivers take memory at first use (160 GB of buffers on an
        80 GB H100), a crash in run(); here a DeviceError (NVIDIA: MEM_OBJECT_ALLOCATION_FAILURE; fills fail at 3GiB)"""
        if self.allocator is not None:
            return self.allocator(nbytes)
        guard = self.GUARD if self.options.debug_bounds else 0
        size = max(int(nbytes), 4) + guard
        self.check_room([size])
        buf = None
        try:
            if self.is_cpu:  # PoCL crashes (SIGSEGV) where it cannot get a CPU buffer's memory: ask the OS first
                _probe_host_memory(size)
            buf = cl.Buffer(self.cl, cl.mem_flags.READ_WRITE, size)
            cl.enqueue_copy(self.queue, buf, np.zeros(1, np.uint8), is_blocking=True)
        except (cl.Error, OSError, MemoryError, OverflowError) as e:
            if buf is not None:
                buf.release()
            raise DeviceError(f"device {self.info}: could not allocate {_mib(nbytes)} ({e})") from e
        self.allocated_bytes += buf.size
        if guard:
            self.guarded = getattr(self, "guarded", {})
            self.guarded[buf.int_ptr] = (buf, buf.size - guard)
            cl.enqueue_copy(self.queue, buf, np.full(guard, 0xA5, np.uint8), dst_offset=buf.size - guard)
        return buf

    def check_guards(self, where=""):
        """With DLNET_DEBUG_BOUNDS=1: raise if a kernel wrote past the end of an arena."""
        for buf, size in getattr(self, "guarded", {}).values():
            tail = np.empty(self.GUARD, np.uint8)
            cl.enqueue_copy(self.queue, tail, buf, src_offset=size)
            if not (tail == 0xA5).all():
                first = int(np.argmax(tail != 0xA5))
                raise DeviceError(f"{where}: a kernel wrote {first} bytes past the end of a {size}-byte arena")

    def free(self, buf):
        self.allocated_bytes -= buf.size
        getattr(self, "guarded", {}).pop(buf.int_ptr, None)
        buf.release() if self.allocator is None else self.allocator.release(buf)

    def pinned(self, shape, dtype=np.float32):
        """A zeroed numpy array in page-locked host memory (an ALLOC_HOST_PTR buffer, mapped once). Copies between
        it and the device run at the bus's full speed: 9.6 MB in 0.19 ms on an H100 against 0.84 ms from an
        ordinary numpy array, whose pages the driver must stage first. The mapping lives as long as the array."""
        dtype, shape = np.dtype(dtype), tuple(int(d) for d in shape)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes == 0 and min(shape, default=0) >= 0:
            return np.zeros(shape, dtype)  # (nothing to pin; OpenCL maps no empty region)
        try:
            if self.is_cpu:
                _probe_host_memory(nbytes)
            buf = cl.Buffer(self.cl, cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR, nbytes)
            array, _ = cl.enqueue_map_buffer(self.queue, buf, cl.map_flags.READ | cl.map_flags.WRITE, 0,
                                             shape, dtype)
        except (cl.Error, OSError, MemoryError, OverflowError) as e:
            raise DeviceError(f"device {self.info}: could not allocate {_mib(nbytes)} of pinned host memory for "
                              f"shape {list(shape)} ({e})") from e
        array[...] = 0
        return array

    def upload(self, buf, array, byte_offset=0, wait=True):
        """Copy a host array into buf; wait=False returns at once (pyopencl keeps the array until it is copied)."""
        cl.enqueue_copy(self.queue, buf, np.ascontiguousarray(array), dst_offset=byte_offset, is_blocking=wait)

    def download(self, buf, array, byte_offset=0, wait=True):
        return cl.enqueue_copy(self.queue, array, buf, src_offset=byte_offset, is_blocking=wait)

    def finish(self):
        if self._copy_queue is not None:
            self._copy_queue.finish()
        self.queue.finish()
