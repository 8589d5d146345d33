"""Devices and contexts."""
import numpy as np
import pytest

import dlnet
from dlnet.kernels.runtime import pick_device


def test_devices_listed_with_details():
    devs = dlnet.devices()
    assert devs, "the test environment has PoCL's CPU device at least"
    for i, d in enumerate(devs):
        assert d.index == i and d.name and d.platform and d.type in ("GPU", "CPU", "ACCELERATOR", "OTHER")
        assert d.global_mem > 0 and d.compute_units > 0
    types = [d.type for d in devs]
    assert types == sorted(types, key=lambda t: t != "GPU")  # GPUs first


def test_context_specs(monkeypatch):
    monkeypatch.delenv("DLNET_DEVICE", raising=False)
    assert pick_device("ocl:0").index == 0
    kind = dlnet.devices()[-1].type.lower()  # GPU machines may have no CPU device: use the last listed kind
    if kind in ("cpu", "gpu"):
        assert pick_device(kind).type.lower() == kind
        monkeypatch.setenv("DLNET_DEVICE", kind)
        assert pick_device(None).type.lower() == kind
    with pytest.raises(dlnet.DeviceError, match="ocl:99"):
        pick_device("ocl:99")
    with pytest.raises(dlnet.DeviceError, match="expected 'ocl:N', 'gpu' or 'cpu'"):
        pick_device("tpu")
    with pytest.raises(dlnet.DeviceError, match="ocl:N with N an integer"):
        pick_device("ocl:x")


def test_no_device_says_how_to_get_one(monkeypatch):
    import dlnet.kernels.runtime as rt
    monkeypatch.setattr(rt, "devices", lambda: [])
    with pytest.raises(dlnet.DeviceError, match="pocl-binary-distribution"):
        rt.pick_device(None)


def test_context_looks_its_device_up_in_the_background(monkeypatch):
    """A malformed spec fails in the constructor; a device that is not there at the first use of the context, as
    the same DeviceError; a caller's own setting of a device attribute stays."""
    import threading
    import dlnet.kernels.runtime as rt
    monkeypatch.delenv("DLNET_DEVICE", raising=False)
    with pytest.raises(dlnet.DeviceError, match="expected 'ocl:N', 'gpu' or 'cpu'"):
        dlnet.Context("tpu")
    with pytest.raises(dlnet.DeviceError, match="ocl:N with N an integer"):
        dlnet.Context("ocl:x")
    missing = dlnet.Context(f"ocl:{len(dlnet.devices())}")
    for attr in ("info", "is_cpu", "queue"):
        with pytest.raises(dlnet.DeviceError, match="OpenCL devices"):
            getattr(missing, attr)
    gate = threading.Event()
    found = rt.devices()
    monkeypatch.setattr(rt, "devices", lambda: gate.wait() and found)
    slow = dlnet.Context("ocl:0")
    assert not slow._found.is_set()  # the constructor did not wait for the lookup
    slow.is_cpu = "set by the caller"
    gate.set()
    assert slow.info.index == 0 and slow.device is found[0].device and slow.is_cpu == "set by the caller"
    assert slow.queue is not None
    monkeypatch.setattr(rt, "devices", lambda: [])
    with pytest.raises(dlnet.DeviceError, match="pocl-binary-distribution"):
        dlnet.Context(None).fp64


def test_context_opens_in_the_background(ctx):
    """The OpenCL context is created outside Python's lock (ctypes) on a thread of its own; `cl` and `queue` wait for
    it, and work as pyopencl's own."""
    import pyopencl as cl
    from dlnet.kernels import runtime
    made = runtime.open_context(ctx.device)
    assert made.devices == [ctx.device]
    fresh = dlnet.Context(ctx.info)
    assert fresh.cl.devices == [ctx.device] and fresh.queue.context == fresh.cl
    x = np.random.default_rng(3).standard_normal(1000).astype(np.float32)
    buf = fresh.alloc(x.nbytes)
    cl.enqueue_copy(fresh.queue, buf, x)
    y = np.empty_like(x)
    fresh.download(buf, y)
    assert np.array_equal(x, y)


