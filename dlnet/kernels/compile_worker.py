"""Compile OpenCL programs in a process of their own and write their device binaries: Context.build_all starts
several, because NVIDIA's compiler runs mostly one build at a time in a process.

    python dlnet/kernels/compile_worker.py JOBS      (or python -m dlnet.kernels.compile_worker JOBS)

JOBS is a pickle of {"device": (platform name, device name, index among the devices of those names),
"jobs": [(source, options, binary path), ...], "claims": a folder}. Every process given the same JOBS (the
parent too) builds the next job nobody has claimed yet, in list order, so one that starts late takes fewer. Each
binary is written atomically; a failed build is reported on stderr, the exit status is then 1, and the caller
builds that program itself to raise its error with the build log.

A worker imports only the standard library: it reaches OpenCL through ctypes, on the ICD loader the parent names
in JOBS ("loader"), since each worker's start-up and context are on the cold start's path. On an H100 machine eight
workers starting at once took 0.8 s each to reach their first line, most of it importing pyopencl and numpy
(`python3 bench/probes/startup.py --trace`). Without a loader in JOBS it uses pyopencl. Context.build_all runs this
file by its path, so as not to import all of dlnet.
"""
import ctypes
import os
import pickle
import sys
import time


def same_devices(platform, name):
    """The devices named `name` on the platforms named `platform`, in enumeration order."""
    import pyopencl as cl
    found = []
    for p in cl.get_platforms():
        if p.name.strip() != platform:
            continue
        try:
            found += [d for d in p.get_devices() if d.name.strip() == name]
        except cl.Error:
            continue
    return found


def device_identity(device):
    """What a worker needs to find `device` again: the names, and which of the devices so named it is."""
    platform, name = device.platform.name.strip(), device.name.strip()
    return platform, name, same_devices(platform, name).index(device)


