"""NaN and +-Inf propagate through the kernels as IEEE 754 says: a NaN in is a NaN out wherever it is read (Relu,
clamps, Conv epilogues, pooling and reductions included; OpenCL's max/min/clamp would drop it).

Elementwise ops, Softmax, averaging pools and Conv are compared with onnxruntime. For max/min pooling and
reductions, IEEE 754-2019's maximum/minimum (any NaN in the window gives NaN, as numpy and PyTorch do) is the
reference: onnxruntime's CPU MaxPool and ReduceMax return a NaN or not depending on where it sits in the window."""
import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view
from onnx import helper

import dlnet
from tests.conftest import make_model

SHAPE = [2, 3, 20, 20]  # wide enough for the CPU pools' eight-column path


def _poisoned(rng, shape):
    """Fresh normal values with about 5% NaN, 3% +Inf and 3% -Inf at random places."""
    x = rng.standard_normal(shape).astype(np.float32)
    u = rng.random(shape)
    x[u < 0.05] = np.nan
    x[(u >= 0.05) & (u < 0.08)] = np.inf
    x[(u >= 0.08) & (u < 0.11)] = -np.inf
    return x


def _ort(model, x):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(["y"], {"x": x})[0]


def _same(got, want):
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want))
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=2e-5, atol=2e-5)


def _w(shape, seed=7):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


ORT_CASES = {
    "Relu": ([("Relu", ["x"], {})], {}),
    "LeakyRelu": ([("LeakyRelu", ["x"], {"alpha": 0.1})], {}),
    "Sigmoid": ([("Sigmoid", ["x"], {})], {}),
    "HardSigmoid": ([("HardSigmoid", ["x"], {})], {}),
    "Sign": ([("Sign", ["x"], {})], {}),
    "Celu": ([("Celu", ["x"], {})], {}),
    "Clip": ([("Clip", ["x", "lo", "hi"], {})], {"lo": np.float32(-0.5), "hi": np.float32(0.5)}),
    "Max": ([("Max", ["x", "c"], {})], {"c": "poisoned"}),
    "Min": ([("Min", ["c", "x"], {})], {"c": "poisoned"}),
    "Softmax": ([("Softmax", ["x"], {"axis": -1})], {}),
    "AveragePool": ([("AveragePool", ["x"], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]})], {}),
    "GlobalAveragePool": ([("GlobalAveragePool", ["x"], {})], {}),
    "Conv": ([("Conv", ["x", "w"], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]})], {"w": _w((4, 3, 3, 3))}),
    "Conv+Relu": ([("Conv", ["x", "w"], {"kernel_shape": [3, 3]}), ("Relu", [], {})], {"w": _w((4, 3, 3, 3))}),
    "Conv1x1+Clip": ([("Conv", ["x", "w", "b"], {}), ("Clip", ["lo", "hi"], {})],
                     {"w": _w((5, 3, 1, 1)), "b": _w(5), "lo": np.float32(0), "hi": np.float32(6)}),
}


def _model(steps, inits, rng):
    nodes, prev = [], "x"
    for k, (op, ins, attrs) in enumerate(steps):
        out = "y" if k == len(steps) - 1 else f"t{k}"
        ins = ins if k == 0 else [prev] + ins
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        prev = out
    inits = {k: _poisoned(rng, SHAPE) if isinstance(v, str) else np.asarray(v) for k, v in inits.items()}
    return make_model(nodes, {"x": ("float32", SHAPE)}, ["y"], inits)


@pytest.mark.parametrize("name", sorted(ORT_CASES))
def test_nan_and_inf_as_onnxruntime(ctx, name):
    rng = np.random.default_rng()
    model = _model(*ORT_CASES[name], rng)
    x = _poisoned(rng, SHAPE)
    got = dlnet.Net(ctx).load_onnx(model).run({"x": x})["y"]
    want = _ort(model, x)
    assert np.isnan(want).any()
    _same(got, want)


def _pool(x, k, s, pad, fn):
    xp = np.pad(x, [(0, 0), (0, 0), (pad, pad), (pad, pad)], constant_values=-np.inf)
    return fn(sliding_window_view(xp, (k, k), axis=(2, 3))[:, :, ::s, ::s], axis=(-2, -1))


IEEE_CASES = {  # op, attrs, reference (numpy's max and min propagate NaN)
    "MaxPool2x2s2": ("MaxPool", {"kernel_shape": [2, 2], "strides": [2, 2]}, lambda x: _pool(x, 2, 2, 0, np.max)),
    "MaxPool3x3s1p1": ("MaxPool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, lambda x: _pool(x, 3, 1, 1, np.max)),
    "GlobalMaxPool": ("GlobalMaxPool", {}, lambda x: x.max(axis=(2, 3), keepdims=True)),
    "ReduceMax": ("ReduceMax", {"axes": [2, 3]}, lambda x: x.max(axis=(2, 3), keepdims=True)),
    "ReduceMin": ("ReduceMin", {"axes": [1]}, lambda x: x.min(axis=1, keepdims=True)),
    "ReduceMaxAll": ("ReduceMax", {"keepdims": 0}, lambda x: x.max()),
}


@pytest.mark.parametrize("name", sorted(IEEE_CASES))
def test_nan_and_inf_in_max_and_min_reductions(ctx, name):
    op, attrs, reference = IEEE_CASES[name]
    rng = np.random.default_rng()
    x = _poisoned(rng, SHAPE)
    rest = x[:, 1:]
    rest[np.isnan(rest)] = 0.5  # NaN in channel 0 only: whole-plane reductions have NaN and numbers
    if name == "ReduceMaxAll":  # one output: a NaN-free input, to see +Inf win
        x[np.isnan(x)] = 1
    model = make_model([helper.make_node(op, ["x"], ["y"], **attrs)], {"x": ("float32", SHAPE)}, ["y"])
    got = dlnet.Net(ctx).load_onnx(model).run({"x": x})["y"]
    want = reference(x)
    if name != "ReduceMaxAll":
        assert np.isnan(want).any() and not np.isnan(want).all()
    _same(got, np.asarray(want, np.float32))
