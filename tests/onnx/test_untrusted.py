"""An untrusted model: external data read only from inside one folder, nothing in the model naming a path, caps
checked before anything is allocated, what onnxruntime refuses refused, save_onnx never over its own source."""
import os
import pathlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import dlnet
from dlnet.graph import ir
from dlnet.graph.passes import fold
from dlnet.limits import MAX_ELEMENTS
from dlnet.onnx import validate
from tests.conftest import make_model, rel_l2

SECRET = np.arange(6, dtype=np.float32) * 7.25  # what a file outside the model's folder holds


def _matmul_model(w, x_shape=(2, 3), name="test"):
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": ("float32", list(x_shape))}, ["y"],
                       {"w": w})
    model.graph.name = name
    return model


def _external(model, location, offset=None, length=None):
    """Point initializer 'w' at `location` (raw bytes dropped), as onnx.save(save_as_external_data=True) does."""
    t = next(i for i in model.graph.initializer if i.name == "w")
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    del t.external_data[:]
    for key, value in (("location", location), ("offset", offset), ("length", length)):
        if value is not None:
            t.external_data.add(key=key, value=str(value))
    return model


@pytest.fixture()
def outside(tmp_path):
    """(base folder, a secret file beside it that no model in base may read)."""
    base = tmp_path / "models"
    base.mkdir()
    (tmp_path / "secret.bin").write_bytes(SECRET.tobytes())
    return base, tmp_path / "secret.bin"


def test_proto_external_data_needs_base_dir_and_never_reads_by_graph_name(ctx, tmp_path):
    """A proto whose graph.name is a real model path beside its weights file: not a path. Without base_dir, a
    ModelError naming the tensor; with base_dir, the weights are read there, the caller's proto is left as it was."""
    rng = np.random.default_rng(5)
    w, x = rng.standard_normal((3, 6)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32)
    (tmp_path / "w.bin").write_bytes(w.tobytes())
    model = _external(_matmul_model(w, name=str(tmp_path / "model.onnx")), "w.bin")
    cwd = os.getcwd()
    os.chdir(tmp_path)  # nor from the working directory
    try:
        with pytest.raises(dlnet.ModelError, match="tensor 'w' keeps its data in an external file; pass base_dir="):
            dlnet.Net(ctx).load_onnx(model)
        with pytest.raises(dlnet.ModelError, match="base_dir="):
            dlnet.Net(ctx).load_onnx(model.SerializeToString())
    finally:
        os.chdir(cwd)
    for source in (model, model.SerializeToString()):
        net = dlnet.Net(ctx).load_onnx(source, base_dir=str(tmp_path))
        assert net.path.startswith("<model '/") and net.path.endswith("'>")  # (shown; never opened)
        assert rel_l2(net.run({"x": x})["y"], x.astype(np.float64) @ w) < 1e-6
    assert model.graph.initializer[0].data_location == TensorProto.EXTERNAL  # the caller's proto, untouched


@pytest.mark.parametrize("how", ["dotdot", "absolute", "symlink", "symlinked_dir", "hardlink", "missing"])
def test_external_data_outside_the_folder_is_refused(ctx, outside, how):
    base, secret = outside
    location = {"dotdot": "../secret.bin", "absolute": str(secret), "symlink": "link.bin",
                "symlinked_dir": "up/secret.bin", "hardlink": "hard.bin", "missing": "nothing.bin"}[how]
    if how == "symlink":
        os.symlink(secret, base / "link.bin")
    elif how == "symlinked_dir":
        os.symlink(secret.parent, base / "up")
    elif how == "hardlink":
        os.link(secret, base / "hard.bin")
    model = _external(_matmul_model(np.zeros((3, 2), np.float32)), location)
    onnx.save(model, str(base / "model.onnx"))
    for source, kw in ((str(base / "model.onnx"), {}), (model, {"base_dir": str(base)})):
        with pytest.raises(dlnet.ModelError, match="tensor 'w': external data .* refused") as e:
            dlnet.Net(ctx).load_onnx(source, **kw)
        assert str(source if isinstance(source, str) else "<model 'test'>") in str(e.value)


