"""AttentionGrad (attention_grad.cl): Attention's gradient without the T x T scores, against its float64 numpy form
(graph/ops/attention.py): grouped-query heads, stored layouts, causal offsets that hide whole rows, bool and float
masks, head dims of several chunks of 8 and ragged ones."""
import numpy as np
import pytest

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
