"""Bad input gets a DlnetError naming the problem; a failed load leaves nothing allocated."""
import numpy as np
import pytest
from onnx import helper

import dlnet
from tests.conftest import make_model


def test_file_that_is_not_onnx(ctx, tmp_path):
    p = tmp_path / "model.onnx"
    p.write_bytes(b"this is not a protobuf \x00\xff\x17 at all")
    with pytest.raises(dlnet.ModelError, match="model.onnx: not an ONNX model"):
        dlnet.Net(ctx).load_onnx(str(p))


def test_empty_file(ctx, tmp_path):
    p = tmp_path / "empty.onnx"
    p.write_bytes(b"")
    with pytest.raises(dlnet.ModelError, match="empty.onnx: not an ONNX model"):
        dlnet.Net(ctx).load_onnx(str(p))


def test_weights_in_a_file_beside_the_model(ctx, tmp_path):
    """A model saved with its tensors as external data loads from its path (the weights file found beside it) and
    computes what the same model with its tensors inline does; without the weights file, a ModelError."""
    import onnx
    rng = np.random.default_rng(3)
    w, x = rng.standard_normal((64, 48)).astype(np.float32), rng.standard_normal((5, 64)).astype(np.float32)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": x}, ["y"], {"w": w})
    inline, beside = tmp_path / "inline.onnx", tmp_path / "beside.onnx"
    onnx.save(model, str(inline))
    onnx.save(model, str(beside), save_as_external_data=True, location="beside.bin", size_threshold=0)
    assert (tmp_path / "beside.bin").stat().st_size == w.nbytes
    got = dlnet.Net(ctx).load_onnx(str(beside)).run({"x": x})["y"]
    want = dlnet.Net(ctx).load_onnx(str(inline)).run({"x": x})["y"]
    assert np.linalg.norm(got - want) <= 1e-6 * np.linalg.norm(want)
    assert np.linalg.norm(got - x.astype(np.float64) @ w) < 1e-5 * np.linalg.norm(got)
    (tmp_path / "beside.bin").unlink()
    with pytest.raises(dlnet.ModelError, match="beside.onnx"):
        dlnet.Net(ctx).load_onnx(str(beside))


def test_missing_file(ctx, tmp_path):
    with pytest.raises(dlnet.ModelError, match="no such file"):
        dlnet.Net(ctx).load_onnx(str(tmp_path / "absent.onnx"))


def test_unsupported_ops_listed_once_before_any_allocation(ctx):
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="ok"),
             helper.make_node("FancyOp", ["a"], ["b"], name="first_bad"),
             helper.make_node("Relu", ["b"], ["c"]),
             helper.make_node("OtherOp", ["c"], ["y"], name="second_bad")]
    model = make_model(nodes, {"x": ("float32", [2, 3])}, ["y"])
    before = ctx.allocated_bytes
    with pytest.raises(dlnet.ModelError) as e:
        dlnet.Net(ctx).load_onnx(model)
    msg = str(e.value)
    assert "2 unsupported" in msg and "FancyOp (op-set 13, node first_bad)" in msg
    assert "OtherOp (op-set 13, node second_bad)" in msg
    assert ctx.allocated_bytes == before


def test_failed_lowering_releases_device_memory(ctx):
    # a 3-D convolution passes import and shape inference but has no kernel: the plan fails and frees its buffers
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"])], {"x": ("float32", [1, 2, 4, 4, 4])}, ["y"],
                       {"w": np.ones((3, 2, 2, 2, 2), np.float32)})
    before = ctx.allocated_bytes
    with pytest.raises(dlnet.ModelError, match="3-D convolution"):
        dlnet.Net(ctx).load_onnx(model)
    assert ctx.allocated_bytes == before


def test_later_opset_loads_when_semantics_unchanged(ctx):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": ("float32", [4])}, ["y"], opset=17)
    x = np.random.default_rng(0).standard_normal(4).astype(np.float32)
    np.testing.assert_array_equal(dlnet.Net(ctx).load_onnx(model).run({"x": x})["y"], np.maximum(x, 0))


def test_later_opset_with_changed_semantics_is_named(ctx):
    model = make_model([helper.make_node("LeakyRelu", ["x"], ["y"])], {"x": ("float32", [4])}, ["y"], opset=16)
    dlnet.Net(ctx).load_onnx(model)  # LeakyRelu-16 only added bfloat16: listed
    model = make_model([helper.make_node("Col2Im", ["x", "a", "b"], ["y"])], {"x": ("float32", [4])}, ["y"],
                       {"a": np.ones(2, np.int64), "b": np.ones(2, np.int64)}, opset=18)
    with pytest.raises(dlnet.ModelError, match="Col2Im .op-set 18"):
        dlnet.Net(ctx).load_onnx(model)


@pytest.fixture()
def relu_net(ctx):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": ("float32", ["N", 3])}, ["y"])
    return dlnet.Net(ctx).load_onnx(model)


def test_wrong_input_name(relu_net):
    with pytest.raises(dlnet.InputError, match="unknown input 'z'; the model's inputs are \\['x'\\]"):
        relu_net.run({"z": np.zeros((2, 3), np.float32)})


def test_missing_input(relu_net):
    with pytest.raises(dlnet.InputError, match="missing input 'x'"):
        relu_net.run({})


def test_wrong_shape(relu_net):
    with pytest.raises(dlnet.InputError, match="shape \\[2, 4\\], expected \\['N', 3\\]"):
        relu_net.run({"x": np.ones((2, 4), np.float32)})
    with pytest.raises(dlnet.InputError, match="expected rank 2"):
        relu_net.run({"x": np.ones(3, np.float32)})


def test_wrong_dtype(relu_net):
    with pytest.raises(dlnet.InputError, match="dtype float64, expected float32"):
        relu_net.run({"x": np.ones((2, 3))})


def test_symbolic_batch_binds_on_first_run_and_replans_once(relu_net):
    assert relu_net.inputs[0].shape == ("N", 3)
    rng = np.random.default_rng(1)
    for n in (2, 5, 2):
        x = rng.standard_normal((n, 3)).astype(np.float32)
        np.testing.assert_array_equal(relu_net.run({"x": x})["y"], np.maximum(x, 0))
    assert len(relu_net.plans) == 2


def test_batch_bound_at_load(ctx):
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": ("float32", ["N", 3])}, ["y"])
    net = dlnet.Net(ctx).load_onnx(model, batch=4)
    assert len(net.plans) == 1
    x = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)  # the batch at load is only a default
    np.testing.assert_array_equal(net.run({"x": x})["y"], np.maximum(x, 0))
    assert len(net.plans) == 2