@pytest.mark.parametrize("offset, length, size, match", [
    (8, None, 24, "holds 24 bytes; the tensor needs 24 from offset 8"),
    (10**6, None, 24, "holds 24 bytes; the tensor needs 24 from offset 1000000"),
    (None, 12, 24, "length 12 is not the 24 bytes its dims and dtype take"),
    (None, 48, 48, "length 48 is not the 24 bytes"),
    (None, None, 20, "holds 20 bytes; the tensor needs 24"),
    (-4, None, 24, "offset must be non-negative"),
])
def test_external_data_offsets_and_lengths_are_checked(ctx, tmp_path, offset, length, size, match):
    (tmp_path / "w.bin").write_bytes(np.arange(size, dtype=np.uint8).tobytes())
    model = _external(_matmul_model(np.zeros((3, 2), np.float32)), "w.bin", offset, length)
    with pytest.raises(dlnet.ModelError, match=match):
        dlnet.Net(ctx).load_onnx(model, base_dir=str(tmp_path))


def test_external_bytes_are_read_once(ctx, tmp_path):
    """Two tensors reading the same bytes of a file: refused (a file's tensors read at most its size)."""
    w = np.ones((3, 2), np.float32)
    (tmp_path / "w.bin").write_bytes(w.tobytes())
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["a"]), helper.make_node("MatMul", ["x", "v"], ["b"]),
                        helper.make_node("Add", ["a", "b"], ["y"])], {"x": ("float32", [2, 3])}, ["y"],
                       {"w": w, "v": w})
    for t in model.graph.initializer:
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
        t.external_data.add(key="location", value="w.bin")
    with pytest.raises(dlnet.ModelError, match="read 48 bytes of a 24-byte file"):
        dlnet.Net(ctx).load_onnx(model, base_dir=str(tmp_path))


def test_sources_a_path_a_pathlib_path_bytes_a_proto(ctx, tmp_path):
    rng = np.random.default_rng(8)
    w, x = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32)
    model = _matmul_model(w)
    onnx.save(model, str(tmp_path / "m.onnx"))
    for source, shown in ((str(tmp_path / "m.onnx"), str(tmp_path / "m.onnx")),
                          (tmp_path / "m.onnx", str(tmp_path / "m.onnx")),
                          (model.SerializeToString(), "<model 'test'>"), (model, "<model 'test'>")):
        net = dlnet.Net(ctx).load_onnx(source)
        assert net.path == shown and isinstance(net.path, str)
        assert rel_l2(net.run({"x": x})["y"], x.astype(np.float64) @ w) < 1e-6
    model.graph.name = ""
    assert dlnet.Net(ctx).load_onnx(model).path == "<model>"
    with pytest.raises(dlnet.InputError, match="base_dir is for a ModelProto or bytes"):
        dlnet.Net(ctx).load_onnx(tmp_path / "m.onnx", base_dir=str(tmp_path))


@pytest.mark.parametrize("source", [None, 42, ["m.onnx"], object()])
def test_source_of_another_type_is_an_input_error(ctx, source):
    with pytest.raises(dlnet.InputError, match=f"a path, bytes or an onnx.ModelProto, got {type(source).__name__}"):
        dlnet.Net(ctx).load_onnx(source)


def test_bytes_that_are_not_a_model_give_a_short_message(ctx):
    junk = b"\x08\x07" + bytes(range(256)) * 40
    with pytest.raises(dlnet.ModelError, match="^<model>: not an ONNX model") as e:
        dlnet.Net(ctx).load_onnx(junk)
    assert len(str(e.value)) < 200 and "\\x" not in str(e.value)
    with pytest.raises(dlnet.ModelError, match="^<model>: not an ONNX model"):
        dlnet.Net(ctx).load_onnx(b"")


def test_only_regular_files_are_opened(ctx, tmp_path):
    fifo = tmp_path / "pipe.onnx"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer forever
    with pytest.raises(dlnet.ModelError, match="pipe.onnx: not a regular file"):
        dlnet.Net(ctx).load_onnx(str(fifo))
    with pytest.raises(dlnet.ModelError, match=": not a regular file"):
        dlnet.Net(ctx).load_onnx(str(tmp_path))
    if os.path.exists("/dev/zero"):
        with pytest.raises(dlnet.ModelError, match="/dev/zero: not a regular file"):
            dlnet.Net(ctx).load_onnx("/dev/zero")


