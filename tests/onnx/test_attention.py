"""Attention-23, 24 and 25 (dlnet/onnx/attention.py) against onnx.reference on fresh random inputs, for the
attribute and input combinations the reference implements: 3-D and 4-D layouts, the past / present cache, bool and
float masks of ranks 2 to 4 (shorter than the keys too), is_causal with its cache offset, grouped-query heads,
scale and softcap, each qk_matmul_output mode, nonpad_kv_seqlen (24) and the windows (25), float16; and the errors
for what dlnet does not take. Y always runs as one Attention node (the fused kernel)."""
import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import dlnet

from ..conftest import rel_l2

INPUTS = ["Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen"]
OUTPUTS = ["Y", "present_key", "present_value", "qk_matmul_output"]
ONNX_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "float64": TensorProto.DOUBLE,
              "bool": TensorProto.BOOL, "int64": TensorProto.INT64}


def attention_model(feeds, attrs, opset, n_out=1):
    names = [n if n in feeds else "" for n in INPUTS]
    while names and not names[-1]:
        names.pop()
    node = helper.make_node("Attention", names, OUTPUTS[:n_out], **attrs)
    graph = helper.make_graph(
        [node], "attention", [helper.make_tensor_value_info(n, ONNX_TYPES[a.dtype.name], a.shape) for n, a in
                              feeds.items()],
        [helper.make_tensor_value_info(n, ONNX_TYPES[feeds["Q"].dtype.name], None) for n in OUTPUTS[:n_out]])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _inputs(rng, b, hq, hk, tq, tk, d, dv=None, flat=False, past=0, mask=None, nonpad=None, dtype=np.float32,
            hide_row=False):
    """Q, K, V ([B, H, T, D] or 3-D [B, T, H * D]), the cache, a mask (("bool" or "float", shape); hide_row: its
    first query row hides every key), lengths."""
    dv = dv or d
    def t(*shape):
        return rng.standard_normal(shape).astype(dtype)
    feeds = {"Q": t(b, tq, hq * d) if flat else t(b, hq, tq, d), "K": t(b, tk, hk * d) if flat else t(b, hk, tk, d),
             "V": t(b, tk, hk * dv) if flat else t(b, hk, tk, dv)}
    if mask is not None:
        kind, shape = mask
        feeds["attn_mask"] = rng.random(shape) > 0.3 if kind == "bool" else t(*shape)
        if hide_row:
            feeds["attn_mask"][..., 0, :] = False if kind == "bool" else -np.inf
    if past:
        feeds["past_key"], feeds["past_value"] = t(b, hk, past, d), t(b, hk, past, dv)
    if nonpad is not None:
        feeds["nonpad_kv_seqlen"] = np.asarray(nonpad, np.int64)
    return feeds


