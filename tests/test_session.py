"""dlnet.InferenceSession against onnxruntime's (the interface and the values), Net.run's choice of outputs, close()
and context managers on Net and Trainer, any batch on a net loaded with one, and the bounded plan cache."""
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dlnet
from tests.conftest import rel_l2

ort = pytest.importorskip("onnxruntime")


def _model(nodes, inputs, outputs, inits=(), opset=13):
    """inputs/outputs: [(name, TensorProto type, shape or None)]; inits: {name: array}."""
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs],
                              [numpy_helper.from_array(np.asarray(v), n) for n, v in dict(inits).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def cnn():
    """Conv -> Relu -> MaxPool -> Flatten -> Gemm -> Softmax over a symbolic batch; declared output shape."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fw", "fb"], ["l"], transB=1),
             helper.make_node("Softmax", ["l"], ["probs"], axis=1)]
    inits = {"w": rng.standard_normal((4, 3, 3, 3)).astype(np.float32) * 0.3,
             "b": rng.standard_normal(4).astype(np.float32),
             "fw": rng.standard_normal((5, 4 * 4 * 4)).astype(np.float32) * 0.2,
             "fb": rng.standard_normal(5).astype(np.float32)}
    return _model(nodes, [("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
                  [("probs", TensorProto.FLOAT, ["batch", 5])], inits)


def multi():
    """Three outputs (one int64, one with no declared shape), symbolic dims of two names, a dim with no name."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("MatMul", ["a", "w"], ["h"]),
             helper.make_node("Tanh", ["h"], ["hidden"]),
             helper.make_node("MatMul", ["hidden", "w2"], ["s"]),
             helper.make_node("Add", ["s", "k"], ["scores"]),
             helper.make_node("ArgMax", ["scores"], ["best"], axis=-1, keepdims=0)]
    inits = {"w": rng.standard_normal((6, 16)).astype(np.float32),
             "w2": rng.standard_normal((16, 4)).astype(np.float32)}
    return _model(nodes, [("a", TensorProto.FLOAT, ["N", "T", 6]), ("k", TensorProto.FLOAT, [None, 1, 4])],
                  [("scores", TensorProto.FLOAT, ["N", "T", 4]), ("best", TensorProto.INT64, None),
                   ("hidden", TensorProto.FLOAT, ["N", "T", 16])], inits)


def feeds_for(name, rng, n=3):
    if name == "cnn":
        return {"x": rng.standard_normal((n, 3, 8, 8)).astype(np.float32)}
    return {"a": rng.standard_normal((n, 5, 6)).astype(np.float32),
            "k": rng.standard_normal((n, 1, 4)).astype(np.float32)}


def passthrough():
    """An output with no declared type whose first dim onnx cannot name (onnxruntime: None)."""
    return _model([helper.make_node("Identity", ["ids"], ["same"]), helper.make_node("Cast", ["ids"], ["f"], to=1)],
                  [("ids", TensorProto.INT64, [None, 2])], [("same", TensorProto.INT64, None),
                                                             ("f", TensorProto.FLOAT, None)])


MODELS = {"cnn": cnn, "multi": multi, "passthrough": passthrough}

# Written exactly as an onnxruntime user writes it; the dlnet run changes nothing but the import.
SNIPPET = """
from onnxruntime import InferenceSession
sess = InferenceSession(model_bytes, providers=["CPUExecutionProvider"])
feeds = {i.name: arrays[k] for k, i in enumerate(sess.get_inputs())}
first = sess.run(None, feeds)
last = sess.run([sess.get_outputs()[-1].name], feeds)
"""


@pytest.mark.parametrize("name", ["cnn", "multi", "digits"])
def test_onnxruntime_code_runs_on_dlnet_by_changing_the_import(name):
    model_bytes = (open("models/digits.onnx", "rb").read() if name == "digits"
                   else MODELS[name]().SerializeToString())
    rng = np.random.default_rng(5)
    arrays = (list(feeds_for(name, rng).values()) if name != "digits"
              else [rng.standard_normal((2, 1, 16, 16)).astype(np.float32)])
    theirs, ours = {"model_bytes": model_bytes, "arrays": arrays}, {"model_bytes": model_bytes, "arrays": arrays}
    exec(SNIPPET, theirs)
    exec(SNIPPET.replace("from onnxruntime import", "from dlnet import"), ours)
    assert isinstance(ours["sess"], dlnet.InferenceSession)
    assert ours["sess"].get_providers() == theirs["sess"].get_providers() == ["CPUExecutionProvider"]
    assert ours["sess"].device.type == "CPU"
    for key in ("first", "last"):
        assert len(ours[key]) == len(theirs[key])
        for got, want in zip(ours[key], theirs[key]):
            assert got.dtype == want.dtype and got.shape == want.shape
            assert rel_l2(got, want) <= 1e-5
    ours["sess"].close()


