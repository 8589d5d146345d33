"""cpu_math.cl's inline erf, tanh and exp (CPU devices' generated float32 kernels and attention_cpu.cl) against
numpy in float64: across their whole range, at the clamps, for tiny inputs, and with NaN and +-inf as IEEE says."""
import math

import numpy as np
import pytest
from onnx import helper

import dlnet
from dlnet.kernels.runtime import kernel_source
from tests.conftest import make_model, rel_l2

SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-30, -1e-30, 3.99, 4.0, 4.01, 7.9, 7.91, 88.0, -88.0],
                   np.float32)


def _inputs(rng):
    return np.concatenate([SPECIAL, rng.uniform(-12, 12, 20000).astype(np.float32),
                           rng.standard_normal(5000).astype(np.float32) * 1e-3]).reshape(1, 1, -1)


def _erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


ORACLES = {
    "Erf": _erf,
    "Tanh": np.tanh,
    "Gelu": lambda x: x * 0.5 * (1 + _erf(x / math.sqrt(2))),
}


@pytest.mark.parametrize("op", sorted(ORACLES))
def test_erf_tanh_gelu_match_numpy_everywhere(ctx, op):
    rng = np.random.default_rng()
    x = _inputs(rng)
    bias = rng.uniform(-0.5, 0.5, x.shape[-1]).astype(np.float32)  # (a chain: bias + op, as a transformer's)
    nodes = [helper.make_node("Add", ["x", "b"], ["s"]), helper.make_node(op, ["s"], ["y"])]
    net = dlnet.Net(ctx).load_onnx(make_model(nodes, {"x": x}, ["y"], {"b": bias}, opset=20))
    got = net.run({"x": x})["y"].astype(np.float64)
    net.release()
    s = (x + bias).astype(np.float64)  # (the float32 sum, as the kernel computes it)
    with np.errstate(invalid="ignore", over="ignore"):
        want = ORACLES[op](s)
    finite = np.isfinite(want)
    assert (np.isnan(got) == np.isnan(want)).all()
    assert (got[~finite & ~np.isnan(want)] == want[~finite & ~np.isnan(want)]).all()
    assert rel_l2(got[finite], want[finite]) < 1e-6
    # Gelu = 0.5 s (1 + erf): erf's float32 error near -1 (an ulp of 1 is 1.2e-7) is scaled by 0.5 |s|, up to 6 here,
    # so its absolute error may pass 1e-6 (1.06e-6 seen once in fresh random inputs)
    bound = 2e-6 if op == "Gelu" else 1e-6
    assert np.max(np.abs(got[finite] - want[finite]) / np.maximum(np.abs(want[finite]), 1.0)) < bound
    tiny = finite & (np.abs(s) < 1e-2) & (s != 0)  # relative accuracy where the values are small
    assert np.max(np.abs(got[tiny] - want[tiny]) / np.abs(want[tiny])) < 1e-5


def test_attention_softmax_exp_over_wide_scores(ctx):
    """attention_cpu.cl's exp of shifted scores: scores spread over hundreds (many below float's exp range) and a
    -inf masked key, against numpy's softmax in float64."""
    rng = np.random.default_rng()
    q = rng.standard_normal((1, 2, 9, 16)).astype(np.float32) * 6
    k = rng.standard_normal((1, 2, 13, 16)).astype(np.float32) * 6
    v = rng.standard_normal((1, 2, 13, 16)).astype(np.float32)
    mask = np.zeros((9, 13), np.float32)
    mask[:, 3] = -np.inf
    model = make_model([helper.make_node("Attention", ["q", "k", "v", "m"], ["y"])],
                       {"q": q, "k": k, "v": v, "m": mask}, ["y"], opset=23)
    net = dlnet.Net(ctx).load_onnx(model)
    got = net.run({"q": q, "k": k, "v": v, "m": mask})["y"]
    net.release()
    s = q.astype(np.float64) @ k.transpose(0, 1, 3, 2) / 4.0 + mask
    assert np.ptp(s[np.isfinite(s)]) > 100
    p = np.exp(s - s.max(-1, keepdims=True))
    want = p / p.sum(-1, keepdims=True) @ v
    assert rel_l2(got, want) < 1e-5