# ------------------------------------------------------------------ caps --------------------------------------------
def _relu_chain(n, shape=(2, 3)):
    nodes = [helper.make_node("Relu", [f"v{i}" if i else "x"], [f"v{i + 1}" if i + 1 < n else "y"]) for i in range(n)]
    return make_model(nodes, {"x": ("float32", list(shape))}, ["y"])


def test_caps_on_file_size_node_count_and_depth(ctx, tmp_path, monkeypatch):
    path = tmp_path / "chain.onnx"
    onnx.save(_relu_chain(12), str(path))
    monkeypatch.setattr(validate, "MAX_MODEL_BYTES", path.stat().st_size - 1)
    with pytest.raises(dlnet.ModelError, match=f"chain.onnx: {path.stat().st_size} bytes, more than"):
        dlnet.Net(ctx).load_onnx(str(path))
    monkeypatch.setattr(validate, "MAX_MODEL_BYTES", path.stat().st_size)
    monkeypatch.setattr(validate, "MAX_NODES", 11)
    with pytest.raises(dlnet.ModelError, match="chain.onnx: more than 11 nodes"):
        dlnet.Net(ctx).load_onnx(str(path))
    monkeypatch.setattr(validate, "MAX_NODES", 12)
    dlnet.Net(ctx).load_onnx(str(path))

    def nested(depth):  # If inside If inside If ..., the innermost branch an Identity of x
        body = helper.make_graph([helper.make_node("Identity", ["x"], ["o0"])], "b0", [],
                                 [helper.make_tensor_value_info("o0", TensorProto.FLOAT, None)])
        for d in range(1, depth + 1):
            body = helper.make_graph([helper.make_node("If", ["c"], [f"o{d}"], then_branch=body, else_branch=body)],
                                     f"b{d}", [], [helper.make_tensor_value_info(f"o{d}", TensorProto.FLOAT, None)])
        model = make_model(list(body.node), {"x": ("float32", [3])}, [f"o{depth}"], {"c": np.array(True)})
        model.graph.output[0].name = f"o{depth}"
        return model
    monkeypatch.setattr(validate, "MAX_NODES", 100)
    monkeypatch.setattr(validate, "MAX_DEPTH", 3)
    x = np.random.default_rng(0).standard_normal(3).astype(np.float32)
    np.testing.assert_array_equal(dlnet.Net(ctx).load_onnx(nested(3)).run({"x": x})["o3"], x)
    with pytest.raises(dlnet.ModelError, match="subgraphs nested more than 3 deep"):
        dlnet.Net(ctx).load_onnx(nested(4))


def test_huge_shapes_are_refused_before_numpy_allocates(ctx):
    """ConstantOfShape of 2**40 elements, an Expand to 2**40, an initializer claiming 2**62 elements, an input of
    2**33: each a ModelError naming the node or tensor (numpy would ask for terabytes first)."""
    cos = make_model([helper.make_node("ConstantOfShape", ["s"], ["y"], name="big")], {"x": ("float32", [1])}, ["y"],
                     {"s": np.array([1 << 40], np.int64)})
    with pytest.raises(dlnet.ModelError, match=r"node big \(ConstantOfShape\): shape \[1099511627776\]"):
        dlnet.Net(ctx).load_onnx(cos)
    expand = make_model([helper.make_node("Expand", ["x", "s"], ["y"], name="wide")], {"x": ("float32", [1])}, ["y"],
                        {"s": np.array([1 << 20, 1 << 20], np.int64)})
    with pytest.raises(dlnet.ModelError, match=r"node wide \(Expand\): output shape \[1048576, 1048576\] has "
                                               r"1099511627776 elements"):
        dlnet.Net(ctx).load_onnx(expand)
    rng = make_model([helper.make_node("Range", ["a", "b", "d"], ["y"])], {"x": ("float32", [1])}, ["y"],
                     {"a": np.array(0, np.int64), "b": np.array(1 << 50, np.int64), "d": np.array(1, np.int64)})
    with pytest.raises(dlnet.ModelError, match="Range"):
        dlnet.Net(ctx).load_onnx(rng)
    model = _relu_chain(1)
    model.graph.initializer.add(name="w", data_type=TensorProto.FLOAT, dims=[1 << 31, 1 << 31])
    with pytest.raises(dlnet.ModelError, match=r"initializer 'w': dims \[2147483648, 2147483648\] has "
                                               r"4611686018427387904 elements"):
        dlnet.Net(ctx).load_onnx(model)
    with pytest.raises(dlnet.ModelError, match=r"input 'x': dims \[8589934592\] has 8589934592 elements"):
        dlnet.Net(ctx).load_onnx(_relu_chain(1, (1 << 33,)))


