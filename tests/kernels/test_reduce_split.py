"""Long reductions as the GPU runs them (forced onto whatever device runs the tests): a work-group per output, and
where few outputs would leave the device idle, several work-groups per output whose partial results red_finish
combines (a bias gradient: 64 sums of 800k elements each). No option chooses the reduction's work-group (the
device's kind does: families/reduce.py REDUCE_GROUP), so a copy of the context that takes its device for a GPU
(is_cpu = False, as Device.resolve allows a caller to set) stands in for one."""
import numpy as np
import pytest
from onnx import helper

import dlnet
from dlnet.kernels.runtime import cl

from ..conftest import context, make_model, reference, rel_l2

rng = np.random.default_rng(11)


def reduce_model(op, x, axes, keepdims):
    """An ONNX model of one reduction of x over `axes` (ReduceSum's axes an input, as op-set 13 has them)."""
    if op == "ReduceSum":
        return make_model([helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)], {"x": x}, ["y"],
                          {"axes": np.array(axes, np.int64)})
    return make_model([helper.make_node(op, ["x"], ["y"], axes=axes, keepdims=keepdims)], {"x": x}, ["y"])


def gpu_like():
    """A context of the test device that the kernels take for a GPU (a CPU device runs the GPU's reductions)."""
    ctx = context().with_options(input_chunks=1)  # (inputs uploaded whole, as on a CPU)
    ctx.is_cpu = False
    assert ctx.dev.kind == "gpu"
    return ctx


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL2", "ReduceLogSumExp",
                                "ReduceSumSquare"])
@pytest.mark.parametrize("shape,axes", [((8, 3, 64, 64), [0, 2, 3]), ((2, 40000), [1]), ((5, 7, 9000), [0, 2])])
def test_reduce_split(op, shape, axes):
    check_split(op, shape, axes, "Reduce split", int(op == "ReduceSum"))


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceL2"])
@pytest.mark.parametrize("shape,axes", [((1100, 40), [0]), ((8, 200, 48), [0, 1]), ((3, 700, 2, 33), [0, 1])])
def test_reduce_columns(op, shape, axes):
    """Sums over the outer dims of innermost outputs (a bias gradient over a [rows, N] gradient), as the GPU runs them:
    work-items along the outputs, each over a slice of the rows (reduce.py's columns), then red_finish; against
    onnx.reference."""
    check_split(op, shape, axes, "columns", 1)


def check_split(op, shape, axes, kind, keepdims):
    """The reduction runs as the GPU runs it, in launches labelled `kind` then red_finish; against onnx.reference."""
    x = rng.standard_normal(shape).astype(np.float32)
    model = reduce_model(op, x, axes, keepdims)
    net = dlnet.Net(gpu_like()).load_onnx(model)
    labels = [launch.label for launch in net.launches]
    assert any(kind in label for label in labels) and any("finish" in label for label in labels), labels
    want = reference(model, {"x": x})[0]
    got = net.run({"x": x})["y"]
    assert got.shape == want.shape
    assert rel_l2(got, want) < 1e-5


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceLogSumExp"])
@pytest.mark.parametrize("shape,axes", [((50, 300), [1]), ((4, 6, 700), [2]), ((3, 5, 9, 17), [2, 3]),
                                        ((7, 128), [1]), ((6, 100, 256), [2])])
def test_reduce_rows_by_smaller_groups(op, shape, axes):
    """Rows of 128 to 1023 elements as the GPU reduces them: a work-group per row of at most a quarter as many
    work-items as elements (LayerNorm's gradient's means; many rows too, as attention's gradient's row sums, whose
    rows are contiguous), against onnx.reference."""
    x = rng.standard_normal(shape).astype(np.float32)
    model = reduce_model(op, x, axes, 0)
    net = dlnet.Net(gpu_like()).load_onnx(model)
    sources = [launch.kernel.program.get_info(cl.program_info.SOURCE) for launch in net.launches]
    assert any("__local" in src for src in sources)  # (a work-group's partial sums)
    assert rel_l2(net.run({"x": x})["y"], reference(model, {"x": x})[0]) < 1e-5


@pytest.mark.parametrize("lanes", [1, 4])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                                "ReduceL2", "ReduceLogSumExp"])
@pytest.mark.parametrize("shape,axes", [((6, 3), [1]), ((5, 4), [1]), ((3, 9), [1]), ((7, 13, 5), [1]),
                                        ((2, 11, 3, 3), [2, 3])], ids=["3", "4", "9", "13-strided", "3x3"])