@pytest.mark.parametrize("name", ["cnn", "multi", "passthrough", "digits"])
def test_inputs_and_outputs_described_as_onnxruntime_does(ctx, name):
    model = onnx.load("models/digits.onnx") if name == "digits" else MODELS[name]()
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ours = dlnet.InferenceSession(model, providers=[ctx])

    def described(args):
        return [(a.name, a.shape, a.type) for a in args]

    assert described(ours.get_inputs()) == described(theirs.get_inputs())
    assert described(ours.get_outputs()) == described(theirs.get_outputs())
    if name == "multi":  # (what the comparison covers: names, None, an int64 output, an inferred shape)
        assert described(ours.get_outputs())[1] == ("best", ["N", "T"], "tensor(int64)")
        assert ours.get_inputs()[1].shape == [None, 1, 4]
    if name == "passthrough":
        assert described(ours.get_outputs()) == [("same", [None, 2], "tensor(int64)"),
                                                 ("f", [None, 2], "tensor(float)")]
    assert ours.get_modelmeta().graph_name == theirs.get_modelmeta().graph_name
    ours.close()


def test_run_returns_the_outputs_asked_in_their_order(ctx):
    model = multi()
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ours = dlnet.InferenceSession(model.SerializeToString(), providers=[ctx])
    feeds = feeds_for("multi", np.random.default_rng(7), n=2)
    for names in (None, [], ["hidden", "scores"], ["best"], ["scores", "best", "hidden"], ["best", "hidden", "best"]):
        got, want = ours.run(names, feeds), theirs.run(names, feeds)
        assert len(got) == len(want) == (len(names) if names else 3)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            assert rel_l2(g, w) <= 1e-5 if g.dtype.kind == "f" else (g == w).all()
    with pytest.raises(dlnet.InputError, match="invalid output name 'nope'.*'scores', 'best', 'hidden'"):
        ours.run(["nope"], feeds)
    with pytest.raises(dlnet.InputError, match="dtype float64, expected float32"):
        ours.run(None, {k: v.astype(np.float64) for k, v in feeds.items()})


def test_chosen_outputs_plan_only_their_work(ctx):
    net = dlnet.Net(ctx).load_onnx(multi())
    feeds = feeds_for("multi", np.random.default_rng(8), n=2)
    full = net.run(feeds)
    assert list(full) == ["scores", "best", "hidden"]
    every = net._last
    hidden = net.run(feeds, outputs=["hidden"])
    assert list(hidden) == ["hidden"] and rel_l2(hidden["hidden"], full["hidden"]) <= 1e-6
    plan = net._last
    assert plan is not every and plan.graph.output_names == ["hidden"]  # only it is copied back
    ops = [[n.op for n in p.graph.nodes if n.op != "Reshape"] for p in (every, plan)]  # (views around the products)
    assert ops[0] == ["Gemm", "Gemm", "Add", "ArgReduce"]
    assert ops[1] == ["Gemm"]  # MatMul + Tanh: no second MatMul, no Add, no ArgMax
    assert plan.memory.const_bytes < every.memory.const_bytes  # w2 is not even uploaded
    both = net.run(feeds, outputs=["best", "scores"])
    assert list(both) == ["best", "scores"]
    np.testing.assert_array_equal(both["best"], full["best"])
    assert net.run(feeds, outputs=["hidden", "scores", "best"]) is not None and net._last is every  # all: the full plan
    with pytest.raises(dlnet.InputError, match="unknown output 'logits'"):
        net.run(feeds, outputs=["logits"])