# id: (opset, input spec, attributes, outputs)
CASES = {
    "4d": (23, dict(b=2, hq=3, hk=3, tq=7, tk=9, d=8), {}, 1),
    "4d-causal-past-present": (23, dict(b=2, hq=2, hk=2, tq=3, tk=3, d=16, past=5), {"is_causal": 1}, 3),
    "3d-gqa-causal-short-bool-mask": (23, dict(b=2, hq=4, hk=2, tq=5, tk=5, d=8, flat=True, past=4,
                                               mask=("bool", (2, 1, 5, 7))), {"is_causal": 1, "q_num_heads": 4,
                                                                              "kv_num_heads": 2}, 3),
    "3d-dv-float-mask-rank3": (23, dict(b=1, hq=2, hk=2, tq=6, tk=10, d=8, dv=12, flat=True,
                                        mask=("float", (2, 6, 10))), {"q_num_heads": 2, "kv_num_heads": 2}, 1),
    "softcap-scale-mask-rank2": (23, dict(b=2, hq=2, hk=1, tq=5, tk=8, d=16, mask=("float", (5, 8))),
                                 {"softcap": 2.0, "scale": 0.7}, 1),
    "short-float-mask-past": (23, dict(b=2, hq=2, hk=2, tq=3, tk=3, d=8, past=4, mask=("float", (2, 1, 3, 5))), {},
                              3),
    "softmax-precision": (23, dict(b=1, hq=2, hk=2, tq=4, tk=4, d=8), {"softmax_precision": 1}, 1),
    **{f"qk-mode{m}": (23, dict(b=2, hq=4, hk=2, tq=3, tk=4, d=8, past=2, mask=("float", (2, 1, 3, 6))),
                       {"is_causal": 1, "qk_matmul_output_mode": m, "softcap": 3.0 if m == 1 else 0.0}, 4)
       for m in range(4)},
    "qk-mode3-bool-empty-row": (23, dict(b=1, hq=2, hk=2, tq=4, tk=4, d=8, mask=("bool", (4, 4)), hide_row=True),
                                {"qk_matmul_output_mode": 3}, 4),
    "float-mask-empty-row": (23, dict(b=2, hq=2, hk=2, tq=4, tk=5, d=8, mask=("float", (2, 1, 4, 5)), hide_row=True),
                             {}, 1),
    "nonpad-causal": (24, dict(b=3, hq=2, hk=2, tq=4, tk=9, d=8, nonpad=[9, 5, 2], mask=("float", (4, 9))),
                      {"is_causal": 1}, 1),
    "nonpad-bool-mask": (24, dict(b=2, hq=4, hk=1, tq=3, tk=6, d=16, nonpad=[6, 4], mask=("bool", (2, 1, 3, 6))),
                         {}, 1),
    "window-past": (25, dict(b=2, hq=2, hk=2, tq=4, tk=4, d=8, past=3), {"left_window_size": 2,
                                                                         "right_window_size": 1}, 3),
    "window-causal-nonpad": (25, dict(b=2, hq=2, hk=2, tq=3, tk=8, d=8, nonpad=[8, 6]),
                             {"is_causal": 1, "left_window_size": 3}, 1),
    "fp16-gqa-causal": (23, dict(b=1, hq=4, hk=2, tq=6, tk=6, d=16, dtype=np.float16), {"is_causal": 1}, 1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_attention_matches_onnx_reference(ctx, case):
    opset, spec, attrs, n_out = CASES[case]
    rng = np.random.default_rng(sum(map(ord, case)))
    feeds = _inputs(rng, **spec)
    model = attention_model(feeds, attrs, opset, n_out)
    want = ReferenceEvaluator(model).run(None, feeds)
    net = dlnet.Net(ctx).load_onnx(model)
    got = list(net.run(feeds).values())
    assert [n.op for n in net.graph.nodes].count("Attention") == 1
    tol = 2e-3 if spec.get("dtype") == np.float16 else 1e-5
    for name, g, w in zip(OUTPUTS, got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape, g.dtype, w.dtype)
        assert np.array_equal(np.isfinite(g), np.isfinite(w)), name
        fin = np.isfinite(w)
        assert rel_l2(g[fin], w[fin]) <= tol, (name, rel_l2(g[fin], w[fin]))
    net.release()


ERRORS = {
    "3-D inputs need the q_num_heads and kv_num_heads attributes":
        (23, dict(b=1, hq=2, hk=2, tq=3, tk=3, d=4, flat=True), {"q_num_heads": 2}),
    "q_num_heads must not be set for 4-D inputs": (25, dict(b=1, hq=2, hk=2, tq=3, tk=3, d=4), {"q_num_heads": 2}),
    "3 query heads, 2 key and 2 value heads": (23, dict(b=1, hq=3, hk=2, tq=3, tk=3, d=4), {}),
    "softmax_precision 7 is not supported": (23, dict(b=1, hq=2, hk=2, tq=3, tk=3, d=4), {"softmax_precision": 7}),
    "qk_matmul_output_mode 4": (23, dict(b=1, hq=2, hk=2, tq=3, tk=3, d=4), {"qk_matmul_output_mode": 4}),
    "has more keys than the 3 of K": (23, dict(b=1, hq=2, hk=2, tq=3, tk=3, d=4, mask=("float", (3, 5))), {}),
    "dtype float64 is not supported": (23, dict(b=1, hq=2, hk=2, tq=3, tk=3, d=4, dtype=np.float64), {}),
    "does not split into 3 heads": (23, dict(b=1, hq=2, hk=2, tq=3, tk=3, d=4, flat=True),
                                    {"q_num_heads": 3, "kv_num_heads": 2}),
}


@pytest.mark.parametrize("message", list(ERRORS))
def test_what_it_does_not_take_is_named(ctx, message):
    opset, spec, attrs = ERRORS[message]
    feeds = _inputs(np.random.default_rng(0), **spec)
    with pytest.raises(dlnet.ModelError, match=r"node .*\(Attention\): .*" + message.replace("(", r"\(")):
        dlnet.Net(ctx).load_onnx(attention_model(feeds, attrs, opset))


def test_past_key_without_past_value_is_named(ctx):
    feeds = _inputs(np.random.default_rng(0), b=1, hq=2, hk=2, tq=3, tk=3, d=4, past=2)
    del feeds["past_value"]
    with pytest.raises(dlnet.ModelError, match="past_key and past_value must be given together"):
        dlnet.Net(ctx).load_onnx(attention_model(feeds, {}, 23))
