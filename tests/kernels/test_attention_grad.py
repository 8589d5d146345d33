"""AttentionGrad (attention_grad.cl): Attention's gradient without the T x T scores, against its float64 numpy form
(graph/ops/attention.py): grouped-query heads, stored layouts, causal offsets that hide whole rows, bool and float
masks, head dims of several chunks of 8 and ragged ones."""
import numpy as np
import pytest

import dlnet
from dlnet.graph.ir import Builder, Graph
from dlnet.graph.ops.attention import stored_shape
from dlnet.plan import Plan

from ..conftest import context, rel_l2
from .test_reduce_split import gpu_like

CASES = [  # (B, Hq, Hk, Tq, Tk, D, DV, attrs, mask)
    (2, 4, 4, 37, 37, 64, 64, {"causal": 1}, None),
    (1, 6, 2, 20, 33, 80, 24, {"causal": 1, "causal_offset": -3}, None),  # (the first 3 rows see no key)
    (2, 4, 1, 9, 17, 12, 5, {"layout": ("bthd", "bhtd", "tbhd", "thbd")}, "bool"),
    (2, 2, 2, 16, 16, 32, 32, {"causal": 1}, "float"),
    (1, 2, 2, 3, 20, 16, 16, {"causal": 1, "causal_offset": 17}, "float"),  # (3 query rows: dq a row at a time)
    (1, 4, 2, 12, 5, 8, 16, {}, "bool"),  # (5 keys: dk and dv a row at a time)
]


@pytest.mark.parametrize("B,Hq,Hk,Tq,Tk,D,DV,attrs,mask", CASES)
@pytest.mark.parametrize("launch", ["cpu", "cpu rows", "gpu"])
def test_attention_grad_matches_numpy(B, Hq, Hk, Tq, Tk, D, DV, attrs, mask, launch):
    """launch: a CPU's (8 query or key rows in vector lanes where there are 8, attention_grad_lanes.cl; "cpu rows":
    Options.attention_cpu_lanes off, 8 rows a work-item in turn) or a GPU's (one row a work-item, the device's
    work-groups) on the test device."""
    rng = np.random.default_rng(B * 100 + Tq)
    layout = attrs.get("layout", ("bhtd",) * 4)
    logical = [(B, Hq, Tq, D), (B, Hk, Tk, D), (B, Hk, Tk, DV), (B, Hq, Tq, DV), (B, Hq, Tq, DV)]
    arrays = [rng.standard_normal(stored_shape(s, lay)).astype(np.float32)
              for s, lay in zip(logical, layout + layout[3:], strict=True)]
    g = Graph()
    values = [g.add_input(f"x{i}", "float32", a.shape) for i, a in enumerate(arrays)]
    if mask == "bool":
        values.append(g.constant(rng.random((Tq, Tk)) > 0.3))
    elif mask == "float":
        values.append(g.constant(rng.standard_normal((B, 1, Tq, Tk)).astype(np.float32)))
    node_attrs = {"scale": 1.0 / np.sqrt(D), **attrs}
    outs = Builder(g).op("AttentionGrad", values, node_attrs, n_out=4)
    g.outputs, g.output_names = outs, ["dq", "dk", "dv", "stats"]
    ref = outs[0].producer.spec.numpy(outs[0].producer, *arrays, *[v.const for v in values[5:]])
    ctx = gpu_like() if launch == "gpu" else context().with_options(attention_cpu_lanes=launch == "cpu")
    plan = Plan(ctx, g)
    if ctx.dev.is_cpu:
        lanes = [launch == "cpu" and t >= 8 for t in (Tq, Tk)]  # (the IR prints the launch of dq and of dk, dv)
        assert outs[0].producer.schedule["tile"] == "/".join("lanes" if f else "8" for f in lanes)
    try:
        got = plan.run(arrays)
    finally:
        plan.release()
    for name, a, r in zip(g.output_names[:3], got, ref, strict=False):
        assert a.shape == r.shape and rel_l2(a, r) < 1e-5, (name, rel_l2(a, r))
    lse, rowsum = (got[3].reshape(-1, 2)[:, i] for i in (0, 1))
    ref_lse, ref_rowsum = (ref[3].reshape(-1, 2)[:, i] for i in (0, 1))
    assert np.array_equal(np.isinf(lse), np.isinf(ref_lse)) and rel_l2(rowsum, ref_rowsum) < 1e-5
    seen = ~np.isinf(ref_lse)
    assert rel_l2(lse[seen], ref_lse[seen]) < 1e-5