def test_providers_map_to_devices_and_fall_back_with_a_warning(ctx):
    model = cnn().SerializeToString()
    has_gpu = any(d.type == "GPU" for d in dlnet.devices())
    if has_gpu:
        sess = dlnet.InferenceSession(model, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
        assert sess.device.type == "GPU" and sess.get_providers() == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    else:
        with pytest.warns(UserWarning, match="'CUDAExecutionProvider' is not in available provider names"):
            sess = dlnet.InferenceSession(model, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
        assert sess.device.type == "CPU" and sess.get_providers() == ["CPUExecutionProvider"]
    with pytest.warns(UserWarning, match="'FooExecutionProvider' is not in available"):
        assert dlnet.InferenceSession(model, providers=["FooExecutionProvider"]).device.type == "CPU"
    assert dlnet.InferenceSession(model, providers=["cpu"]).device.type == "CPU"
    assert dlnet.InferenceSession(model, providers=ctx).net.ctx is ctx
    assert "CPUExecutionProvider" in dlnet.get_available_providers()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a provider that exists: no warning
        dlnet.InferenceSession(model, providers=[("CPUExecutionProvider", {})])


def test_session_loads_a_path_and_refuses_bad_bytes_briefly(ctx, tmp_path):
    import pathlib
    path = tmp_path / "m.onnx"
    path.write_bytes(cnn().SerializeToString())
    sess = dlnet.InferenceSession(pathlib.Path(path), providers=[ctx])
    assert sess.net.path == str(path)
    with pytest.raises(dlnet.ModelError, match="not an ONNX model") as e:
        dlnet.InferenceSession(b"\x01\x02not onnx" * 1000, providers=[ctx])
    assert len(str(e.value)) < 300


def test_close_releases_memory_and_is_final(ctx):
    before = ctx.allocated_bytes
    x = np.random.default_rng(3).standard_normal((2, 3, 8, 8)).astype(np.float32)
    with dlnet.Net(ctx).load_onnx(cnn()) as net:
        want = net.run({"x": x})["probs"]
        assert ctx.allocated_bytes > before
    assert net.closed and ctx.allocated_bytes == before and not net.plans
    net.close()  # idempotent
    with pytest.raises(dlnet.InputError, match="this Net is closed"):
        net.run({"x": x})
    with pytest.raises(dlnet.InputError, match="this Net is closed"):
        net.input_array("x", (2, 3, 8, 8))
    with pytest.raises(dlnet.InputError, match="this Net is closed"):
        dlnet.Trainer(net)
    with dlnet.InferenceSession(net.model, providers=[ctx]) as sess:  # the model stays on the host
        assert rel_l2(sess.run(None, {"x": x})[0], want) <= 1e-6
    assert ctx.allocated_bytes == before
    with pytest.raises(dlnet.InputError, match="closed"):
        sess.run(None, {"x": x})


def _train_feeds(rng, n):
    return {"x": rng.standard_normal((n, 3, 8, 8)).astype(np.float32), "target": rng.integers(0, 5, n)}


def test_trainer_close_keeps_the_trained_weights_and_frees_its_memory(ctx):
    rng = np.random.default_rng(4)
    batches = [_train_feeds(rng, 4) for _ in range(3)]
    same = dlnet.Net(ctx).load_onnx(cnn(), batch=4)  # the same training, its weights read while it is open
    start = same.state_dict()["fw"]
    trainer = dlnet.Trainer(same, optimizer=dlnet.optim.SGD(lr=0.5))
    for feeds in batches:
        trainer.step(feeds)
    trained = same.state_dict()["fw"]
    same.close()
    assert rel_l2(trained, start) > 1e-3
    before = ctx.allocated_bytes
    net = dlnet.Net(ctx).load_onnx(cnn(), batch=4)
    with dlnet.Trainer(net, optimizer=dlnet.optim.SGD(lr=0.5)) as trainer:
        for feeds in batches:
            trainer.step(feeds)
    assert trainer.closed
    np.testing.assert_array_equal(net.state_dict()["fw"], trained)  # close() copied the device weights back first
    with pytest.raises(dlnet.InputError, match="this Trainer is closed"):
        trainer.step(_train_feeds(rng, 4))
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    want = ort.InferenceSession(net.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert rel_l2(net.run({"x": x})["probs"], want[0]) <= 1e-5  # the net runs on, with the trained weights
    trainer2 = dlnet.Trainer(net)
    trainer2.step(_train_feeds(rng, 4))
    net.close()  # closes its trainer too
    assert trainer2.closed and ctx.allocated_bytes == before
    trainer2.close()


def test_net_loaded_with_a_batch_runs_any_batch(ctx):
    model = cnn()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    net = dlnet.Net(ctx).load_onnx(model, batch=4)
    assert list(net.plans) == [((4, 3, 8, 8),)]  # planned at load
    assert net.input_array("x").shape == (4, 3, 8, 8)  # the batch given at load stays the default
    rng = np.random.default_rng(6)
    for n in (1, 7, 4):
        x = rng.standard_normal((n, 3, 8, 8)).astype(np.float32)
        got = net.run({"x": x})["probs"]
        assert got.shape == (n, 5) and rel_l2(got, ref.run(None, {"x": x})[0]) <= 1e-5
    assert list(net.plans) == [((1, 3, 8, 8),), ((7, 3, 8, 8),), ((4, 3, 8, 8),)]
    add = _model([helper.make_node("Add", ["x", "y"], ["z"])], [("x", TensorProto.FLOAT, ["N", 3]),
                 ("y", TensorProto.FLOAT, ["N", 3])], [("z", TensorProto.FLOAT, ["N", 3])])
    two = dlnet.Net(ctx).load_onnx(add, batch=2)
    x, y = rng.standard_normal((2, 2, 3)).astype(np.float32)
    np.testing.assert_array_equal(two.run({"x": x[:1], "y": y[:1]})["z"], x[:1] + y[:1])
    with pytest.raises(dlnet.InputError, match="dimension 'N' is 1 in one input and 2 in 'y'"):
        two.run({"x": x[:1], "y": y})  # the feeds still agree with each other


def test_trained_net_infers_at_other_batches(ctx):
    rng = np.random.default_rng(9)
    net = dlnet.Net(ctx).load_onnx(cnn(), batch=4)
    trainer = dlnet.Trainer(net, optimizer=dlnet.optim.SGD(lr=0.5))
    trainer.step(_train_feeds(rng, 4))
    trainer.sync()
    ref = ort.InferenceSession(net.model.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (1, 7):
        x = rng.standard_normal((n, 3, 8, 8)).astype(np.float32)
        assert rel_l2(net.run({"x": x})["probs"], ref.run(None, {"x": x})[0]) <= 1e-5
    assert trainer.evaluate(_train_feeds(rng, 5))["loss"] > 0  # a batch of 5 evaluated too
    net.close()


def test_plan_cache_keeps_the_last_shapes_and_releases_the_rest(ctx):
    assert dlnet.Net(ctx).max_plans == 8
    before = ctx.allocated_bytes
    net = dlnet.Net(ctx, max_plans=2).load_onnx(cnn())
    rng = np.random.default_rng(10)
    xs = {n: rng.standard_normal((n, 3, 8, 8)).astype(np.float32) for n in (1, 2, 3)}
    ref = ort.InferenceSession(cnn().SerializeToString(), providers=["CPUExecutionProvider"])
    plans = {}
    for n in (1, 2, 3):
        net.run({"x": xs[n]})
        plans[n] = net._last
    assert [k[0][0] for k in net.plans] == [2, 3]
    assert plans[1].act_buf is None and plans[2].act_buf is not None  # the evicted plan's memory is released
    net.run({"x": xs[2]})
    assert net._last is plans[2]  # cached: no new plan
    got = net.run({"x": xs[1]})["probs"]  # planned anew; 3 was the least recently used
    assert [k[0][0] for k in net.plans] == [2, 1] and plans[3].act_buf is None
    assert rel_l2(got, ref.run(None, {"x": xs[1]})[0]) <= 1e-5
    for n in (4, 5, 6, 3):
        net.run({"x": rng.standard_normal((n, 3, 8, 8)).astype(np.float32)})
    assert [k[0][0] for k in net.plans] == [6, 3]
    assert ctx.allocated_bytes - before == sum(_device_bytes(p) for p in net.plans.values())  # the others freed
    net.close()
    assert ctx.allocated_bytes == before


def _device_bytes(plan):
    return sum(b.size for b in [plan.act_buf, plan.const_buf] + list(plan.lowerer.scratch.values()))


def test_chosen_outputs_of_a_model_with_a_host_step(ctx):
    """NonZero runs on the host between device graphs: every output is made, those asked are returned."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("NonZero", ["r"], ["nz"]),
             helper.make_node("Cast", ["nz"], ["nf"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["nf"], ["s"], keepdims=0), helper.make_node("Neg", ["x"], ["n"])]
    model = _model(nodes, [("x", TensorProto.FLOAT, [4, 5])], [("s", TensorProto.FLOAT, None),
                                                              ("n", TensorProto.FLOAT, [4, 5])])
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ours = dlnet.InferenceSession(model, providers=[ctx])
    x = np.random.default_rng(11).standard_normal((4, 5)).astype(np.float32)
    for names in (["n", "s"], ["s"], None):
        got, want = ours.run(names, {"x": x}), theirs.run(names, {"x": x})
        assert [g.shape for g in got] == [w.shape for w in want]
        for g, w in zip(got, want):
            assert rel_l2(g, w) <= 1e-6
    ours.close()