def claim(folder, n):
    """True for the one process that claims job n of the JOBS whose claims folder this is."""
    try:
        os.close(os.open(os.path.join(folder, f"claim{n}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


# gemm_wgmma.cl's instructions that only sm_90a takes sit in PTX comments marked so (emitter.wgmma_macro)
WGMMA_MARK = "// @WG "


def sm90a_ptx(binary):
    """The PTX of a program built from source (NVIDIA's binaries are PTX text) with the WGMMA_MARK comments turned
    back into instructions and the target sm_90a: NVIDIA's OpenCL C compiler targets sm_90, where ptxas rejects
    wgmma, but the driver builds sm_90a PTX given as a binary."""
    text = binary.decode()
    return text.replace(WGMMA_MARK, "").replace(".target sm_90,", ".target sm_90a,").encode()


def for_sm90a(program, source, options):
    """A pyopencl program built from `source`, or where that holds WGMMA_MARK, the program built again from its PTX
    for sm_90a (sm90a_ptx)."""
    if WGMMA_MARK not in source:
        return program
    import pyopencl as cl
    ptx = sm90a_ptx(program.get_info(cl.program_info.BINARIES)[0])
    return cl.Program(program.context, program.devices, [ptx]).build(options=options)


def write_binary(path, program):
    """Write a built pyopencl program's device binary to `path` atomically (readers never see half a file)."""
    import pyopencl as cl
    write_bytes(path, program.get_info(cl.program_info.BINARIES)[0])


def write_bytes(path, data):
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:
        pass  # no binary: the parent builds the program from source


class OpenCL:
    """The few OpenCL calls a worker makes, through ctypes on the ICD loader at `path`."""
    PLATFORM_NAME, DEVICE_NAME, DEVICE_TYPE_ALL = 0x0902, 0x102B, 0xFFFFFFFF
    BUILD_LOG, BINARY_SIZES, BINARIES = 0x1183, 0x1165, 0x1166

    def __init__(self, path):
        lib = self.lib = ctypes.CDLL(path)
        p, u, i, z = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int32, ctypes.c_size_t
        pz = ctypes.POINTER(z)
        for fn, res, args in (
                ("clGetPlatformIDs", i, [u, ctypes.POINTER(p), ctypes.POINTER(u)]),
                ("clGetPlatformInfo", i, [p, u, z, p, pz]),
                ("clGetDeviceIDs", i, [p, ctypes.c_uint64, u, ctypes.POINTER(p), ctypes.POINTER(u)]),
                ("clGetDeviceInfo", i, [p, u, z, p, pz]),
                ("clCreateContext", p, [p, u, ctypes.POINTER(p), p, p, ctypes.POINTER(i)]),
                ("clCreateProgramWithSource", p, [p, u, ctypes.POINTER(ctypes.c_char_p), pz, ctypes.POINTER(i)]),
                ("clBuildProgram", i, [p, u, ctypes.POINTER(p), ctypes.c_char_p, p, p]),
                ("clGetProgramBuildInfo", i, [p, p, u, z, p, pz]),
                ("clGetProgramInfo", i, [p, u, z, p, pz]),
                ("clReleaseProgram", i, [p])):
            f = getattr(lib, fn)
            f.restype, f.argtypes = res, args

    def _text(self, get, *head):
        size = ctypes.c_size_t(0)
        if get(*head, 0, None, ctypes.byref(size)) != 0:
            return ""
        buf = ctypes.create_string_buffer(size.value)
        get(*head, size.value, buf, None)
        return buf.value.decode(errors="replace").strip()

    def same_devices(self, platform, name):
        """Device handles as `same_devices` finds them."""
        lib, n = self.lib, ctypes.c_uint32(0)
        if lib.clGetPlatformIDs(0, None, ctypes.byref(n)) != 0 or not n.value:
            return []
        platforms = (ctypes.c_void_p * n.value)()
        lib.clGetPlatformIDs(n.value, platforms, None)
        found = []
        for pl in platforms:
            if self._text(lib.clGetPlatformInfo, pl, self.PLATFORM_NAME) != platform:
                continue
            count = ctypes.c_uint32(0)
            if lib.clGetDeviceIDs(pl, self.DEVICE_TYPE_ALL, 0, None, ctypes.byref(count)) != 0 or not count.value:
                continue
            devs = (ctypes.c_void_p * count.value)()
            lib.clGetDeviceIDs(pl, self.DEVICE_TYPE_ALL, count.value, devs, None)
            found += [d for d in devs if self._text(lib.clGetDeviceInfo, d, self.DEVICE_NAME) == name]
        return found

    def context(self, device):
        err = ctypes.c_int32(0)
        handle = ctypes.c_void_p(device)
        ctx = self.lib.clCreateContext(None, 1, ctypes.byref(handle), None, None, ctypes.byref(err))
        if not ctx or err.value:
            raise RuntimeError(f"clCreateContext failed ({err.value})")
        return ctx

    def build(self, ctx, device, source, options):
        """The device binary of `source` built with `options`; RuntimeError with the build log where it fails."""
        lib, err = self.lib, ctypes.c_int32(0)
        text = source.encode()
        prg = lib.clCreateProgramWithSource(ctx, 1, ctypes.byref(ctypes.c_char_p(text)),
                                            ctypes.byref(ctypes.c_size_t(len(text))), ctypes.byref(err))
        if not prg or err.value:
            raise RuntimeError(f"clCreateProgramWithSource failed ({err.value})")
        try:
            handle = ctypes.c_void_p(device)
            status = lib.clBuildProgram(prg, 1, ctypes.byref(handle), " ".join(options).encode(), None, None)
            if status != 0:
                log = self._text(lib.clGetProgramBuildInfo, prg, handle, self.BUILD_LOG)
                raise RuntimeError(f"clBuildProgram failed ({status}): {log[-2000:]}")
            size = ctypes.c_size_t(0)
            lib.clGetProgramInfo(prg, self.BINARY_SIZES, ctypes.sizeof(size), ctypes.byref(size), None)
            data = ctypes.create_string_buffer(size.value)
            pointers = (ctypes.c_void_p * 1)(ctypes.cast(data, ctypes.c_void_p))
            if lib.clGetProgramInfo(prg, self.BINARIES, ctypes.sizeof(pointers), pointers, None) != 0:
                raise RuntimeError("clGetProgramInfo(BINARIES) failed")
            return data.raw
        finally:
            lib.clReleaseProgram(prg)


# DLNET_BUILD_TRACE=FILE: every process that compiles (workers and the parent) appends "time pid event" lines
TRACE = os.environ.get("DLNET_BUILD_TRACE")


def trace(event):
    if TRACE:
        with open(TRACE, "a") as f:
            f.write(f"{time.time():.4f} {os.getpid()} {event}\n")


def main(jobs_file):
    trace("worker started")
    with open(jobs_file, "rb") as f:
        spec = pickle.load(f)
    platform, name, index = spec["device"]
    ocl = OpenCL(spec["loader"]) if spec.get("loader") else None
    devices = ocl.same_devices(platform, name) if ocl else same_devices(platform, name)
    if index >= len(devices):
        print(f"compile worker: no device {index} named {name!r} on platform {platform!r}", file=sys.stderr)
        return 2
    if ocl:
        ctx = ocl.context(devices[index])
    else:
        import pyopencl as cl
        ctx = cl.Context([devices[index]])
    trace("context")
    status = 0
    for n, (source, options, path) in enumerate(spec["jobs"]):
        if not claim(spec["claims"], n):
            continue
        try:
            if ocl:
                data = ocl.build(ctx, devices[index], source, options)
            else:
                prg = cl.Program(ctx, source).build(options=options, cache_dir=False)
                data = prg.get_info(cl.program_info.BINARIES)[0]
            write_bytes(path, sm90a_ptx(data) if WGMMA_MARK in source else data)  # (the parent builds it from there)
        except Exception as e:  # (cl.Error, RuntimeError): the parent builds it and raises with the log
            print(f"compile worker: program {n} ({os.path.basename(path)}) failed: {e}", file=sys.stderr)
            status = 1
            continue
        trace(f"built {n}")
    report_done(spec["claims"], status)
    return status


def report_done(folder, status):
    """Say this worker's jobs are over (file done<pid> holds the exit status) before its context is torn down: the
    exit of a process with a CUDA context takes 0.3-0.5 s more, which the parent need not wait for."""
    path = os.path.join(folder, f"done{os.getpid()}")
    try:
        with open(path + ".tmp", "w") as f:
            f.write(str(status))
        os.replace(path + ".tmp", path)
    except OSError:
        pass  # the parent waits for the exit instead


def finished(folder, worker):
    """The exit status of a worker (a Popen) whose jobs are over, from its done file or its exit; else None."""
    try:
        with open(os.path.join(folder, f"done{worker.pid}")) as f:
            return int(f.read())
    except (OSError, ValueError):
        return worker.poll()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m dlnet.kernels.compile_worker JOBS")
    sys.exit(main(sys.argv[1]))
