"""Host steps: nodes whose output shapes are their input values (NonZero, Compress, Unique, NonMaxSuppression) or
that read strings (StringNormalizer) run on the host between device graphs; TfIdfVectorizer composes device ops.
Each against onnx.reference or onnxruntime on fresh random inputs."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import dlnet
from dlnet.graph.ir import Builder, Graph
from tests.conftest import make_model, reference, rel_l2


def _ort(model, feeds):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def test_nonzero_and_unique_between_device_graphs(ctx):
    """Relu on the device, NonZero on the host, a device graph planned for its count, Unique on the host, Neg."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("NonZero", ["r"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["t"]),
             helper.make_node("Cast", ["t"], ["tf"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["tf"], ["s"], keepdims=1),
             helper.make_node("Add", ["s", "r"], ["y"]),
             # Unique on a 1-D input: onnx.reference's sorted=0 path indexes a multi-dimensional input wrongly
             helper.make_node("Reshape", ["x", "flat"], ["xf"]),
             helper.make_node("Unique", ["xf"], ["u", "first", "inverse", "counts"], sorted=0),
             helper.make_node("Neg", ["u"], ["nu"])]
    model = make_model(nodes, {"x": ("float32", [5, 6])}, ["y", "nu", "first", "inverse", "counts", "nz"],
                       {"flat": np.array([-1], np.int64)})
    net = dlnet.Net(ctx).load_onnx(model)
    assert "stops before ONNX node #1" in str(net.graph) and "NonZero" in str(net.graph)
    rng = np.random.default_rng()
    counts = set()
    for _ in range(4):
        x = np.round(rng.standard_normal((5, 6)) * 2).astype(np.float32)  # repeats and zeros: both ops matter
        got = list(net.run({"x": x}).values())
        want = reference(model, {"x": x})
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            assert rel_l2(g, w) < 1e-6
        counts.add(int(np.count_nonzero(np.maximum(x, 0))))
    (plan,) = net.plans.values()
    assert len(plan.rest) == len(counts)  # the rest is planned once per run-time shape
    net.release()


@pytest.mark.parametrize("axis", [None, 1])
def test_compress_with_a_runtime_condition(ctx, axis):
    nodes = [helper.make_node("Greater", ["c", "zero"], ["cond"]),
             helper.make_node("Compress", ["x", "cond"], ["k"], **({} if axis is None else {"axis": axis})),
             helper.make_node("Mul", ["k", "k"], ["y"])]
    n = 12 if axis is None else 4
    model = make_model(nodes, {"x": ("float32", [3, 4]), "c": ("float32", [n])}, ["y"],
                       {"zero": np.zeros(1, np.float32)})
    net = dlnet.Net(ctx).load_onnx(model)
    rng = np.random.default_rng()
    for _ in range(3):
        feeds = {"x": rng.standard_normal((3, 4)).astype(np.float32), "c": rng.standard_normal(n).astype(np.float32)}
        (y,) = net.run(feeds).values()
        (want,) = reference(model, feeds)
        assert y.shape == want.shape and rel_l2(y, want) < 1e-6
    net.release()


@pytest.mark.parametrize("center", [0, 1])
def test_non_max_suppression_against_onnxruntime(ctx, center):
    b, c, n = 2, 3, 40
    nodes = [helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "score"], ["sel"],
                              center_point_box=center)]
    inputs = {"boxes": ("float32", [b, n, 4]), "scores": ("float32", [b, c, n]), "max_out": ("int64", [1]),
              "iou": ("float32", [1]), "score": ("float32", [1])}
    model = make_model(nodes, inputs, ["sel"], opset=11)
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.INT64
    net = dlnet.Net(ctx).load_onnx(model)
    rng = np.random.default_rng()
    for limit in (3, 100):
        corner = rng.uniform(0, 10, (b, n, 2))
        size = rng.uniform(0.5, 4, (b, n, 2))
        if center:
            boxes = np.concatenate([corner, size], axis=2)
        else:  # [y1, x1, y2, x2], corners in either order
            boxes = np.concatenate([corner, corner + size], axis=2)
            boxes[:, ::2] = boxes[:, ::2][..., [2, 3, 0, 1]]
        feeds = {"boxes": boxes.astype(np.float32), "scores": rng.uniform(0, 1, (b, c, n)).astype(np.float32),
                 "max_out": np.array([limit], np.int64), "iou": np.array([0.3], np.float32),
                 "score": np.array([0.2], np.float32)}
        (sel,) = net.run(feeds).values()
        (want,) = _ort(model, feeds)
        assert sel.dtype == np.int64 and 0 < len(sel) and np.array_equal(sel, want)
    net.release()


def _string_model(attrs, shape):
    # locale: onnxruntime builds the model's locale (default en_US.UTF-8, often not installed); C.UTF-8 always is
    node = helper.make_node("StringNormalizer", ["x"], ["y"], locale="C.UTF-8", **attrs)
    graph = helper.make_graph([node], "strings", [helper.make_tensor_value_info("x", TensorProto.STRING, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.STRING, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)], ir_version=7)


