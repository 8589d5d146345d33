"""Ops and op-set forms added after op-set 13, against onnx.reference on fresh random inputs, at each op-set whose
semantics differ: LayerNormalization-17, GroupNormalization-18/21, Gelu-20 (both approximations), Trilu-14, CastLike,
Mish, Swish, the bitwise ops, CenterCropPad, GridSample-16/20, AffineGrid-20, the op-set 18 Reduce* (axes an input),
Split-18, Pad-18/19, Resize-18/19, the window functions (17); float16 through the float32 kernels;
the normalize pass's fusions of decomposed LayerNorm and GELU; dtype errors naming the node."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import dlnet
from dlnet.onnx.importer import HANDLERS

from ..conftest import context, reference, rel_l2

rng = np.random.default_rng(2024)

TOL = {"float32": 1e-5, "float64": 1e-5, "float16": 2e-3}


def model_of(nodes, inputs, outputs, opset, inits=None):
    """A model of `nodes` at `opset`; inputs {name: array}, outputs [names] (types left to inference)."""
    def vi(name, a):
        return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)

    graph = helper.make_graph(nodes, "t", [vi(n, a) for n, a in inputs.items()],
                              [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs],
                              [onnx.numpy_helper.from_array(np.asarray(v), n) for n, v in (inits or {}).items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def check(nodes, inputs, outputs, opset, inits=None, tol=None, ctx=None):
    """dlnet's outputs against the reference evaluator's: same dtype and shape, values within tol (relative L2)."""
    model = model_of(nodes, inputs, outputs, opset, inits)
    want = reference(model, inputs)
    net = dlnet.Net(ctx or context()).load_onnx(model)
    got = net.run(inputs)
    for name, w in zip(outputs, want):
        g = got[name]
        assert g.shape == w.shape, (name, g.shape, w.shape)
        if w.dtype.kind == "f":
            assert g.dtype == w.dtype or name != outputs[0], (name, g.dtype, w.dtype)
            assert rel_l2(g, w) <= (tol or TOL[str(w.dtype)]), name
        else:
            assert g.dtype == w.dtype and np.array_equal(g, w), name
    return net


def normal(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# ---------------------------------------------------------------- LayerNormalization-17 ----------------------------
@pytest.mark.parametrize("shape,axis", [((3, 5, 16), -1), ((2, 3, 4, 5), 1), ((4, 6), 0), ((2, 3, 4, 5), -2)])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_normalization(shape, axis, bias):
    x = normal(*shape)
    inner = shape[axis % len(shape):]
    inits = {"scale": normal(*inner) + 1.5}
    if bias:
        inits["B"] = normal(*inner)
    node = helper.make_node("LayerNormalization", ["x", "scale"] + (["B"] if bias else []), ["y", "mean", "inv"],
                            axis=axis, epsilon=1e-3)
    check([node], {"x": x}, ["y", "mean", "inv"], 17, inits)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_layer_normalization_other_floats(dtype):
    """float16 and float64 normalise in float32 (stash_type 1) and come back in their own dtype."""
    x = normal(4, 24, dtype=dtype)
    inits = {"scale": normal(24, dtype=dtype), "B": normal(24, dtype=dtype)}
    node = helper.make_node("LayerNormalization", ["x", "scale", "B"], ["y"])
    net = check([node], {"x": x}, ["y"], 17, inits)
    assert "LayerNorm(" in str(net.graph)


def test_layer_normalization_broadcast_scale():
    """A Scale of fewer dims than the normalised shape broadcasts over it (the reference's numpy broadcasting)."""
    x = normal(2, 3, 4, 5)
    node = helper.make_node("LayerNormalization", ["x", "scale", "B"], ["y"], axis=1)
    check([node], {"x": x}, ["y"], 17, {"scale": normal(4, 5), "B": normal(5)})


def test_layer_normalization_runs_as_one_kernel(ctx):
    x = normal(6, 32)
    node = helper.make_node("LayerNormalization", ["x", "scale", "B"], ["y"])
    net = check([node], {"x": x}, ["y"], 17, {"scale": normal(32), "B": normal(32)})
    assert [launch.label.split()[-1] for launch in net.launches] == ["LayerNorm"]


@pytest.mark.parametrize("rows", [7, 40])
@pytest.mark.parametrize("D", [5, 37, 300, 2051])
def test_layer_normalization_on_a_gpu(D, rows):
    """On GPUs each row takes a work-group (a CPU context told it is a GPU runs that kernel here), rows shorter than
    the group or no multiple of it too, with the statistics outputs; a few rows (decoding) take larger groups."""
    from dlnet.kernels.families.norm_pool import layernorm_group
    ctx = context().with_options(input_chunks=1)
    ctx.is_cpu = False
    assert layernorm_group(5, 40) == 32 and layernorm_group(300, 40) == 32 and layernorm_group(2051, 40) == 256
    assert layernorm_group(768, 3152) == 64 and layernorm_group(768, 1) == 256 and layernorm_group(300, 7) == 128
    x = normal(rows, D) * 3 + 2
    node = helper.make_node("LayerNormalization", ["x", "scale", "B"], ["y", "mean", "inv"], epsilon=1e-4)
    net = check([node], {"x": x}, ["y", "mean", "inv"], 17, {"scale": normal(D), "B": normal(D)}, ctx=ctx)
    assert [launch.kernel.function_name for launch in net.launches] == ["layernorm_wg"]


# ---------------------------------------------------------------- GroupNormalization-18 / 21 -----------------------
@pytest.mark.parametrize("opset", [18, 21])
@pytest.mark.parametrize("shape,groups", [((2, 6, 5, 4), 3), ((3, 4, 7), 4), ((2, 8, 3, 3), 1)])
def test_group_normalization(opset, shape, groups):
    """Op-set 18 scales and shifts per group, 21 per channel."""
    x = normal(*shape) * 2 + 1
    n = groups if opset == 18 else shape[1]
    node = helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=groups, epsilon=1e-3)
    check([node], {"x": x}, ["y"], opset, {"scale": normal(n), "bias": normal(n)})