def test_folds_over_the_cap_run_on_the_device(ctx, monkeypatch):
    """A node whose folded output would be over MAX_FOLD_ELEMENTS stays a device node: same numbers."""
    c = np.random.default_rng(2).standard_normal((1, 8)).astype(np.float32)
    model = make_model([helper.make_node("Expand", ["c", "s"], ["e"]), helper.make_node("Add", ["x", "e"], ["y"])],
                       {"x": ("float32", [4, 8])}, ["y"], {"c": c, "s": np.array([4, 8], np.int64)})
    x = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
    folded = dlnet.Net(ctx).load_onnx(model)
    assert "Expand" not in str(folded.graph)
    monkeypatch.setattr(ir, "MAX_FOLD_ELEMENTS", 31)  # at import
    monkeypatch.setattr(fold, "MAX_FOLD_ELEMENTS", 31)  # and in the passes
    kept = dlnet.Net(ctx).load_onnx(model)
    assert "Expand" in str(kept.graph)
    np.testing.assert_allclose(kept.run({"x": x})["y"], x + c, rtol=1e-6)
    np.testing.assert_allclose(folded.run({"x": x})["y"], x + c, rtol=1e-6)


def test_planned_device_memory_is_checked_against_the_device(ctx):
    """One buffer over CL_DEVICE_MAX_MEM_ALLOC_SIZE or all over CL_DEVICE_GLOBAL_MEM_SIZE: a DeviceError naming the
    sizes, before anything is allocated."""
    largest, total = ctx.device.max_mem_alloc_size, ctx.info.global_mem
    with pytest.raises(dlnet.DeviceError, match=f"a buffer of {(largest + 1) / 2**20:.1f} MiB is larger than"):
        ctx.check_room([largest + 1], "m")
    with pytest.raises(dlnet.DeviceError, match=f"do not fit device .* \\({total / 2**20:.1f} MiB, CL_DEVICE_GLOBAL"):
        ctx.check_room([largest] * (total // largest + 1), "m")
    n = largest // 4 + 1  # one float32 input over the largest buffer
    if n > MAX_ELEMENTS:
        pytest.skip("this device's largest buffer holds more than dlnet's element cap")
    before = ctx.allocated_bytes
    with pytest.raises(dlnet.DeviceError, match="test: planned device memory: a buffer of .* CL_DEVICE_MAX_MEM"):
        dlnet.Net(ctx).load_onnx(_relu_chain(1, (n,)))
    assert ctx.allocated_bytes == before


# ------------------------------------------------------------------ what onnxruntime refuses ----------------------
def test_value_defined_twice(ctx):
    model = make_model([helper.make_node("Relu", ["x"], ["a"], name="one"), helper.make_node("Neg", ["x"], ["a"],
                                                                                              name="two"),
                        helper.make_node("Relu", ["a"], ["y"])], {"x": ("float32", [3])}, ["y"])
    with pytest.raises(dlnet.ModelError, match=r"node two \(Neg\) defines 'a', which is already defined"):
        dlnet.Net(ctx).load_onnx(model)
    model = make_model([helper.make_node("Relu", ["x"], ["x"], name="self")], {"x": ("float32", [3])}, ["x"])
    with pytest.raises(dlnet.ModelError, match=r"node self \(Relu\) defines 'x', which is already defined"):
        dlnet.Net(ctx).load_onnx(model)
    model = make_model([helper.make_node("Add", ["x", "w"], ["y"])], {"x": ("float32", [3])}, ["y"],
                       {"w": np.ones(3, np.float32)})
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(3, np.float32), "w"))
    with pytest.raises(dlnet.ModelError, match="initializer 'w' is defined twice"):
        dlnet.Net(ctx).load_onnx(model)


def test_unknown_opset_and_ir_versions(ctx):
    with pytest.raises(dlnet.ModelError, match=f"op-set 99 of the default domain is not supported \\(the newest is "
                                               f"{onnx.defs.onnx_opset_version()}\\)"):
        dlnet.Net(ctx).load_onnx(make_model([helper.make_node("Relu", ["x"], ["y"])], {"x": ("float32", [3])}, ["y"],
                                            opset=99))
    model = _relu_chain(1)
    model.ir_version = 99
    with pytest.raises(dlnet.ModelError, match=f"IR version 99 is not supported \\(1 to {onnx.IR_VERSION}\\)"):
        dlnet.Net(ctx).load_onnx(model)


