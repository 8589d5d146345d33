"""CumProd-26, SwiGLU-28, TensorScatter-24, DFT-17/20, STFT-17, MelWeightMatrix-17 and the string ops of op-set 20
(StringConcat, StringSplit, RegexFullMatch) against onnx.reference on fresh random inputs."""
import numpy as np
import pytest
from onnx import TensorProto, helper

import dlnet
from tests.conftest import make_model, reference, rel_l2

RNG = np.random.default_rng()


def _model(nodes, inputs, outputs, opset, consts=None):
    model = make_model(nodes, inputs, outputs, consts or {}, opset=opset)
    for o in model.graph.output:
        o.type.tensor_type.elem_type = 0
    return model


def _same(ctx, model, feeds, tol=1e-5):
    got = list(dlnet.Net(ctx).load_onnx(model).run(feeds).values())
    want = reference(model, feeds)
    for y, w in zip(got, want):
        assert y.shape == w.shape and y.dtype == w.dtype
        if w.dtype.kind == "f":
            assert rel_l2(y, w) < tol, rel_l2(y, w)
        else:
            assert y.tolist() == w.tolist()


@pytest.mark.parametrize("dtype", ["float32", "int32"])
@pytest.mark.parametrize("reverse,exclusive", [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_cumprod(ctx, dtype, reverse, exclusive):
    shape = (3, 4, 5)
    axis = int(RNG.integers(-3, 3))
    x = (RNG.uniform(0.5, 1.5, shape) if dtype == "float32" else RNG.integers(-3, 4, shape)).astype(dtype)
    model = _model([helper.make_node("CumProd", ["x", "axis"], ["y"], reverse=reverse, exclusive=exclusive)],
                   {"x": (dtype, shape), "axis": ("int64", [])}, ["y"], 26)
    _same(ctx, model, {"x": x, "axis": np.array(axis, np.int64)})


def test_swiglu(ctx):
    alpha = float(RNG.uniform(0.5, 2))
    model = _model([helper.make_node("SwiGLU", ["a", "b"], ["y"], alpha=alpha)],
                   {"a": ("float32", [4, 6]), "b": ("float32", [4, 6])}, ["y"], 28)
    _same(ctx, model, {"a": RNG.standard_normal((4, 6)).astype(np.float32),
                       "b": RNG.standard_normal((4, 6)).astype(np.float32)})


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter(ctx, mode):
    past, upd = (3, 2, 6, 4), (3, 2, 3, 4)
    model = _model([helper.make_node("TensorScatter", ["past", "upd", "w"], ["y"], mode=mode, axis=2)],
                   {"past": ("float32", past), "upd": ("float32", upd), "w": ("int64", [3])}, ["y"], 24)
    high = 6 if mode == "circular" else 4  # linear: the update must fit
    for _ in range(2):
        _same(ctx, model, {"past": RNG.standard_normal(past).astype(np.float32),
                           "upd": RNG.standard_normal(upd).astype(np.float32),
                           "w": RNG.integers(0, high, 3).astype(np.int64)})


@pytest.mark.parametrize("opset", [17, 20])
@pytest.mark.parametrize("inverse,onesided,channels,length", [
    (0, 0, 1, None), (0, 0, 2, 9), (0, 1, 1, 12), (1, 0, 2, None), (1, 0, 2, 5), (1, 1, 2, None), (1, 1, 2, 7)])
def test_dft(ctx, opset, inverse, onesided, channels, length):
    shape = (2, 6, 3, channels)
    axis = 1 if opset == 17 else int(RNG.choice([1, -3]))
    inputs = {"x": ("float32", shape)}
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32)}
    names = ["x", ""]
    if length is not None:
        names[1] = "n"
        inputs["n"] = ("int64", [])
        feeds["n"] = np.array(length, np.int64)
    attrs = {"inverse": inverse, "onesided": onesided}
    if opset == 17:
        attrs["axis"] = axis
    else:
        names.append("axis")
        inputs["axis"] = ("int64", [])
        feeds["axis"] = np.array(axis, np.int64)
    model = _model([helper.make_node("DFT", names, ["y"], **attrs)], inputs, ["y"], opset)
    _same(ctx, model, feeds, tol=1e-5)