def test_group_normalization_wrong_scale_for_its_opset():
    x = normal(2, 6, 4)
    node = helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=3, name="gn")
    model = model_of([node], {"x": x}, ["y"], 21, {"scale": normal(3), "bias": normal(3)})
    with pytest.raises(dlnet.ModelError, match=r"node gn \(GroupNormalization\): scale of shape \[3\]: op-set 21 "
                                               r"expects \[6\]"):
        dlnet.Net(context()).load_onnx(model)


# ---------------------------------------------------------------- pointwise -----------------------------------------
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_gelu(approximate, dtype):
    x = normal(3, 50, dtype=dtype) * 3
    node = helper.make_node("Gelu", ["x"], ["y"], approximate=approximate)
    net = check([node], {"x": x}, ["y"], 20)
    assert ("GeluTanh(" in str(net.graph)) == (approximate == "tanh")


@pytest.mark.parametrize("opset", [18, 22])
def test_mish(opset):
    x = np.concatenate([normal(200) * 4, np.float32([30.0, 100.0, -100.0])])  # (past softplus's threshold too)
    check([helper.make_node("Mish", ["x"], ["y"])], {"x": x}, ["y"], opset)


@pytest.mark.parametrize("alpha", [1.0, 0.4])
def test_swish(alpha):
    check([helper.make_node("Swish", ["x"], ["y"], alpha=alpha)], {"x": normal(4, 9) * 3}, ["y"], 24)


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.uint16, np.int64])
def test_bitwise(op, dtype):
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, (3, 4, 5), dtype=dtype, endpoint=True)
    b = rng.integers(info.min, info.max, (4, 1), dtype=dtype, endpoint=True)  # broadcast
    if op == "BitwiseNot":
        check([helper.make_node(op, ["a"], ["y"])], {"a": a}, ["y"], 18)
    else:
        check([helper.make_node(op, ["a", "b"], ["y"])], {"a": a, "b": b}, ["y"], 18)


