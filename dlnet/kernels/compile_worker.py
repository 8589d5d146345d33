"""Compile OpenCL programs in a process of their own and write their device binaries: Context.build_all starts
several, because NVIDIA's compiler runs mostly one build at a time in a process.

    python dlnet/kernels/compile_worker.py JOBS      (or python -m dlnet.kernels.compile_worker JOBS)

JOBS is a pickle of {"device": (platform name, device name, index among the devices of those names),
"jobs": [(source, options, binary path), ...], "claims": a folder}. Every process given the same JOBS (the
parent too) builds the next job nobody has claimed yet, in list order, so one that starts late takes fewer. Each
binary is written atomically; a failed build is reported on stderr, the exit status is then 1, and the caller
builds that program itself to raise its error with the build log.

Only pyopencl and the standard library are imported here: each worker's start-up (0.15 s, then a context) is on the
cold start's path, and Context.build_all runs this file by its path so as not to import all of dlnet (0.1 s more).
"""
import os
import pickle
import sys
import time

import pyopencl as cl


def same_devices(platform, name):
    """The devices named `name` on the platforms named `platform`, in enumeration order."""
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


def write_binary(path, program):
    """Write a built program's device binary to `path` atomically (readers never see half a file)."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(program.get_info(cl.program_info.BINARIES)[0])
        os.replace(tmp, path)
    except OSError:
        pass  # no binary: the parent builds the program from source


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
    devices = same_devices(platform, name)
    if index >= len(devices):
        print(f"compile worker: no device {index} named {name!r} on platform {platform!r}", file=sys.stderr)
        return 2
    ctx = cl.Context([devices[index]])
    trace("context")
    status = 0
    for n, (source, options, path) in enumerate(spec["jobs"]):
        if not claim(spec["claims"], n):
            continue
        try:
            program = cl.Program(ctx, source).build(options=options, cache_dir=False)
        except cl.Error as e:
            print(f"compile worker: program {n} ({os.path.basename(path)}) failed: {e}", file=sys.stderr)
            status = 1
            continue
        write_binary(path, program)
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
