"""Options (dlnet/kernels/options.py): the documented environment knobs and DLNET_OPTIONS read once per Context by
Options.from_env, bad names refused, and contexts of one device with different options lowering the same model each
their own way, side by side in one process (Context.with_options, Context(..., options=...))."""
import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from onnx import helper

import dlnet
from dlnet.kernels import runtime
from dlnet.kernels.device import Device
from dlnet.kernels.options import Options

from ..conftest import context, make_model, rel_l2

rng = np.random.default_rng(5)


def test_from_env_without_knobs_is_the_defaults():
    assert Options.from_env({}) == Options()
    assert Options.from_env({"DLNET_OPTIONS": "  "}) == Options()
    assert Options.from_env({"DLNET_WINOGRAD_MIN_CHANNELS": "0", "DLNET_TF32_TALL": "0"}) == Options()  # (removed)


def test_from_env_documented_knobs():
    o = Options.from_env({"DLNET_CACHE": "/tmp/c", "DLNET_TUNE": "0", "DLNET_TUNE_LAYERS": "1",
                          "DLNET_BUILD_PROCS": "3", "DLNET_BUILD_THREADS": "2",
                          "DLNET_BUILD_OPTIONS": "-cl-nv-verbose  -DX=1", "DLNET_BINARY_CACHE": "1",
                          "DLNET_DEBUG_BOUNDS": "1"})
    assert (o.cache_dir, o.tune, o.tune_layers, o.build_processes, o.build_threads) == ("/tmp/c", "0", "1", 3, 2)
    assert o.build_options == ("-cl-nv-verbose", "-DX=1") and o.binary_cache is True and o.debug_bounds is True
    assert o.replace(cache_dir="", tune="", tune_layers="", build_processes=0, build_threads=0, build_options=(),
                     binary_cache=False, debug_bounds=False) == Options()  # nothing else moved
    off = Options.from_env({"DLNET_BINARY_CACHE": "0", "DLNET_DEBUG_BOUNDS": "0"})
    assert off.binary_cache is False and off.debug_bounds is False
    assert Options.from_env({"DLNET_BINARY_CACHE": "yes"}).binary_cache is False  # only "1" turns it on
    assert Options.from_env({"DLNET_DEBUG_BOUNDS": "2"}).debug_bounds is True


@pytest.mark.parametrize("name", ["DLNET_BUILD_PROCS", "DLNET_BUILD_THREADS"])
def test_from_env_bad_integer(name):
    with pytest.raises(dlnet.DeviceError, match=f"{name}='two'"):
        Options.from_env({name: "two"})


def test_dlnet_options_literals():
    spec = ("winograd_min_channels=0, tf32_fp32_k=(16, 64),chunk_min_pixels={'fp32': 1, 'tf32': 2},"
            "matrix_core=portable,tf32_tall=False,gemv_mma=None,conv_cpu_winograd_max_row=1.5,"
            "gemv_rows_tiles={32: {'LK': 8, 'LN': 8, 'NC': 4, 'KC': 64, 'per_cu': 1}},cache_dir=/tmp/x y")
    o = Options.from_env({"DLNET_OPTIONS": spec, "DLNET_TUNE": "0"})
    assert o.winograd_min_channels == 0 and o.tf32_fp32_k == (16, 64)
    assert o.chunk_min_pixels == {"fp32": 1, "tf32": 2} and o.matrix_core == "portable"
    assert o.tf32_tall is False and o.gemv_mma is None and o.conv_cpu_winograd_max_row == 1.5
    assert o.gemv_rows_tiles == {32: {"LK": 8, "LN": 8, "NC": 4, "KC": 64, "per_cu": 1}}
    assert o.cache_dir == "/tmp/x y"  # (not a literal: the text)
    assert o.tune == "0"  # the documented knob kept
    # DLNET_OPTIONS is applied after the documented knobs: it wins
    assert Options.from_env({"DLNET_OPTIONS": "tune='1'", "DLNET_TUNE": "0"}).tune == "1"
    # the rest stays at its defaults
    assert o.replace(winograd_min_channels=64) != Options(tune="0")
    assert Options().parse("reduce_lanes=2") == Options(reduce_lanes=2)


@pytest.mark.parametrize("spec", ["no_such_knob=1", "winograd_min_channels", "reduce_lanes=2,WINOGRAD_M=4",
                                  "=3"])
def test_dlnet_options_bad_names(spec):
    with pytest.raises(dlnet.DeviceError, match="DLNET_OPTIONS") as e:
        Options.from_env({"DLNET_OPTIONS": spec})
    assert isinstance(e.value, dlnet.DlnetError) and "winograd_min_channels" in str(e.value)  # (the known names)


def test_options_are_frozen():
    o = Options()
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.winograd_m = 4
    p = o.replace(winograd_m=4)
    assert p.winograd_m == 4 and o.winograd_m == 2 and p != o
    with pytest.raises(TypeError):
        o.replace(no_such_knob=1)