@pytest.mark.parametrize("src,dst", [(np.float32, np.int32), (np.int64, np.float16), (np.float64, np.float32),
                                     (np.float32, np.bool_), (np.uint8, np.float64)])
@pytest.mark.parametrize("opset", [15, 19, 21])
def test_cast_like(src, dst, opset):
    x = (normal(5, 7) * 50).astype(src) if np.dtype(src).kind == "f" else rng.integers(0, 200, (5, 7)).astype(src)
    like = np.zeros(3, dst)
    check([helper.make_node("CastLike", ["x", "like"], ["y"])], {"x": x, "like": like}, ["y"], opset)


# ---------------------------------------------------------------- Trilu-14 -------------------------------------------
@pytest.mark.parametrize("upper", [1, 0])
@pytest.mark.parametrize("k", [None, 0, 1, -2, 5, -9])
@pytest.mark.parametrize("shape", [(5, 7), (2, 6, 4)])
def test_trilu(upper, k, shape):
    x = normal(*shape)
    inits = {} if k is None else {"k": np.asarray(k, np.int64)}
    node = helper.make_node("Trilu", ["x"] + ([] if k is None else ["k"]), ["y"], upper=upper)
    check([node], {"x": x}, ["y"], 14, inits)


@pytest.mark.parametrize("dtype", [np.int64, np.bool_, np.float16])
def test_trilu_dtypes(dtype):
    x = rng.integers(0, 2, (4, 4)).astype(dtype) if dtype == np.bool_ else (normal(4, 4) * 9).astype(dtype)
    check([helper.make_node("Trilu", ["x"], ["y"], upper=0)], {"x": x}, ["y"], 14)


def test_trilu_causal_mask_folds_at_load():
    """softmax(x + triu(full(-inf), 1)) with a constant full, as exporters write causal attention: the mask is
    folded at load, no Trilu or Where on the device."""
    full = np.full((6, 6), -np.inf, np.float32)
    nodes = [helper.make_node("Trilu", ["full", "one"], ["mask"], upper=1),
             helper.make_node("Add", ["x", "mask"], ["s"]), helper.make_node("Softmax", ["s"], ["y"], axis=-1)]
    net = check(nodes, {"x": normal(2, 6, 6)}, ["y"], 14, {"full": full, "one": np.asarray(1, np.int64)})
    assert "Trilu" not in str(net.graph) and "Where" not in str(net.graph)


# ---------------------------------------------------------------- CenterCropPad-18 ---------------------------------
@pytest.mark.parametrize("shape,target,axes", [((6, 7, 3), (4, 10, 3), None), ((6, 7, 3), (9, 2), [0, 1]),
                                               ((2, 5, 8), (3, 5), [-1, 1]), ((4, 4), (4, 4), None)])
def test_center_crop_pad(shape, target, axes):
    x = normal(*shape)
    kw = {} if axes is None else {"axes": axes}
    node = helper.make_node("CenterCropPad", ["x", "shape"], ["y"], **kw)
    check([node], {"x": x}, ["y"], 18, {"shape": np.asarray(target, np.int64)})


# ---------------------------------------------------------------- op-set 18 forms of older ops ---------------------
REDUCES = ["ReduceMax", "ReduceMin", "ReduceMean", "ReduceSum", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]


@pytest.mark.parametrize("op", REDUCES)
@pytest.mark.parametrize("opset", [13, 18])
@pytest.mark.parametrize("axes,keepdims", [([1], 1), ([0, -1], 0), (None, 1)])
def test_reduce_axes_input_or_attribute(op, opset, axes, keepdims):
    """Op-set 18 takes the axes as an input (ReduceSum already at 13), before as an attribute."""
    x = rng.uniform(0.5, 2.0, (3, 4, 5)).astype(np.float32) if op == "ReduceLogSum" else normal(3, 4, 5)
    as_input = opset >= 18 or op == "ReduceSum"
    inits = {"axes": np.asarray(axes, np.int64)} if as_input and axes is not None else {}
    kw = {"keepdims": keepdims}
    if axes is not None and not as_input:
        kw["axes"] = axes
    node = helper.make_node(op, ["x"] + (["axes"] if inits else []), ["y"], **kw)
    check([node], {"x": x}, ["y"], opset, inits)