def test_negative_dims(ctx):
    model = make_model([helper.make_node("Add", ["x", "w"], ["y"])], {"x": ("float32", [3])}, ["y"])
    model.graph.initializer.add(name="w", data_type=TensorProto.FLOAT, dims=[-1])
    with pytest.raises(dlnet.ModelError, match=r"<model 'test'>: initializer 'w': dims \[-1\] has a negative dim"):
        dlnet.Net(ctx).load_onnx(model)
    model = _relu_chain(1, (2, 3))
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = -3
    with pytest.raises(dlnet.ModelError, match=r"input 'x': dims \[2, -3\] has a negative dim"):
        dlnet.Net(ctx).load_onnx(model)


def test_batch_and_run_time_dims(ctx):
    model = _relu_chain(1, ("N", 3))
    for batch in (-5, 0, 2.5, "4"):
        with pytest.raises(dlnet.InputError, match=f"batch={batch!r}: expected an integer >= 1"):
            dlnet.Net(ctx).load_onnx(model, batch=batch)
    net = dlnet.Net(ctx).load_onnx(model)
    with pytest.raises(dlnet.InputError, match=r"input_array: input 'x' cannot have shape \[-2, 3\]"):
        net.input_array("x", (-2, 3))
    empty = net.input_array("x", (0, 3))
    assert empty.shape == (0, 3)
    assert net.run({"x": empty})["y"].shape == (0, 3)


def test_unsupported_dtype_names_the_file(ctx, tmp_path):
    model = _relu_chain(1)
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.COMPLEX64
    onnx.save(model, str(tmp_path / "c64.onnx"))
    with pytest.raises(dlnet.ModelError, match="c64.onnx: input 'x': dtype COMPLEX64 is not supported"):
        dlnet.Net(ctx).load_onnx(str(tmp_path / "c64.onnx"))