MMA_CASES = [  # (B, Hq, Hk, Tq, Tk, D, DV, attrs, mask): head dims multiples of 16
    (2, 4, 4, 37, 37, 64, 64, {"causal": 1}, None),
    (1, 6, 2, 20, 33, 32, 16, {"causal": 1, "causal_offset": -3}, None),  # (the first 3 rows see no key)
    (2, 4, 1, 9, 17, 16, 32, {"layout": ("bthd", "bhtd", "tbhd", "thbd")}, "bool"),
    (2, 2, 2, 16, 16, 32, 32, {"causal": 1}, "float"),
    (1, 2, 2, 3, 70, 16, 16, {"causal": 1, "causal_offset": 67}, "float"),  # (3 query rows, keys in two tiles)
    (1, 4, 2, 80, 5, 16, 16, {}, "bool"),  # (5 keys; query rows in two work-groups)
    (1, 2, 2, 130, 130, 64, 64, {}, None),  # (whole tiles without a per-score test, and ragged ones)
    (1, 2, 1, 40, 40, 128, 64, {"causal": 1}, None),  # (the largest head dim)
]


@pytest.mark.parametrize("B,Hq,Hk,Tq,Tk,D,DV,attrs,mask", MMA_CASES)
@pytest.mark.parametrize("mode", ["fp16", pytest.param("fp16 stored", marks=pytest.mark.slow),
                                  pytest.param("tf32", marks=pytest.mark.slow)])
def test_tensor_core_grad_matches_numpy(B, Hq, Hk, Tq, Tk, D, DV, attrs, mask, mode):
    """attention_grad_mma.cl (algo flash_grad_mma) on NVIDIA, elsewhere with its PTX emulated (Options.mma_emulate):
    f16 products in fp16 (the operands and gradients stored in half: a Mul by 1 on each side), their tiles by
    cp.async (the tile's "/cp"), or stored by the work-items ("fp16 stored": Options.attention_async off); tf32 in
    tf32."""
    base = context()
    precision = mode.split()[0]
    options = base.with_options(mma_emulate=not base.dev.is_nvidia, attention_async=mode != "fp16 stored").options
    ctx = dlnet.Context(base.info, precision=precision, options=options)
    rng = np.random.default_rng(B * 100 + Tq + D)
    layout = attrs.get("layout", ("bhtd",) * 4)
    logical = [(B, Hq, Tq, D), (B, Hk, Tk, D), (B, Hk, Tk, DV), (B, Hq, Tq, DV), (B, Hq, Tq, DV)]
    arrays = [rng.standard_normal(stored_shape(s, lay)).astype(np.float32)
              for s, lay in zip(logical, layout + layout[3:], strict=True)]
    if precision == "fp16":  # (the reference takes the values that the kernels read)
        arrays = [a.astype(np.float16).astype(np.float32) for a in arrays]
    g = Graph()
    b = Builder(g)
    one = g.constant(np.float32(1.0))
    values = [b.op("Mul", [g.add_input(f"x{i}", "float32", a.shape), one]) for i, a in enumerate(arrays)]
    if mask == "bool":
        values.append(g.constant(rng.random((Tq, Tk)) > 0.3))
    elif mask == "float":
        values.append(g.constant(rng.standard_normal((B, 1, Tq, Tk)).astype(np.float32)))
    outs = b.op("AttentionGrad", values, {"scale": 1.0 / np.sqrt(D), **attrs}, n_out=4)
    node = outs[0].producer
    g.outputs, g.output_names = [b.op("Mul", [x, one]) for x in outs[:3]] + [outs[3]], ["dq", "dk", "dv", "stats"]
    ref = node.spec.numpy(node, *arrays, *[v.const for v in values[5:]])
    plan = Plan(ctx, g)
    try:
        got = plan.run(arrays)
    finally:
        plan.release()
    assert node.schedule["algo"] == "flash_grad_mma" and node.schedule["tile"].startswith("mma")
    assert node.schedule["tile"].endswith("/cp") == (mode == "fp16")
    assert [x.dtype for x in node.inputs[:5] + node.outputs[:3]] == \
        ["float16" if precision == "fp16" else "float32"] * 8
    tol = 2e-2 if precision == "fp16" else 5e-3
    for name, a, r in zip(g.output_names[:3], got, ref, strict=False):
        assert a.shape == r.shape and rel_l2(a, r) < tol, (name, rel_l2(a, r))
    lse, rowsum = (got[3].reshape(-1, 2)[:, i] for i in (0, 1))
    ref_lse, ref_rowsum = (ref[3].reshape(-1, 2)[:, i] for i in (0, 1))
    assert np.array_equal(np.isinf(lse), np.isinf(ref_lse)) and rel_l2(rowsum, ref_rowsum) < tol
    seen = ~np.isinf(ref_lse)
    assert rel_l2(lse[seen], ref_lse[seen]) < tol