@pytest.mark.parametrize("op", REDUCES)
def test_reduce_empty_axes_noop(op):
    """noop_with_empty_axes=1 and no axes (op-set 18): a reduction over no axis, each mode's per-element part
    (|x| for L1 and L2, x^2 for SumSquare, log x for LogSum, x for the rest)."""
    x = rng.uniform(0.5, 2.0, (3, 4)).astype(np.float32) if op == "ReduceLogSum" else normal(3, 4)
    node = helper.make_node(op, ["x"], ["y"], noop_with_empty_axes=1)
    check([node], {"x": x}, ["y"], 18)


@pytest.mark.parametrize("length,parts", [(10, 3), (9, 3), (7, 4), (3, 3)])
def test_split_num_outputs(length, parts):
    """Split-18's num_outputs: equal chunks of ceil(length / parts), the last one smaller."""
    outs = [f"y{i}" for i in range(parts)]
    node = helper.make_node("Split", ["x"], outs, axis=1, num_outputs=parts)
    check([node], {"x": normal(2, length)}, outs, 18)


@pytest.mark.parametrize("opset", [13, 18])
def test_split_sizes_input(opset):
    node = helper.make_node("Split", ["x", "split"], ["a", "b", "c"], axis=-1)
    check([node], {"x": normal(3, 9)}, ["a", "b", "c"], opset, {"split": np.asarray([2, 3, 4], np.int64)})


@pytest.mark.parametrize("mode,opset", [("constant", 18), ("reflect", 18), ("edge", 18), ("wrap", 19)])
@pytest.mark.parametrize("axes", [None, [1, -1]])
def test_pad_axes_and_wrap(mode, opset, axes):
    """Pad-18's axes input names the padded axes; 19 adds mode wrap."""
    x = normal(2, 4, 5)
    pads = [1, 2, 3, 0] if axes else [0, 1, 2, 0, 3, 1]
    inits = {"pads": np.asarray(pads, np.int64), "value": np.asarray(1.5, np.float32)}
    names = ["x", "pads", "value"]
    if axes:
        inits["axes"] = np.asarray(axes, np.int64)
        names.append("axes")
    check([helper.make_node("Pad", names, ["y"], mode=mode)], {"x": x}, ["y"], opset, inits)


RESIZES = [  # (attributes, scales, sizes, axes) at op-set 18
    ({"mode": "linear", "antialias": 1}, [1.0, 1.0, 0.5, 0.6], None, None),
    ({"mode": "cubic", "antialias": 1}, None, [2, 3, 5, 4], None),
    ({"mode": "linear"}, [0.5, 2.0], None, [2, 3]),
    ({"mode": "nearest"}, None, [7, 5], [3, 2]),
    ({"mode": "linear", "keep_aspect_ratio_policy": "not_larger"}, None, [6, 6], [2, 3]),
    ({"mode": "nearest", "keep_aspect_ratio_policy": "not_smaller"}, None, [6, 6], [2, 3]),
]


@pytest.mark.parametrize("attrs,scales,sizes,axes", RESIZES)
def test_resize_18(attrs, scales, sizes, axes):
    x = normal(2, 3, 8, 10)
    inits = {"roi": np.zeros(0, np.float32)}
    inits["scales"] = np.asarray(scales if scales is not None else [], np.float32)
    names = ["x", "roi", "scales"]
    if sizes is not None:
        inits["sizes"] = np.asarray(sizes, np.int64)
        names.append("sizes")
    kw = dict(attrs, **({"axes": axes} if axes else {}))
    check([helper.make_node("Resize", names, ["y"], **kw)], {"x": x}, ["y"], 18, inits)