def test_plan_lowers_while_the_context_opens(ctx, monkeypatch):
    """A Plan lowers its whole graph before it needs the device's context (its arenas are runtime.Deferred until
    then), and Python's switch interval is short while the context opens, then as it was. The context is held back
    here until the plan asks for its first buffer."""
    import sys
    import threading

    from dlnet.kernels import launch, runtime
    from tests.conftest import make_model, rel_l2
    gate, seen = threading.Event(), {}
    real_open, real_get = runtime.open_context, launch.Deferred.get

    def held(device):
        seen["interval"] = sys.getswitchinterval()
        gate.wait(10)
        return real_open(device)

    def get(self):
        if "ready" not in seen:
            seen["ready"] = fresh._ready.is_set()
            gate.set()
        return real_get(self)
    monkeypatch.setattr(runtime, "open_context", held)
    monkeypatch.setattr(launch.Deferred, "get", get)
    before = sys.getswitchinterval()
    fresh = dlnet.Context(ctx.info)
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((2, 3, 9, 9)).astype(np.float32), rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    model = make_model([onnx_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), onnx_node("Relu", ["c"], ["y"])],
                       {"x": x}, ["y"], {"w": w})
    net = dlnet.Net(fresh).load_onnx(model)
    assert seen["ready"] is False  # lowered with the context still held back
    assert seen["interval"] == min(before, runtime.OPENING_SWITCH_INTERVAL) and sys.getswitchinterval() == before
    assert rel_l2(net.run({"x": x})["y"], np.maximum(_conv_ref(x, w), 0.0)) < 1e-5


def onnx_node(op, ins, outs, **attrs):
    from onnx import helper
    return helper.make_node(op, ins, outs, **attrs)


def _conv_ref(x, w):
    """3x3 convolution, padding 1, stride 1, in float64."""
    n, c, h, wd = x.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, w.shape[0], h, wd))
    for i in range(3):
        for j in range(3):
            out += np.einsum("nchw,kc->nkhw", xp[:, :, i:i + h, j:j + wd], w[:, :, i, j].astype(np.float64))
    return out


def test_context_that_cannot_open_is_a_device_error(ctx, monkeypatch):
    import pyopencl as cl
    from dlnet.kernels import runtime

    def refuse(device):
        raise cl.Error("clCreateContext failed: OUT_OF_HOST_MEMORY")
    monkeypatch.setattr(runtime, "open_context", refuse)
    fresh = dlnet.Context(ctx.info)
    with pytest.raises(dlnet.DeviceError, match="could not create an OpenCL context .*OUT_OF_HOST_MEMORY"):
        fresh.queue


def test_bad_precision():
    with pytest.raises(dlnet.DeviceError, match="precision"):
        dlnet.Context("cpu", precision="fp8")


def test_memory_planner_reuses_buffers(ctx):
    import os

    import onnx

    ctx = ctx.with_options(winograd_min_channels=0)  # (its tiles take arena space: not this test's point)
    path = os.path.join(os.path.dirname(onnx.__file__), "backend/test/data/light/light_resnet50.onnx")
    net = dlnet.Net(ctx)
    net.load_onnx(path)
    mem = net.memory
    assert mem.activations < mem.naive_activations / 3
    assert mem.weights > 90 * 2**20
    assert "one buffer per value" in str(mem)
    net.release()
    assert np.isfinite(mem.activations)