@pytest.mark.parametrize("window,length", [(False, 16), (True, None), (True, 20)])
def test_stft(ctx, window, length):
    signal = RNG.standard_normal((2, 100, 1)).astype(np.float32)
    names, inputs = ["s", "step"], {"s": ("float32", [2, 100, 1]), "step": ("int64", [])}
    feeds = {"s": signal, "step": np.array(int(RNG.integers(5, 9)), np.int64)}
    names.append("w" if window else "")
    if window:
        inputs["w"] = ("float32", [16])
        feeds["w"] = RNG.uniform(0, 1, 16).astype(np.float32)
    if length is not None:
        names.append("len")
        inputs["len"] = ("int64", [])
        feeds["len"] = np.array(length, np.int64)
    model = _model([helper.make_node("STFT", names, ["y"])], inputs, ["y"], 17)
    _same(ctx, model, feeds, tol=1e-5)


def test_mel_weight_matrix(ctx):
    names = ["mels", "n", "rate", "low", "high"]
    model = _model([helper.make_node("MelWeightMatrix", names, ["y"], output_datatype=TensorProto.FLOAT)],
                   {"mels": ("int64", []), "n": ("int64", []), "rate": ("int64", []), "low": ("float32", []),
                    "high": ("float32", [])}, ["y"], 17)
    feeds = {"mels": np.array(int(RNG.integers(4, 12)), np.int64), "n": np.array(int(RNG.integers(32, 80)), np.int64),
             "rate": np.array(16000, np.int64), "low": np.array(RNG.uniform(0, 300), np.float32),
             "high": np.array(RNG.uniform(4000, 8000), np.float32)}
    _same(ctx, model, feeds, tol=1e-6)


def _words(n):
    letters = np.array(list("ab .-@xy"))
    return np.array(["".join(RNG.choice(letters, int(RNG.integers(0, 9)))) for _ in range(n)], object)


def _string_model(node, shapes, opset=20):
    inputs = [helper.make_tensor_value_info(f"x{k}", TensorProto.STRING, s) for k, s in enumerate(shapes)]
    outputs = [helper.make_tensor_value_info(o, 0, None) for o in node.output]
    graph = helper.make_graph([node], "strings", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


@pytest.mark.parametrize("attrs", [{}, {"delimiter": "."}, {"delimiter": " ", "maxsplit": 1}, {"delimiter": "-"}])
def test_string_split(ctx, attrs):
    model = _string_model(helper.make_node("StringSplit", ["x0"], ["y", "n"], **attrs), [[2, 3]])
    _same(ctx, model, {"x0": _words(6).reshape(2, 3)})


def test_string_concat_and_regex(ctx):
    model = _string_model(helper.make_node("StringConcat", ["x0", "x1"], ["y"]), [[2, 3], [3]])
    _same(ctx, model, {"x0": _words(6).reshape(2, 3), "x1": _words(3)})
    model = _string_model(helper.make_node("RegexFullMatch", ["x0"], ["y"], pattern=r"[ab]+(\.|-)?[xy]*"), [[11]])
    _same(ctx, model, {"x0": np.concatenate([_words(8), np.array(["ab.xy", "b-", "a"], object)])})


def test_optional_tensor_input_and_optional_ops(ctx):
    """An optional(tensor) graph input is fed as its tensor: it holds a value; a missing input holds none."""
    opt = helper.make_value_info("o", helper.make_optional_type_proto(
        helper.make_tensor_type_proto(TensorProto.FLOAT, [2, 3])))
    nodes = [helper.make_node("OptionalHasElement", ["o"], ["has"]),
             helper.make_node("OptionalHasElement", [], ["none"]),
             helper.make_node("OptionalGetElement", ["o"], ["got"]),
             helper.make_node("Neg", ["got"], ["y"])]
    outs = [helper.make_tensor_value_info(n, 0, None) for n in ("has", "none", "y")]
    model = helper.make_model(helper.make_graph(nodes, "optional", [opt], outs),
                              opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    has, none, y = dlnet.Net(ctx).load_onnx(model).run({"o": x}).values()
    assert has.dtype == bool and has.shape == () and bool(has) and not bool(none)
    assert rel_l2(y, -x) < 1e-7