def test_resize_19_half_pixel_symmetric():
    inits = {"roi": np.zeros(0, np.float32), "scales": np.asarray([1, 1, 0.6, 1.7], np.float32)}
    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], mode="linear",
                            coordinate_transformation_mode="half_pixel_symmetric")
    check([node], {"x": normal(1, 2, 10, 6)}, ["y"], 19, inits)


def test_every_version_of_a_supported_op_has_a_handler():
    """Each op dlnet supports takes every schema version up to the installed onnx's latest op-set (a version that
    only adds types reuses its predecessor's handler), so a newer export never fails on a version number alone."""
    latest = onnx.defs.onnx_opset_version()
    missing = []
    for schema in onnx.defs.get_all_schemas_with_history():
        if schema.domain not in ("", "ai.onnx") or schema.name not in HANDLERS or schema.deprecated:
            continue
        if schema.since_version <= latest and schema.since_version not in HANDLERS[schema.name]:
            missing.append(f"{schema.name}-{schema.since_version}")
    # forms older than any model dlnet reads (Pad-1, Split-1, Tile-1, Upsample-1: their op-set 1 attributes)
    assert sorted(missing) == ["Pad-1", "Split-1", "Tile-1", "Upsample-1"]


# ---------------------------------------------------------------- types ---------------------------------------------
@pytest.mark.parametrize("op,opset,dtype,attrs", [("Mish", 18, np.int32, {}), ("Gelu", 20, np.int64, {}),
                                                  ("BitwiseNot", 18, np.float32, {}),
                                                  ("LayerNormalization", 17, np.int32, {})])
def test_dtype_an_op_does_not_take_names_node_and_dtype(op, opset, dtype, attrs):
    x = np.ones((2, 4), dtype)
    inputs = ["x", "s"] if op == "LayerNormalization" else ["x"]
    node = helper.make_node(op, inputs, ["y"], name="the_node", **attrs)
    model = model_of([node], {"x": x}, ["y"], opset, {"s": np.ones(4, dtype)} if len(inputs) > 1 else None)
    with pytest.raises(dlnet.ModelError, match=rf"node the_node \({op}\): dtype {np.dtype(dtype).name} is not "
                                               r"supported"):
        dlnet.Net(context()).load_onnx(model)


def test_complex_input_is_refused_by_name():  # (bfloat16 works: tests/onnx/test_dtypes.py)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "t",
                              [helper.make_tensor_value_info("x", TensorProto.COMPLEX64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.COMPLEX64, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    with pytest.raises(dlnet.ModelError, match="input 'x': dtype COMPLEX64 is not supported"):
        dlnet.Net(context()).load_onnx(model)


# ---------------------------------------------------------------- fusion of decompositions ----------------------
def _const(name, value):
    return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.asarray(value, np.float32)))


@pytest.mark.parametrize("cube", ["pow", "mul"])
def test_decomposed_tanh_gelu_is_one_node(cube):
    """x * 0.5 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), as TorchScript writes GELU(approximate='tanh'),
    becomes one GeluTanh node (fused with the Relu after it: one launch)."""
    nodes = [_const("c3", 3.0), _const("k", 0.044715), _const("s", np.sqrt(2 / np.pi)), _const("one", 1.0),
             _const("half", 0.5)]
    if cube == "pow":
        nodes.append(helper.make_node("Pow", ["x", "c3"], ["x3"]))
    else:
        nodes += [helper.make_node("Mul", ["x", "x"], ["x2"]), helper.make_node("Mul", ["x", "x2"], ["x3"])]
    nodes += [helper.make_node("Mul", ["k", "x3"], ["kx3"]), helper.make_node("Add", ["x", "kx3"], ["inner"]),
              helper.make_node("Mul", ["s", "inner"], ["arg"]), helper.make_node("Tanh", ["arg"], ["t"]),
              helper.make_node("Add", ["one", "t"], ["t1"]), helper.make_node("Mul", ["x", "t1"], ["xt"]),
              helper.make_node("Mul", ["half", "xt"], ["g"]), helper.make_node("Relu", ["g"], ["y"])]
    net = check(nodes, {"x": normal(4, 33) * 3}, ["y"], 14)
    ops = [line.split("= ")[1].split("(")[0] for line in str(net.graph).splitlines() if " = " in line]
    assert "GeluTanh" in ops and "Tanh" not in ops and "Pow" not in ops
    assert len(net.launches) == 1