def test_exp_of_non_positive_floats_within_two_ulp(ctx):
    """dl_exp_neg itself, through a one-line kernel: e^x for x in [-90, 0] within 2 ulp where e^x is a normal float,
    0 below -87.3 and for -inf, NaN for NaN."""
    import pyopencl as cl
    src = kernel_source("cpu_math") + """
    __kernel void f(__global const float* x, __global float* y) {
        y[get_global_id(0)] = dl_exp_neg(x[get_global_id(0)]);
    }"""
    rng = np.random.default_rng()
    x = np.concatenate([[0.0, -0.0, -1e-30, -87.2, -87.4, -100.0, -np.inf, np.nan], rng.uniform(-90, 0, 50000),
                        -rng.uniform(0, 1e-3, 1000)]).astype(np.float32)
    xb = cl.Buffer(ctx.cl, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=x)
    yb = cl.Buffer(ctx.cl, cl.mem_flags.WRITE_ONLY, x.nbytes)
    ctx.kernel(src, "f")(ctx.queue, x.shape, None, xb, yb)
    got = np.empty_like(x)
    cl.enqueue_copy(ctx.queue, got, yb)
    want = np.exp(x.astype(np.float64))
    normal = x >= np.float32(-87.3)  # (e^-87.3 is just above float's smallest normal)
    assert (np.abs(got[normal] - want[normal]) <= 2 * np.spacing(want[normal].astype(np.float32))).all()
    assert (got[(x < np.float32(-87.3)) & ~np.isnan(x)] == 0).all() and np.isnan(got[np.isnan(x)]).all()


def test_pointwise_chains_written_in_place_over_their_input(ctx):
    """A transformer's MLP: MatMul, bias + GELU written in place over the product (the vectorised loop assumes each
    element is read before it is written), MatMul, bias + residual Add in place too; against numpy."""
    rng = np.random.default_rng()
    x = rng.standard_normal((1, 37, 48)).astype(np.float32)
    w1 = (rng.standard_normal((48, 200)) / 7).astype(np.float32)
    w2 = (rng.standard_normal((200, 48)) / 14).astype(np.float32)
    b1, b2 = rng.standard_normal(200).astype(np.float32), rng.standard_normal(48).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["s1"]),
             helper.make_node("Gelu", ["s1"], ["g"]), helper.make_node("MatMul", ["g", "w2"], ["m2"]),
             helper.make_node("Add", ["m2", "b2"], ["s2"]), helper.make_node("Add", ["x", "s2"], ["y"])]
    net = dlnet.Net(ctx).load_onnx(make_model(nodes, {"x": x}, ["y"], {"w1": w1, "w2": w2, "b1": b1, "b2": b2},
                                              opset=20))
    got = net.run({"x": x})["y"]
    net.release()
    s1 = x.astype(np.float64) @ w1 + b1
    want = x + (ORACLES["Gelu"](s1) @ w2 + b2)
    assert rel_l2(got, want) < 1e-5


def test_exp_matches_numpy_over_floats_range(ctx):
    """Exp in a generated kernel (cpu_math.cl's dl_exp on CPU devices): within 2 ulp of float64's exp wherever the
    result is a normal float, +inf above log(FLT_MAX), 0 below log(FLT_MIN) (or numpy's subnormal there), NaN and
    +-inf as IEEE says; and a GELU's gradient chain (erf's exp(-x^2 / 2) term) against float64."""
    rng = np.random.default_rng()
    x = np.concatenate([SPECIAL, rng.uniform(-100, 100, 20000), np.linspace(88.70, 88.73, 301),
                        np.linspace(-87.4, -87.3, 301)]).astype(np.float32)
    net = dlnet.Net(ctx).load_onnx(make_model([helper.make_node("Exp", ["x"], ["y"])], {"x": x}, ["y"]))
    got = net.run({"x": x})["y"].astype(np.float64)
    net.release()
    with np.errstate(over="ignore"):
        want = np.exp(x.astype(np.float64))
    normal = (want >= np.finfo(np.float32).tiny) & (want <= np.finfo(np.float32).max)
    assert np.max(np.abs(got[normal] - want[normal]) / want[normal]) < 2 * 2.0 ** -23
    assert (np.isnan(got) == np.isnan(x)).all()
    assert (got[want > np.finfo(np.float32).max] == np.inf).all()
    assert (got[(want < np.finfo(np.float32).tiny) & ~np.isnan(x)] < np.finfo(np.float32).tiny).all()
    s = rng.standard_normal(4096).astype(np.float32) * 3  # d/ds of s Phi(s) = Phi(s) + s exp(-s^2 / 2) / sqrt(2 pi)
    nodes = [helper.make_node("Mul", ["s", "s"], ["q"]), helper.make_node("Mul", ["q", "h"], ["e"]),
             helper.make_node("Exp", ["e"], ["p"]), helper.make_node("Mul", ["s", "p"], ["t"]),
             helper.make_node("Mul", ["t", "c"], ["y"])]
    model = make_model(nodes, {"s": s}, ["y"], {"h": np.float32(-0.5), "c": np.float32(1 / math.sqrt(2 * math.pi))})
    net = dlnet.Net(ctx).load_onnx(model)
    s64 = s.astype(np.float64)
    assert rel_l2(net.run({"s": s})["y"], s64 * np.exp(-s64 * s64 / 2) / math.sqrt(2 * math.pi)) < 1e-6
    net.release()