def test_context_reads_the_environment_once(monkeypatch):
    """A Context takes the environment's options when it is made; a later change reaches only later contexts."""
    info = context().info
    monkeypatch.setenv("DLNET_OPTIONS", "reduce_lanes=2,conv_cpu_winograd=False")
    monkeypatch.setenv("DLNET_BUILD_PROCS", "3")
    ctx = dlnet.Context(info)
    assert ctx.options.reduce_lanes == 2 and ctx.options.conv_cpu_winograd is False
    assert runtime.build_processes(ctx) == 3
    monkeypatch.setenv("DLNET_OPTIONS", "reduce_lanes=1")
    monkeypatch.setenv("DLNET_BUILD_PROCS", "1")
    assert ctx.options.reduce_lanes == 2 and runtime.build_processes(ctx) == 3
    later = dlnet.Context(info)
    assert later.options.reduce_lanes == 1 and later.options.conv_cpu_winograd is True
    assert runtime.build_processes(later) == 1
    given = dlnet.Context(info, options=Options(reduce_lanes=8))  # given options: the environment is not read
    assert given.options == Options(reduce_lanes=8)


def test_with_options_shares_the_device():
    """ctx.with_options: the same device, queue and programs, other options; the original keeps its own."""
    ctx = context()
    other = ctx.with_options(matrix_core="portable", reduce_lanes=1)
    assert other is not ctx and other.options == ctx.options.replace(matrix_core="portable", reduce_lanes=1)
    assert ctx.options != other.options and ctx.options == context().options
    assert other.queue is ctx.queue and other.cl is ctx.cl and other._programs is ctx._programs
    assert other.info is ctx.info and other.precision == ctx.precision
    assert other.dev.core == "gemm_core" and other.dev.tiled
    assert ctx.with_options(matrix_core="auto").dev.core == ("gemm_vec" if ctx.is_cpu else "gemm_core")
    assert ctx.with_options(Options(reduce_lanes=3)).options == Options(reduce_lanes=3)
    assert ctx.with_options(Options(reduce_lanes=3), winograd_m=4).options == Options(reduce_lanes=3, winograd_m=4)


def test_with_options_while_the_device_opens():
    """A context derived at once from one whose device is still opening (in the background) runs a model too."""
    x = rng.standard_normal((2, 5)).astype(np.float32)
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": x}, ["y"])
    for _ in range(3):  # (the race is the opening thread's: a few tries)
        other = dlnet.Context(context().info).with_options(reduce_lanes=1)
        assert np.array_equal(dlnet.Net(other).load_onnx(model).run({"x": x})["y"], np.maximum(x, 0))


def test_device_facts():
    """Device.resolve: a CPU runs gemm_vec unless the options ask for the portable tiled core; tf32 is the tensor
    cores' only on NVIDIA, where fp16's products share their core."""
    info = context().info
    if info.type != "CPU":
        pytest.skip("the CPU device's facts")
    dev = Device.resolve(info, "tf32", Options())
    assert dev.is_cpu and dev.kind == "cpu" and dev.core == "gemm_vec" and not dev.tiled and not dev.tensor_cores
    assert dev.compute_units == info.compute_units and dev.precision == "tf32"
    portable = Device.resolve(info, "fp32", Options(matrix_core="portable"))
    assert portable.core == "gemm_core" and portable.tiled and portable.is_cpu
    gpu = Device.resolve(info, "tf32", Options(), is_cpu=False, nvidia=True)
    assert gpu.kind == "gpu" and gpu.core == "gemm_core" and gpu.tensor_cores and gpu.cp_async and gpu.mma
    # fp16 on NVIDIA: the products that are not f16 ones run on the tf32 core (half is exact in tf32), unless asked not
    half = Device.resolve(info, "fp16", Options(), is_cpu=False, nvidia=True)
    assert half.mma and not half.tensor_cores and half.half_storage
    assert not Device.resolve(info, "fp16", Options(fp16_mma=False), is_cpu=False, nvidia=True).mma
    assert not Device.resolve(info, "fp16", Options(), is_cpu=False, nvidia=False).mma
    assert not Device.resolve(info, "fp32", Options(fp32_tf32x3=False), is_cpu=False, nvidia=True).mma
    # fp32 on NVIDIA's tf32 cores with operands split in tf32 halves (compute capability 8 on): mma, but none of the
    # tf32-only paths; not on older or unknown NVIDIA devices, other vendors' or CPUs
    def on(major):
        nv_device = SimpleNamespace(local_mem_size=48 << 10, compute_capability_major_nv=major)
        return dataclasses.replace(info, device=nv_device)
    x3 = Device.resolve(on(9), "fp32", Options(fp32_tf32x3=True), is_cpu=False, nvidia=True)
    assert x3.mma and x3.tf32x3 and x3.ldsm_tf32 and x3.wgmma and not x3.tensor_cores and not gpu.tf32x3
    assert Device.resolve(on(8), "fp32", Options(), is_cpu=False, nvidia=True).tf32x3
    assert not Device.resolve(on(7), "fp32", Options(), is_cpu=False, nvidia=True).mma
    assert not Device.resolve(info, "fp32", Options(), is_cpu=False, nvidia=True).mma  # (no capability to read)
    assert not Device.resolve(on(9), "fp32", Options(fp32_tf32x3=True), is_cpu=False, nvidia=False).mma
    assert not Device.resolve(on(9), "fp32", Options(fp32_tf32x3=True), nvidia=True).tf32x3  # (a CPU device)
    assert not Device.resolve(on(9), "fp32", Options(matrix_core="portable"), is_cpu=False, nvidia=True).mma