def test_decomposed_layernorm_over_trailing_axes_is_one_kernel():
    """LayerNorm decomposed over the last two axes (nn.LayerNorm([H, W]) at op-set 13): one LayerNorm kernel on a
    view, its per-element scale and bias folded into the kernel's rows."""
    x = normal(2, 3, 4, 5) * 2 + 1
    axes = onnx.numpy_helper.from_array(np.asarray([-2, -1], np.int64))
    nodes = [helper.make_node("Constant", [], ["axes"], value=axes), _const("two", 2.0), _const("eps", 1e-5),
             helper.make_node("ReduceMean", ["x", "axes"], ["m"]), helper.make_node("Sub", ["x", "m"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["d2"]), helper.make_node("ReduceMean", ["d2", "axes"], ["v"]),
             helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
             helper.make_node("Div", ["d", "sd"], ["n"]), helper.make_node("Mul", ["n", "w"], ["nw"]),
             helper.make_node("Add", ["nw", "b"], ["y"])]
    net = check(nodes, {"x": x}, ["y"], 18, {"w": normal(4, 5), "b": normal(5)})
    assert [launch.label.split()[-1] for launch in net.launches] == ["LayerNorm"]


# ---------------------------------------------------------------- GridSample, AffineGrid -------------------------
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_2d(mode, padding, align):
    """Positions past the edges (grid in [-1.3, 1.3]) exercise each padding mode; op-set 20's mode names."""
    x = normal(2, 3, 5, 6)
    grid = rng.uniform(-1.3, 1.3, (2, 4, 7, 2)).astype(np.float32)
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], mode=mode, padding_mode=padding, align_corners=align)
    check([node], {"x": x, "grid": grid}, ["y"], 20)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("padding", ["zeros", "reflection"])
def test_grid_sample_volumetric(mode, padding):
    x = normal(1, 2, 3, 4, 5)
    grid = rng.uniform(-1.2, 1.2, (1, 2, 3, 4, 3)).astype(np.float32)
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], mode=mode, padding_mode=padding)
    check([node], {"x": x, "grid": grid}, ["y"], 20)


@pytest.mark.parametrize("old,new", [("bilinear", "linear"), ("bicubic", "cubic"), ("nearest", "nearest")])
def test_grid_sample_16_mode_names(old, new):
    """Op-set 16 calls the modes bilinear and bicubic: the same sampling as op-set 20's linear and cubic."""
    x, grid = normal(1, 2, 4, 5), rng.uniform(-1.1, 1.1, (1, 3, 3, 2)).astype(np.float32)
    want = reference(model_of([helper.make_node("GridSample", ["x", "grid"], ["y"], mode=new)],
                              {"x": x, "grid": grid}, ["y"], 20), {"x": x, "grid": grid})[0]
    model = model_of([helper.make_node("GridSample", ["x", "grid"], ["y"], mode=old)], {"x": x, "grid": grid},
                     ["y"], 16)
    got = dlnet.Net(context()).load_onnx(model).run({"x": x, "grid": grid})["y"]
    assert rel_l2(got, want) <= 1e-5


@pytest.mark.parametrize("size", [(2, 3, 4, 5), (2, 1, 3, 4, 2)])
@pytest.mark.parametrize("align", [0, 1])
def test_affine_grid(size, align):
    r = len(size) - 2
    theta = normal(size[0], r, r + 1)
    node = helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=align)
    check([node], {"theta": theta}, ["grid"], 20, {"size": np.asarray(size, np.int64)})