# ------------------------------------------------------------------ save_onnx ---------------------------------------
def test_save_onnx_never_over_its_source_and_leaves_no_temp_file(ctx, tmp_path, monkeypatch):
    w = np.random.default_rng(4).standard_normal((3, 2)).astype(np.float32)
    src = tmp_path / "m.onnx"
    onnx.save(_matmul_model(w), str(src))
    before = src.read_bytes()
    net = dlnet.Net(ctx).load_onnx(str(src))
    os.symlink(src, tmp_path / "alias.onnx")
    for target in (src, str(src), tmp_path / "sub" / ".." / "m.onnx", tmp_path / "alias.onnx"):
        with pytest.raises(dlnet.InputError, match="will not write over the file the model was read from"):
            net.save_onnx(target)
    assert src.read_bytes() == before
    out = tmp_path / "out.onnx"
    net.save_onnx(pathlib.Path(out))
    assert np.array_equal(numpy_helper.to_array(onnx.load(str(out)).graph.initializer[0]), w)

    def broken(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(dlnet.InputError, match="out2.onnx: could not be written .No space left on device"):
        net.save_onnx(str(tmp_path / "out2.onnx"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alias.onnx", "m.onnx", "out.onnx"]


# ------------------------------------------------------------------ what the fuzz found ---------------------------
def test_node_checked_against_its_schema(ctx):
    """An attribute of another type than the schema's (Gemm's alpha as a string), a required input left out, more
    inputs than the op takes: each a ModelError naming the node, in a subgraph too."""
    rng = np.random.default_rng(6)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    model = make_model([helper.make_node("Gemm", ["x", "w"], ["y"], name="fc", alpha=1.0)], {"x": ("float32", [2, 3])},
                       ["y"], {"w": w})
    alpha = model.graph.node[0].attribute[0]
    alpha.type = onnx.AttributeProto.STRING
    with pytest.raises(dlnet.ModelError, match=r"node fc \(Gemm\): attribute 'alpha' is of type STRING, expected "):
        dlnet.Net(ctx).load_onnx(model)
    for inputs, match in ((["x", ""], "input #1 is required"), (["x"], "input #1 is required"),
                          (["x", "w", "w", "w"], "4 inputs given, the op takes at most 3")):
        model = make_model([helper.make_node("Gemm", inputs, ["y"], name="fc")], {"x": ("float32", [2, 3])}, ["y"],
                           {"w": w})
        with pytest.raises(dlnet.ModelError, match=r"<model 'test'>: node fc \(Gemm\): " + match):
            dlnet.Net(ctx).load_onnx(model)
    body = helper.make_graph([helper.make_node("Softmax", [""], ["o"], name="inner")], "body", [],
                             [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)])
    model = make_model([helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body)],
                       {"x": ("float32", [3])}, ["y"], {"c": np.array(True)})
    with pytest.raises(dlnet.ModelError, match="input #0 is required"):
        dlnet.Net(ctx).load_onnx(model)


def test_a_graph_name_that_is_not_utf8(ctx):
    model = _relu_chain(1)
    model.graph.name = "gzz"
    data = model.SerializeToString().replace(b"gzz", b"g\xff\xfe")  # (same length: the proto stays valid)
    net = dlnet.Net(ctx).load_onnx(data)
    assert net.path == "<model 'g\ufffd\ufffd'>"
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(net.run({"x": x})["y"], np.maximum(x, 0))
    for where, model in (("input 'x'", _relu_chain(1, ("Nzz", 3))), ("node #0", _relu_chain(2))):
        if where == "node #0":
            model.graph.node[0].output[0] = model.graph.node[1].input[0] = "vzz"
        data = model.SerializeToString().replace(b"zz", b"\xff\xfe")
        with pytest.raises(dlnet.ModelError, match=f"<model 'test'>: {where}: a name that is not UTF-8 text"):
            dlnet.Net(ctx).load_onnx(data)


def test_constants_bound_at_load_are_checked(ctx):
    model = make_model([helper.make_node("Reshape", ["x", "s"], ["y"])], {"x": ("float32", [2, 3]),
                                                                         "s": ("int64", [2])}, ["y"])
    x = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
    net = dlnet.Net(ctx).load_onnx(model, constants={"s": np.array([3, 2], np.int64)})
    np.testing.assert_array_equal(net.run({"x": x})["y"], x.reshape(3, 2))
    with pytest.raises(dlnet.InputError, match="constants: input 's' is int64, given float64"):
        dlnet.Net(ctx).load_onnx(model, constants={"s": np.array([3.0, 2.0])})
    with pytest.raises(dlnet.InputError, match="constants names unknown input 'z'"):
        dlnet.Net(ctx).load_onnx(model, constants={"z": np.array([3, 2], np.int64)})
    with pytest.raises(dlnet.InputError, match="constants must be a dict"):
        dlnet.Net(ctx).load_onnx(model, constants=[("s", np.array([3, 2]))])


def test_zero_size_tensors_with_huge_dims_and_unheld_dtypes(ctx):
    """A zero-size input whose other dim is 2**63 - 1 (its strides overflow the kernels' index types): refused,
    counting elements with zero dims left out. A subgraph initializer of a dtype dlnet does not hold (FLOAT6E2M3
    reached codegen as a KeyError): refused at load, naming it."""
    model = _relu_chain(1, (0, 3))
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 2**63 - 1
    with pytest.raises(dlnet.ModelError, match=r"input 'x': dims \[0, 9223372036854775807\] has 9223372036854775807 "
                                               r"elements \(its zero dims left out\)"):
        dlnet.Net(ctx).load_onnx(model)
    np.testing.assert_array_equal(dlnet.Net(ctx).load_onnx(_relu_chain(1, (0, 3))).run(
        {"x": np.zeros((0, 3), np.float32)})["y"], np.zeros((0, 3), np.float32))
    k = numpy_helper.from_array(np.ones((1, 3), np.float32), "k")
    k.data_type = TensorProto.FLOAT6E2M3
    body = helper.make_graph([helper.make_node("Add", ["x", "k"], ["o"])], "then", [],
                             [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)], [k])
    model = make_model([helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body)],
                       {"x": ("float32", [2, 3])}, ["y"], {"c": np.array(True)})
    with pytest.raises(dlnet.ModelError, match="subgraph 'then': initializer 'k': dtype FLOAT6E2M3 is not supported"):
        dlnet.Net(ctx).load_onnx(model)