def conv3x3(c=16, k=24):
    x, w, b = rng.standard_normal((2, c, 14, 13)).astype(np.float32), \
        (rng.standard_normal((k, c, 3, 3)) / 12).astype(np.float32), rng.standard_normal(k).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
                        helper.make_node("Relu", ["c"], ["y"])], {"x": x}, ["y"], {"w": w, "b": b})
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = sum(np.einsum("nchw,kc->nkhw", xp[:, :, i:i + 14, j:j + 13], w[:, :, i, j].astype(np.float64))
              for i in range(3) for j in range(3)) + b[None, :, None, None]
    return model, x, np.maximum(ref, 0)


def test_two_contexts_lower_one_model_their_own_ways():
    """One model on two contexts of the same device, alive side by side: Winograd on one, not on the other (CPU
    devices: conv_cpu_winograd; GPU cores: winograd_min_channels), each run twice in turns, both against float64."""
    ctx = context()
    if ctx.dev.tiled:
        on = dict(winograd_min_channels=8, winograd_min_channels_tf32=0, winograd_min_layer_tiles=0)
        off = dict(winograd_min_channels=0)
        algo_on, algo_off = "winograd2", "implicit_gemm"
    else:
        on, off = dict(conv_cpu_winograd=True, conv_cpu_winograd_min_channels=16), dict(conv_cpu_winograd=False)
        algo_on, algo_off = "cpu_winograd", "cpu_direct"
    model, x, ref = conv3x3()
    a = dlnet.Context(ctx.info, options=ctx.options.replace(**on))
    b = dlnet.Context(ctx.info, options=ctx.options.replace(**off))
    c = a.with_options(**off)  # derived: a's device and programs, b's choice
    nets = {name: dlnet.Net(cx).load_onnx(model) for name, cx in [("a", a), ("b", b), ("c", c)]}
    labels = {name: [launch.label for launch in net.launches] for name, net in nets.items()}
    assert any("winograd" in label for label in labels["a"]), labels["a"]
    assert not any("winograd" in label for label in labels["b"] + labels["c"]), labels
    if ctx.is_cpu and not ctx.dev.tiled:
        kernels = {name: {launch.kernel.function_name for launch in net.launches} for name, net in nets.items()}
        assert "conv2d_cpu_wino" in kernels["a"] and "conv2d_cpu_direct" not in kernels["a"], kernels
        assert "conv2d_cpu_direct" in kernels["b"] and "conv2d_cpu_wino" not in kernels["b"], kernels
        assert kernels["c"] == kernels["b"]
    algos = {name: [n.schedule.get("algo") for n in net._last.graph.nodes if n.op == "Conv"]
             for name, net in nets.items()}
    assert algos == {"a": [algo_on], "b": [algo_off], "c": [algo_off]}, algos  # the schedule's choice per context
    for _ in range(2):
        for name in ("a", "b", "c"):
            assert rel_l2(nets[name].run({"x": x})["y"], ref) < 1e-4, name
    assert ctx.options == context().options  # the shared context's options untouched


def test_dlnet_options_values_take_the_fields_types():
    """DLNET_OPTIONS values are literals converted to each field's type: tune=1 is the string the tuner compares,
    a list a tuple; a value of the wrong kind is an error naming the field."""
    o = Options().parse("tune=1,tf32_fp32_k=[0,0],dw_cpu_pad_in=0,tf32_huge_fill=2,gemv_mma=None")
    assert (o.tune, o.tf32_fp32_k, o.dw_cpu_pad_in, o.tf32_huge_fill, o.gemv_mma) == ("1", (0, 0), False, 2.0, None)
    for bad in ("winograd_min_channels=abc", "winograd_min_channels=1.5", "dw_cpu_pad_in=2", "tf32_fp32_k=3"):
        with pytest.raises(dlnet.DeviceError, match=bad.split("=")[0]):
            Options().parse(bad)