@pytest.mark.parametrize("attrs", [
    {"case_change_action": "LOWER", "stopwords": ["MONDAY", "the"]},
    {"case_change_action": "UPPER", "is_case_sensitive": 1, "stopwords": ["Monday", "the"]},
    {"stopwords": ["monday"]},
    {"case_change_action": "UPPER", "stopwords": ["monday", "tuesday", "friday", "The", "Été"]}])
def test_string_normalizer_against_onnxruntime(ctx, attrs):
    words = np.array(["Monday", "tuesday", "MONDAY", "the", "Été", "friday", "déjà vu"], object)
    rng = np.random.default_rng()
    for shape in ([7], [1, 7]):
        x = rng.permutation(words).reshape(shape)
        model = _string_model(attrs, shape)
        (y,) = dlnet.Net(ctx).load_onnx(model).run({"x": x}).values()
        (want,) = _ort(model, {"x": x})
        assert y.dtype == object and y.shape == want.shape and y.tolist() == want.tolist()


def test_string_normalizer_takes_numpy_str_arrays_and_gives_one_empty_string_when_nothing_is_left(ctx):
    model = _string_model({"stopwords": ["a", "b"]}, [3])
    (y,) = dlnet.Net(ctx).load_onnx(model).run({"x": np.array(["A", "b", "a"])}).values()
    assert y.dtype == object and y.tolist() == [""]


@pytest.mark.parametrize("mode,weights", [("TF", None), ("IDF", None), ("IDF", True), ("TFIDF", True)])
@pytest.mark.parametrize("rank", [1, 2])
def test_tfidf_vectorizer_against_the_reference(ctx, mode, weights, rank):
    rng = np.random.default_rng()
    unigrams = rng.permutation(6)[:4]
    bigrams = rng.integers(0, 6, (5, 2))
    trigrams = rng.integers(0, 6, (2, 3))
    pool = np.concatenate([unigrams, bigrams.reshape(-1), trigrams.reshape(-1)]).astype(np.int64)
    n_grams = 4 + 5 + 2
    indexes = rng.permutation(n_grams + 2)[:n_grams]  # a sparse, shuffled output layout
    attrs = {"mode": mode, "min_gram_length": 1, "max_gram_length": 3, "max_skip_count": 2,
             "ngram_counts": [0, 4, 14], "ngram_indexes": indexes.tolist(), "pool_int64s": pool.tolist()}
    if weights:
        attrs["weights"] = rng.uniform(0.5, 2, int(indexes.max()) + 1).tolist()
    shape = [9] if rank == 1 else [3, 9]
    model = make_model([helper.make_node("TfIdfVectorizer", ["x"], ["y"], **attrs)], {"x": ("int32", shape)}, ["y"],
                       opset=9)
    net = dlnet.Net(ctx).load_onnx(model)
    x = rng.integers(0, 6, shape).astype(np.int32)
    (y,) = net.run({"x": x}).values()
    if mode == "IDF" and not weights:  # onnx.reference fails without weights; IDF is then 1 where TF counts > 0
        attrs["mode"] = "TF"
        tf = make_model([helper.make_node("TfIdfVectorizer", ["x"], ["y"], **attrs)], {"x": ("int32", shape)},
                        ["y"], opset=9)
        want = (reference(tf, {"x": x})[0] > 0).astype(np.float32)
    else:
        (want,) = reference(model, {"x": x})
    assert y.shape == want.shape and np.abs(want).sum() > 0 and rel_l2(y, want) < 1e-6
    net.release()


def test_training_graph_names_the_host_node():
    g = Graph()
    x = g.add_input("x", "float32", (4,))
    with pytest.raises(dlnet.ModelError, match=r"node nz \(NonZero\) has output shapes that depend on its input"):
        b = Builder(g, "m.onnx")
        b.node_name = "nz"
        b.op("NonZero", [x])


def test_host_op_with_constant_input_folds_at_load(ctx):
    x = np.array([[0, 3], [2, 0]], np.int64)
    model = make_model([helper.make_node("NonZero", ["c"], ["nz"]), helper.make_node("Add", ["nz", "x"], ["y"])],
                       {"x": ("int64", [2, 2])}, ["y"], {"c": x})
    net = dlnet.Net(ctx).load_onnx(model)
    assert "stops before" not in str(net.graph)
    (y,) = net.run({"x": np.ones((2, 2), np.int64)}).values()
    np.testing.assert_array_equal(y, np.array(np.nonzero(x)) + 1)


def test_onnx_string_dtype_is_listed_in_errors():
    from dlnet.onnx.importer import onnx_dtype
    with pytest.raises(dlnet.ModelError, match="string"):
        onnx_dtype(onnx.TensorProto.COMPLEX64)