def test_reduce_lanes(op, shape, axes, lanes):
    """One work-item per output with `lanes` accumulators over interleaved elements (CPU devices use 4), on counts
    under, at and past the lane width plus a tail, and along a strided axis, against onnx.reference."""
    ctx = context().with_options(reduce_lanes=lanes)
    x = rng.uniform(0.5, 1.5, shape).astype(np.float32) * rng.choice([-1, 1], shape).astype(np.float32)
    model = reduce_model(op, x, axes, 0)
    want = reference(model, {"x": x})[0]
    got = dlnet.Net(ctx).load_onnx(model).run({"x": x})["y"]
    assert got.shape == want.shape
    assert rel_l2(got, want) < 1e-5


def test_reduce_lanes_with_prologue():
    """A reduction with its pointwise producer fused in (as training's graphs have: the mean of (x - m)^2 * m) on 4
    lanes, against numpy."""
    from dlnet.graph.passes.fuse import fuse_pointwise, fuse_reduce_prologues
    from dlnet.net import Plan
    ctx = context().with_options(reduce_lanes=4)
    x = rng.standard_normal((3, 4, 23)).astype(np.float32)
    m = rng.standard_normal((1, 4, 1)).astype(np.float32)
    nodes = [helper.make_node("Sub", ["x", "m"], ["d"]), helper.make_node("Mul", ["d", "d"], ["s"]),
             helper.make_node("Mul", ["s", "m"], ["w"]), helper.make_node("ReduceMean", ["w"], ["y"], axes=[2])]
    net = dlnet.Net(ctx).load_onnx(make_model(nodes, {"x": x, "m": m}, ["y"]))
    g = net.build_graph({"x": x.shape, "m": m.shape}, passes=False)
    fuse_pointwise(g)
    assert fuse_reduce_prologues(g) and "prologue=" in str(g)
    plan = Plan(ctx, g)
    got = plan.run([x, m])[0]
    plan.release()
    assert rel_l2(got, ((x - m) ** 2 * m).mean(axis=2, keepdims=True)) < 1e-6


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL2", "ReduceProd"])
@pytest.mark.parametrize("shape,axes", [((8, 3, 64, 65), [0, 2, 3]), ((5, 7, 3), [0, 2]), ((4, 6, 9), [0, 1, 2])])
@pytest.mark.parametrize("lanes", [1, 4])
def test_reduce_lanes_over_two_dims(op, shape, axes, lanes):
    """CPUs: a work-item per output whose reduced dims are two (a bias gradient over (0, 2, 3)) runs Options.
    reduce_lanes accumulators along the last, in a loop over the first (a ragged tail of 65 % 4, and of 3 and 9
    under 4); against onnx.reference, and with lanes 1 (one element after the other); NaNs win a max or min."""
    x = (rng.random(shape) + 0.5).astype(np.float32) if op == "ReduceProd" and shape[0] < 8 else \
        rng.standard_normal(shape).astype(np.float32)
    if op == "ReduceProd" and shape[0] == 8:
        pytest.skip("(a product of 66560 normals over/underflows)")
    if op in ("ReduceMax", "ReduceMin"):
        x.reshape(-1)[7] = np.nan
    model = reduce_model(op, x, axes, 1)
    net = dlnet.Net(context().with_options(reduce_lanes=lanes)).load_onnx(model)
    want, got = reference(model, {"x": x})[0], net.run({"x": x})["y"]
    assert got.shape == want.shape
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert rel_l2(np.nan_to_num(got), np.nan_to_num(want)) < 1e-5


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2",
                                "ReduceLogSumExp", "ReduceSumSquare"])
@pytest.mark.parametrize("shape,axes", [((394, 3072), [0]), ((3, 70, 45), [0, 1]), ((5, 37), [0]),
                                        ((2, 197, 21), [0])])
def test_reduce_columns_on_cpus(op, shape, axes):
    """CPUs: a float32 reduction down columns (a bias gradient over tokens) runs red_cols, 8 columns a work-item in a
    float8, the ragged last work-item's columns (45 and 37: 5 past whole 8s; 197 x 21: 1) one by one, kept dims that
    are one run in x (a position table's gradient over the batch) as one; against onnx.reference, with a NaN that a
    max or min keeps; with Options.reduce_columns_cpu off, the work-item per column."""
    ctx = context()
    if not ctx.is_cpu:
        pytest.skip("the CPU devices' path")
    x = rng.standard_normal(shape).astype(np.float32)
    if op in ("ReduceMax", "ReduceMin"):
        x.reshape(-1, shape[-1])[1, 2] = np.nan
    model = reduce_model(op, x, axes, 0)
    want = reference(model, {"x": x})[0]
    for on in (True, False):
        net = dlnet.Net(ctx.with_options(reduce_columns_cpu=on)).load_onnx(model)
        assert any(launch.label.endswith("Reduce columns") for launch in net.launches) == on
        got = net.run({"x": x})["y"]
        assert got.shape == want.shape and np.array_equal(np.isnan(got), np.isnan(want))
        assert rel_l2(np.nan_to_num(got), np.nan_to_num(want)) < 1e-5