def test_pinned_input_array_runs_like_a_plain_one(ctx):
    """Net.input_array gives a zeroed array in page-locked memory; filled and passed to run(), the result matches
    the reference, and the array can be refilled for the next run."""
    from onnx import helper

    from tests.conftest import make_model, reference, rel_l2
    rng = np.random.default_rng(7)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                       {"x": ("float32", ["n", 3, 8, 8])}, ["y"], {"w": w})
    net = dlnet.Net(ctx).load_onnx(model)
    with pytest.raises(dlnet.InputError, match="shape="):
        net.input_array("x")
    with pytest.raises(dlnet.InputError, match="unknown input 'z'"):
        net.input_array("z")
    x = net.input_array("x", (2, 3, 8, 8))
    assert x.dtype == np.float32 and x.shape == (2, 3, 8, 8) and not x.any()
    for _ in range(2):
        data = rng.standard_normal(x.shape).astype(np.float32)
        x[...] = data
        y = net.run({"x": x})["y"]
        assert rel_l2(y, reference(model, {"x": data})[0]) < 1e-5
    bound = dlnet.Net(ctx).load_onnx(model, batch=3)
    assert bound.input_array("x").shape == (3, 3, 8, 8)


def test_outputs_downloaded_through_pinned_chunks(ctx):
    """On GPUs an output of Options.download_staging's sizes comes back through its plan's pinned array in chunks
    (here of 1000 bytes: a ragged last one, on the test device taken for a GPU): the values of a plain download, and
    each run's arrays its own (the next run does not write over them); a small output, below the sizes, as before."""
    from onnx import helper

    from tests.conftest import make_model, reference, rel_l2
    rng = np.random.default_rng(8)
    model = make_model([helper.make_node("Sigmoid", ["x"], ["y"]), helper.make_node("ReduceSum", ["x"], ["s"],
                                                                                      keepdims=0)],
                       {"x": ("float32", [3, 1001])}, ["y", "s"])
    staged = ctx.with_options(download_staging=(256, 1 << 20, 1000))
    staged.is_cpu = False
    net = dlnet.Net(staged).load_onnx(model)
    runs = [rng.standard_normal((3, 1001)).astype(np.float32) for _ in range(2)]
    outs = [net.run({"x": x}) for x in runs]
    assert list(net._last.staging) == [0]  # (y: 12 KB staged; s: 12 bytes, plainly)
    for x, got in zip(runs, outs):
        want = reference(model, {"x": x})
        assert rel_l2(got["y"], want[0]) < 1e-6 and rel_l2(got["s"], want[1]) < 1e-5
    assert not np.shares_memory(outs[0]["y"], outs[1]["y"])


@pytest.mark.parametrize("group,width", [(1, 10), (8, 19)], ids=["dense", "depthwise"])
def test_conv_writes_over_its_residual(ctx, group, width):
    """A convolution with a fused residual that dies there writes its output over it (the planner's in-place
    rule for Conv input 3), and the result still matches the reference (depthwise: rows whose vector blocks overlap,
    dwconv_cpu.cl)."""
    from onnx import helper

    from tests.conftest import make_model, reference, rel_l2
    rng = np.random.default_rng(3)
    w = rng.standard_normal((8, 8 // group, 3, 3)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    model = make_model([helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["x"], ["r"]),
                        helper.make_node("Conv", ["a", "w", "b"], ["c"], pads=[1, 1, 1, 1], group=group),
                        helper.make_node("Add", ["c", "r"], ["s"]), helper.make_node("Relu", ["s"], ["y"]),
                        helper.make_node("GlobalAveragePool", ["y"], ["g"])],
                       {"x": ("float32", [2, 8, 10, width])}, ["g"], {"w": w, "b": b})
    x = rng.standard_normal((2, 8, 10, width)).astype(np.float32)
    net = dlnet.Net(ctx).load_onnx(model)
    assert rel_l2(net.run({"x": x})["g"], reference(model, {"x": x})[0]) < 1e-5
    plan = net._last
    conv = next(n for n in plan.graph.nodes if n.op == "Conv")
    assert len(conv.inputs) == 4 and conv.inputs[3].producer is not None
    offsets = plan.memory.act_offsets
    assert offsets[conv.outputs[0].id] == offsets[conv.inputs[3].id]