def test_grid_sample_nearest_rounds_half_to_even():
    """Positions exactly between two pixels (grid -0.5 and 0.5 on 4 pixels: 0.5 and 2.5) take the even one."""
    x = normal(1, 1, 4, 4)
    grid = rng.choice(np.float32([-0.5, 0.0, 0.5]), (1, 5, 5, 2))
    check([helper.make_node("GridSample", ["x", "grid"], ["y"], mode="nearest")], {"x": x, "grid": grid}, ["y"], 20)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_reflects_far_positions(mode, align):
    """Positions several widths outside (grid in [-6, 6]) reflect off both borders in turn."""
    x = normal(1, 2, 4, 5)
    grid = rng.uniform(-6, 6, (1, 6, 6, 2)).astype(np.float32)
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], mode=mode, padding_mode="reflection",
                            align_corners=align)
    check([node], {"x": x, "grid": grid}, ["y"], 20)


# ---------------------------------------------------------------- float16 through the float32 kernels ---------------
@pytest.mark.parametrize("op,inputs,attrs", [
    ("MatMul", [(2, 3, 5, 8), (8, 6)], {}),
    ("Gemm", [(4, 7), (5, 7), (5,)], {"transB": 1, "alpha": 0.5}),
    ("Softmax", [(3, 4, 9)], {"axis": 1}),
    ("LogSoftmax", [(3, 9)], {}),
    ("Conv", [(2, 3, 7, 6), (4, 3, 3, 3), (4,)], {"pads": [1, 1, 1, 1]}),
    ("ConvTranspose", [(1, 2, 4, 5), (2, 3, 3, 3)], {"strides": [2, 2]}),
])
def test_float16_widened_to_the_float32_kernels(op, inputs, attrs):
    """float16 models run the float32 kernels: inputs widened, outputs narrowed (float16's answer to within its
    rounding)."""
    names = [f"x{i}" for i in range(len(inputs))]
    feeds = {n: normal(*s, dtype=np.float16) for n, s in zip(names, inputs)}
    check([helper.make_node(op, names, ["y"], **attrs)], feeds, ["y"], 13)


@pytest.mark.parametrize("gpu", [False, True])
@pytest.mark.parametrize("op", ["ReduceMax", "ReduceSum", "ReduceMean"])
def test_float16_reductions(op, gpu):
    """Reductions to float16 store through vstore_half (a half cast does not compile without cl_khr_fp16), in the
    GPU's split reductions too (a CPU context told it is a GPU runs them here)."""
    ctx = context().with_options(input_chunks=1)
    ctx.is_cpu = not gpu and ctx.is_cpu
    x = normal(2, 40000, dtype=np.float16) if gpu else normal(3, 5, 7, dtype=np.float16)
    node = helper.make_node(op, ["x", "axes"], ["y"], keepdims=0)
    net = check([node], {"x": x}, ["y"], 18, {"axes": np.asarray([1], np.int64)}, ctx=ctx)
    assert not gpu or any("finish" in launch.label for launch in net.launches)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic,dtype", [(1, TensorProto.FLOAT), (0, TensorProto.DOUBLE)])
def test_window_functions(op, periodic, dtype):
    """Op-set 17's windows of a size known at load: constants, added to a fresh input so the net has one."""
    size = int(rng.integers(5, 30))
    nodes = [helper.make_node(op, ["size"], ["w"], periodic=periodic, output_datatype=dtype),
             helper.make_node("Add", ["x", "w"], ["y"])]
    x = normal(size, dtype=helper.tensor_dtype_to_np_dtype(dtype))
    check(nodes, {"x": x}, ["y"], 17, {"size": np.asarray(size, np.int64)})


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("size", [64, 300, 1000])
def test_softmax_rows_a_work_group_each(op, size):
    """GPUs (the test device through the portable core here) run rows of at least 64 along the last axis a
    work-group each (softmax_rows), a loss's 16 rows of 1000 classes among them."""
    ctx = context().with_options(matrix_core="portable")
    x = normal(5, size) * 4.0
    net = check([helper.make_node(op, ["x"], ["y"], axis=-1)], {"x": x}, ["y"], 13, ctx=ctx)
    assert [launch.kernel.function_name for launch in net.launches] == ["softmax_rows"]
