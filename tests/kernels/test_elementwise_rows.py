"""The generated elementwise kernels on shapes that cross the CPU variant's row chunks (rows longer than one chunk
with a ragged end, broadcasts along the inner and the outer dims, a transpose whose inner stride is not 1, a
Concat slot written into a strided view), against NumPy in float64."""
import numpy as np
import pytest
from onnx import helper

import dlnet
from dlnet.kernels.codegen import ROW_CHUNK
from tests.conftest import make_model, rel_l2

R = np.random.default_rng(5)
LONG = 2 * ROW_CHUNK + 37  # two full chunks and a ragged one


def run(ctx, nodes, feeds, inits=None):
    model = make_model(nodes, feeds, ["y"], inits or {})
    return list(dlnet.Net(ctx).load_onnx(model).run(feeds).values())[0]


@pytest.mark.parametrize("a_shape,b_shape", [((2, 3, 5, LONG), (3, 1, 1)),     # per-channel scale (batch norm)
                                             ((3, LONG), (LONG,)),            # bias along the inner dim
                                             ((LONG, 1), (1, 7)),             # outer product: inner dim of 7
                                             ((4 * LONG,), (1,))])            # one flat row of many chunks
def test_broadcast_mul_add_relu(ctx, a_shape, b_shape):
    a = R.standard_normal(a_shape).astype(np.float32)
    b = R.standard_normal(b_shape).astype(np.float32)
    nodes = [helper.make_node("Mul", ["a", "b"], ["m"]), helper.make_node("Add", ["m", "a"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    got = run(ctx, nodes, {"a": a, "b": b})
    a64 = a.astype(np.float64)
    want = np.maximum(a64 * b + a64, 0)
    assert got.shape == want.shape
    assert rel_l2(got, want) < 1e-6


@pytest.mark.parametrize("perm", [(0, 2, 1), (2, 1, 0), (1, 0, 2)])
def test_transpose(ctx, perm):
    x = R.standard_normal((3, LONG, 5)).astype(np.float32)
    got = run(ctx, [helper.make_node("Transpose", ["x"], ["y"], perm=list(perm))], {"x": x})
    assert np.array_equal(got, x.transpose(perm))


def test_concat_into_strided_slot(ctx):
    a = R.standard_normal((2, 3, LONG)).astype(np.float32)
    b = R.standard_normal((2, 5, LONG)).astype(np.float32)
    nodes = [helper.make_node("Relu", ["a"], ["ra"]), helper.make_node("Concat", ["ra", "b"], ["y"], axis=1)]
    got = run(ctx, nodes, {"a": a, "b": b})
    assert np.array_equal(got, np.concatenate([np.maximum(a, 0), b], axis=1))
