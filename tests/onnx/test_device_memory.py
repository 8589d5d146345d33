"""Device memory is committed when a plan is made: running out is a DeviceError at load (or when a new input shape
is planned), never a crash in run(). Each case runs in a subprocess whose address space is capped (RLIMIT_AS): PoCL
crashed with SIGSEGV there before (its buffers take memory when first used)."""
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHILD = textwrap.dedent("""
    import resource, sys
    import numpy as np
    from onnx import helper
    import dlnet
    from tests.conftest import make_model, context

    ctx = context()
    ctx.queue  # (the device opened before the cap)
    vm = int(next(l for l in open("/proc/self/status") if l.startswith("VmSize")).split()[1]) * 1024
    case = sys.argv[1]
    if case == "load":  # a 1 KB model whose plan needs 2 GiB: an input of 2**28 floats and its Relu
        model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": ("float32", [1 << 28])}, ["y"])
    else:  # bool[2147483647] arriving at run time: 4 GiB planned then
        model = make_model([helper.make_node("Not", ["x"], ["y"])], {"x": ("bool", ["N"])}, ["y"])
    small = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": ("float32", [64])}, ["y"])
    ok = dlnet.Net(ctx).load_onnx(small)
    x = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    ok.run({"x": x})
    feed = np.zeros(2147483647, bool) if case == "run" else None
    limit = vm + (1 << 30) + (0 if feed is None else feed.nbytes)  # 1 GiB more than the process holds
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        net = dlnet.Net(ctx).load_onnx(model)
        if feed is not None:
            net.run({"x": feed})
        print("NO ERROR")
    except dlnet.DeviceError as e:
        print("DeviceError:", e)
    np.testing.assert_array_equal(ok.run({"x": x})["y"], np.maximum(x, 0))  # the context still works
    print("still runs")
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux's")
@pytest.mark.parametrize("case", ["load", "run"])
def test_out_of_memory_is_a_device_error_not_a_crash(ctx, case):
    if not ctx.is_cpu:
        pytest.skip("an address-space cap limits a CPU device's memory only")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", CHILD, case], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"exit {r.returncode} (a negative one is a signal)\n{r.stdout}\n{r.stderr[-2000:]}"
    lines = r.stdout.splitlines()
    # refused by the allocation under the cap, or before it where the device's largest buffer (PoCL: a share of the
    # machine's memory) is smaller than the plan's arena
    refused = "could not allocate" in lines[0] or ("larger than device" in lines[0] and
                                                   "allows in one buffer" in lines[0])
    assert lines[0].startswith("DeviceError:") and refused and "MiB" in lines[0], r.stdout
    assert lines[-1] == "still runs"
