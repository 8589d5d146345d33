"""Context.build_all in several processes (Options.build_processes, DLNET_BUILD_PROCS): worker processes compile a
plan's new programs and hand their device binaries back through the binary cache (Options.cache_dir/bin)."""
import os
import subprocess
import sys

import numpy as np
import pytest
from onnx import helper

import dlnet
from dlnet.kernels import runtime
from dlnet.kernels.compile_worker import device_identity, same_devices
from tests.conftest import make_model, reference, rel_l2

GOOD = "__kernel void k(__global float *x) { x[get_global_id(0)] += 1.0f; }"
BAD = "__kernel void k(__global float *x) { x[get_global_id(0)] += no_such_name; }"


def fresh_context(ctx, tmp_path, procs=2):
    """A new context of ctx's device (no program built yet) compiling in `procs` processes, its binary cache in
    tmp_path."""
    return dlnet.Context(ctx.info, options=ctx.options.replace(cache_dir=str(tmp_path), build_processes=procs))


@pytest.fixture
def procs(monkeypatch):
    """The list of the workers started (their Popen objects). This process claims no program, so the worker builds
    every one."""
    monkeypatch.setattr(runtime, "claim", lambda folder, n: False)
    started = []
    popen = subprocess.Popen

    def spy(*args, **kwargs):
        started.append(popen(*args, **kwargs))
        return started[-1]
    monkeypatch.setattr(subprocess, "Popen", spy)
    return started


def small_model(rng):
    w = rng.standard_normal((6, 3, 3, 3)).astype(np.float32)
    fc = rng.standard_normal((6, 5)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["p"], ["g"]), helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["m"]), helper.make_node("Softmax", ["m"], ["y"], axis=1)]
    return make_model(nodes, {"x": ("float32", [2, 3, 12, 12])}, ["y"], {"w": w, "fc": fc})


def test_worker_builds_a_plan(ctx, procs, monkeypatch, tmp_path):
    rng = np.random.default_rng(11)
    model = small_model(rng)
    written = []  # binaries this process writes itself (it builds from source only where a worker failed)
    write_binary = runtime.write_binary
    monkeypatch.setattr(runtime, "write_binary", lambda path, prg: written.append(path) or write_binary(path, prg))
    fresh = fresh_context(ctx, tmp_path)
    net = dlnet.Net(fresh).load_onnx(model)
    assert len(procs) == 1 and procs[0].wait() == 0 and not written
    assert len(fresh._programs) >= 3
    assert len(os.listdir(tmp_path / "bin")) == len(fresh._programs)

    plain = dlnet.Net(fresh_context(ctx, tmp_path, procs=0)).load_onnx(model)
    for _ in range(2):
        x = rng.standard_normal((2, 3, 12, 12)).astype(np.float32)
        y = net.run({"x": x})["y"]
        assert rel_l2(y, plain.run({"x": x})["y"]) < 1e-6
        assert rel_l2(y, reference(model, {"x": x})[0]) < 1e-5

    warm = fresh_context(ctx, tmp_path)
    dlnet.Net(warm).load_onnx(model)
    assert len(procs) == 1, "every binary is in the cache: no worker to start"
    assert warm._programs.keys() == fresh._programs.keys()


def test_build_error_in_a_worker_is_a_device_error(ctx, procs, tmp_path):
    fresh = fresh_context(ctx, tmp_path)
    with pytest.raises(dlnet.DeviceError, match=r"(?s)OpenCL build failed for program .*no_such_name"):
        fresh.build_all([(GOOD, ()), (BAD, ()), (GOOD, ("-DUNUSED=1",))])
    assert procs[0].wait() == 1
    assert (GOOD, ()) in fresh._programs and (GOOD, ("-DUNUSED=1",)) in fresh._programs


def test_failed_worker_falls_back_to_this_process(ctx, procs, monkeypatch, tmp_path):
    """A worker that cannot even start its work (here: no such device) leaves its programs to this process."""
    monkeypatch.setattr(runtime, "device_identity", lambda device: ("no platform", "no device", 0))
    fresh = fresh_context(ctx, tmp_path)
    keys = [(GOOD, ()), (GOOD, ("-DUNUSED=1",))]
    with pytest.warns(RuntimeWarning, match="compile worker exited with status 2 .*no device 0 named 'no device'"):
        fresh.build_all(keys)
    assert all(k in fresh._programs for k in keys)


def test_device_identity_finds_the_device(ctx):
    platform, name, index = device_identity(ctx.device)
    assert same_devices(platform, name)[index] == ctx.device


def test_done_file_says_a_worker_is_finished(tmp_path):
    """The parent goes on when a worker's done file appears, without waiting for its exit (a CUDA context's
    teardown), and reads the worker's status from it; with no file, from the exit."""
    from dlnet.kernels.compile_worker import finished, report_done

    class Running:
        pid = os.getpid()

        def poll(self):
            return None
    assert finished(str(tmp_path), Running()) is None
    report_done(str(tmp_path), 1)
    assert finished(str(tmp_path), Running()) == 1
    exited = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    exited.wait()
    assert finished(str(tmp_path), exited) == 3


def test_worker_reaches_opencl_without_pyopencl(ctx, tmp_path):
    """Given the parent's ICD loader, a worker imports neither pyopencl nor numpy (their import was most of its
    start-up); the binary it writes loads here and runs."""
    import pickle

    import pyopencl as cl

    from dlnet.kernels import compile_worker
    loader = runtime._opencl_library()
    if loader is None:
        pytest.skip("pyopencl's ICD loader is not found in this process")
    path = str(tmp_path / "bin" / "good")
    jobs = tmp_path / "jobs"
    with open(jobs, "wb") as f:
        pickle.dump({"device": device_identity(ctx.device), "claims": str(tmp_path), "loader": loader._name,
                     "jobs": [(GOOD, runtime.build_options(()), path)]}, f)
    code = ("import runpy, sys\nsys.argv = ['worker', sys.argv[1]]\ntry:\n    runpy.run_path("
            f"{compile_worker.__file__!r}, run_name='__main__')\nexcept SystemExit as e:\n    status = e.code\n"
            "print(status, 'pyopencl' in sys.modules, 'numpy' in sys.modules)")
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(loader._name))
    out = subprocess.run([sys.executable, "-c", code, str(jobs)], capture_output=True, text=True, env=env)
    assert out.stdout.split() == ["0", "False", "False"], out.stdout + out.stderr[-2000:]
    with open(path, "rb") as f:
        prg = cl.Program(ctx.cl, [ctx.device], [f.read()]).build()
    x = np.random.default_rng(2).standard_normal(64).astype(np.float32)
    buf = cl.Buffer(ctx.cl, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=x)
    prg.k(ctx.queue, (64,), None, buf)
    y = np.empty_like(x)
    cl.enqueue_copy(ctx.queue, y, buf)
    assert rel_l2(y, x + 1.0) < 1e-7
