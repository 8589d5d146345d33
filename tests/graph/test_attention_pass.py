"""The attention fusion (dlnet/graph/passes/attention.py) on small graphs written as the exporters write them: what
it makes of them (golden prints), what it leaves alone, and that the fused graph computes what the chain did."""
import numpy as np
import pytest

from dlnet.graph.ir import Builder, Graph
from dlnet.graph.passes import run_passes
from dlnet.graph.passes.attention import fuse_attention
from dlnet.graph.passes.fold import remove_dead

from ..conftest import rel_l2

LOWEST = np.float32(np.finfo(np.float32).min)


def _graph(*shapes, names="qkv"):
    g = Graph("g")
    return g, Builder(g), [g.add_input(n, "float32", s) for n, s in zip(names, shapes)]


def _c(b, x):
    return b.const(np.asarray(x, np.float32))


def _finish(g, y):
    g.outputs, g.output_names = [y], ["y"]
    return g


def _evaluate(g, feeds):
    """The graph run node by node through the ops' numpy forms."""
    values = {v.id: feeds[v.name] for v in g.inputs}
    for node in g.nodes:
        ins = [None if v is None else (v.const if v.const is not None else values[v.id]) for v in node.inputs]
        for out, a in zip(node.outputs, node.spec.numpy(node, *ins)):
            values[out.id] = np.asarray(a).reshape(out.shape)
    return [v.const if v.const is not None else values[v.id] for v in g.outputs]


def _fused(g):
    """The fused graph's print and the largest relative error of its outputs against the chain's (float32 feeds:
    the chain's numpy forms compute in float32, Attention's in float64)."""
    rng = np.random.default_rng(0)
    feeds = {v.name: (rng.random(v.shape) > 0.3 if v.dtype == "bool" else rng.standard_normal(v.shape))
             .astype(v.dtype) for v in g.inputs}
    before = _evaluate(g, feeds)
    run_passes(g, [fuse_attention, remove_dead])
    after = _evaluate(g, feeds)
    return str(g), max(rel_l2(a, b) for a, b in zip(after, before))


def _body(text):
    return [line.split("#")[0].rstrip() for line in text.splitlines()[1:-1] if line.strip() and
            not line.startswith("const")]


def dynamo_sdpa(causal):
    """torch 2.13's dynamo export of scaled_dot_product_attention: K viewed as [B*H, T, D], transposed, viewed back;
    q and K^T each times sqrt(scale); a causal mask as a constant of float32's lowest above the diagonal."""
    g, b, (q, k, v) = _graph((2, 3, 5, 4), (2, 3, 6, 4), (2, 3, 6, 4))
    kt = b.op("Reshape", [b.op("Transpose", [b.op("Reshape", [k], {"shape": (6, 6, 4)})], {"perm": (0, 2, 1)})],
              {"shape": (2, 3, 4, 6)})
    s = b.op("Gemm", [b.op("Mul", [q, _c(b, [0.5])]), b.op("Mul", [kt, _c(b, [0.5])])])
    if causal:
        s = b.op("Add", [s, _c(b, np.where(np.tril(np.ones((5, 6), bool), 1), 0, LOWEST))])
    return _finish(g, b.op("Gemm", [b.op("Softmax", [s], {"axis": 3}), v]))


def test_dynamo_sdpa_is_one_node_reading_k_as_it_came():
    text, err = _fused(dynamo_sdpa(causal=False))
    assert _body(text) == ["  %12: f32[2,3,5,4] = Attention(%0, %1, %2) {scale=0.25, causal=0, causal_offset=0, "
                           "softcap=0.0, layout=(bhtd, bhtd, bhtd, bhtd), fused_grad=0}", "  return %12 \"y\""]
    assert err <= 1e-6


def test_a_constant_causal_triangle_becomes_the_causal_flag_with_its_offset():
    text, err = _fused(dynamo_sdpa(causal=True))
    assert _body(text)[0] == "  %14: f32[2,3,5,4] = Attention(%0, %1, %2) {scale=0.25, causal=1, causal_offset=1, " \
                             "softcap=0.0, layout=(bhtd, bhtd, bhtd, bhtd), fused_grad=0}"
    assert err <= 1e-6


def test_torchscript_bool_mask_with_its_nan_guard():
    """TorchScript at op-sets 14-17: Transpose(k), Mul by sqrt(scale) each, Add(Where(mask, 0, -inf)), Softmax,
    Where(IsNaN(p), 0, p), MatMul: the bool mask goes to the kernel as it is."""
    g, b, (q, k, v) = _graph((2, 3, 5, 4), (2, 3, 5, 4), (2, 3, 5, 4))
    m = g.add_input("m", "bool", (2, 1, 5, 5))
    kt = b.op("Transpose", [k], {"perm": (0, 1, 3, 2)})
    s = b.op("Gemm", [b.op("Mul", [q, _c(b, [0.5])]), b.op("Mul", [kt, _c(b, [0.5])])])
    s = b.op("Add", [s, b.op("Where", [m, _c(b, 0), _c(b, -np.inf)])])
    p = b.op("Softmax", [s], {"axis": 3})
    p = b.op("Where", [b.op("IsNaN", [p]), _c(b, 0), p])
    g = _finish(g, b.op("Gemm", [p, v]))
    text, err = _fused(g)
    assert _body(text) == ["  %18: f32[2,3,5,4] = Attention(%0, %1, %2, %3) {scale=0.25, causal=0, causal_offset=0, "
                           "softcap=0.0, layout=(bhtd, bhtd, bhtd, bhtd), fused_grad=0}", "  return %18 \"y\""]
    assert err <= 1e-6


def test_mha_bmm_reads_k_where_it_was_and_its_float_mask():
    """nn.MultiheadAttention's bmm form: q [B*H, T, D] scaled, K^T = Transpose(k [T, B*H, D], (1, 2, 0)), a float
    mask added after a scale applied to the product: the node goes to rank 4 (B 1) to read k as [1, T, B*H, D]
    (layout bthd) with no Transpose, its output viewed back."""
    g, b, (q, k, v) = _graph((6, 5, 4), (5, 6, 4), (6, 5, 4))
    bias = g.add_input("bias", "float32", (6, 1, 5))
    s = b.op("Gemm", [b.op("Mul", [q, _c(b, 0.5)]), b.op("Transpose", [k], {"perm": (1, 2, 0)})])
    s = b.op("Add", [b.op("Div", [s, _c(b, 2.0)]), bias])
    g = _finish(g, b.op("Gemm", [b.op("Softmax", [s], {"axis": 2}), v]))
    text, err = _fused(g)
    assert _body(text) == [
        "  %14: f32[1,6,5,4] = Reshape(%0) {shape=(1,6,5,4)}", "  %15: f32[1,5,6,4] = Reshape(%1) {shape=(1,5,6,4)}",
        "  %16: f32[1,6,5,4] = Reshape(%2) {shape=(1,6,5,4)}",
        "  %17: f32[1,6,5,4] = Attention(%14, %15, %16, %3) {scale=0.25, causal=0, causal_offset=0, softcap=0.0, "
        "layout=(bhtd, bthd, bhtd, bhtd), fused_grad=0}", "  %12: f32[6,5,4] = Reshape(%17) {shape=(6,5,4)}",
        "  return %12 \"y\""]
    assert err <= 1e-6


def test_grouped_query_heads_read_unrepeated():
    """Reshape(Expand(Reshape(k))) repeats each of 2 kv heads twice for 4 q heads: the node reads the 2 heads."""
    g, b, (q, k, v) = _graph((1, 4, 5, 8), (1, 2, 5, 8), (1, 2, 5, 8))

    def repeat(x):
        one = b.op("Reshape", [x], {"shape": (1, 2, 1, 5, 8)})
        return b.op("Reshape", [b.op("Expand", [one], {"shape": (1, 2, 2, 5, 8)})], {"shape": (1, 4, 5, 8)})
    kt = b.op("Transpose", [repeat(k)], {"perm": (0, 1, 3, 2)})
    g = _finish(g, b.op("Gemm", [b.op("Softmax", [b.op("Gemm", [q, kt, ], {"alpha": 0.3})], {"axis": 3}), repeat(v)]))
    text, err = _fused(g)
    att = next(n for n in g.nodes if n.op == "Attention")
    assert [v.shape for v in att.inputs] == [(1, 4, 5, 8), (1, 2, 5, 8), (1, 2, 5, 8)]
    assert not {"Expand", "Transpose", "Gemm", "Softmax"} & {n.op for n in g.nodes}, text
    assert att.attrs["scale"] == 0.3 and err <= 1e-6


def test_where_fill_masks_and_two_masks_become_one():
    """Hugging Face's Where(causal, s, lowest) with a float padding mask added after it: one mask, the float one
    where the constant bool shows, -inf elsewhere (no longer a pure triangle: no causal flag)."""
    g, b, (q, k, v) = _graph((1, 2, 6, 4), (1, 2, 6, 4), (1, 2, 6, 4))
    pad = g.add_input("pad", "float32", (1, 1, 1, 6))
    s = b.op("Gemm", [q, k], {"transB": 1})
    s = b.op("Where", [b.const(np.tril(np.ones((6, 6), bool))), s, _c(b, LOWEST)])
    g = _finish(g, b.op("Gemm", [b.op("Softmax", [b.op("Add", [s, pad])], {"axis": 3}), v]))
    text, err = _fused(g)
    att = next(n for n in g.nodes if n.op == "Attention")
    assert att.attrs["causal"] == 0 and att.inputs[3].dtype == "float32"  # the And of both is a Where(bool, pad)
    assert err <= 1e-6, text


@pytest.mark.parametrize("case", ["not-last-axis", "p-read-twice", "mask-after-scale", "bias-on-product"])
def test_what_it_leaves_alone(case):
    g, b, (q, k, v) = _graph((2, 5, 4), (2, 5, 4), (2, 5, 4))
    s = b.op("Gemm", [q, k], {"transB": 1})
    if case == "mask-after-scale":  # (s + m) * c scales the mask too
        s = b.op("Mul", [b.op("Add", [s, _c(b, np.zeros((5, 5)))]), _c(b, 0.5)])
    p = b.op("Softmax", [s], {"axis": 1 if case == "not-last-axis" else 2})
    y = b.op("Gemm", [p, v] + ([_c(b, np.ones(4))] if case == "bias-on-product" else []))
    g = _finish(g, y)
    if case == "p-read-twice":
        g.outputs.append(p)
    assert not fuse_attention(g)
    assert "Attention" not in str(g)


def test_scores_read_elsewhere_stay_for_their_reader():
    """The scores are a graph output too: the attention fuses, and the product that makes them stays for it."""
    g, b, (q, k, v) = _graph((2, 5, 4), (2, 5, 4), (2, 5, 4))
    s = b.op("Gemm", [q, k], {"transB": 1})
    g = _finish(g, b.op("Gemm", [b.op("Softmax", [s], {"axis": 2}), v]))
    g.outputs.append(s)
    text, err = _fused(g)
    assert [n.op for n in g.nodes] == ["Gemm", "Attention"] and err <= 1e-6, text


def test_a_trainable_scale_stays_a_node():
    """In a training graph a weight (param) is never folded into the attribute: q's Mul by it stays and the node
    reads its output."""
    g, b, (q, k, v) = _graph((2, 5, 4), (2, 5, 4), (2, 5, 4))
    c = _c(b, [0.5])
    c.param = True
    g = _finish(g, b.op("Gemm", [b.op("Softmax", [b.op("Gemm", [b.op("Mul", [q, c]), k], {"transB": 1})],
                                              {"axis": 2}), v]))
    assert fuse_attention(g)
    att = next(n for n in g.nodes if n.op == "Attention")
    assert att.inputs[0].producer.op == "Mul" and att.attrs["scale"] == 1.0


def test_a_where_that_hides_where_its_condition_holds():
    """Where(hidden, -inf, s) (masked_fill of a bool input): the kernel's mask is Not(hidden)."""
    g, b, (q, k, v) = _graph((2, 5, 4), (2, 7, 4), (2, 7, 4))
    hidden = g.add_input("hidden", "bool", (2, 1, 7))
    s = b.op("Where", [hidden, _c(b, -np.inf), b.op("Gemm", [q, k], {"transB": 1, "alpha": 0.5})])
    g = _finish(g, b.op("Gemm", [b.op("Softmax", [s], {"axis": 2}), v]))
    text, err = _fused(g)
    att = next(n for n in g.nodes if n.op == "Attention")
    assert att.inputs[3].producer.op == "Not" and att.inputs[3].producer.inputs[0] is hidden, text
    assert err <= 1e-6


def test_v_given_transposed_and_q_scaled_by_division():
    """y = softmax(q / 2 @ k^T) @ vt^T with vt [.., Dv, Tk] (a product with transB): a new Transpose makes V."""
    g, b, (q, k, vt) = _graph((2, 5, 4), (2, 7, 4), (2, 3, 7))
    s = b.op("Gemm", [b.op("Div", [q, _c(b, 2.0)]), k], {"transB": 1})
    g = _finish(g, b.op("Gemm", [b.op("Softmax", [s], {"axis": 2}), vt], {"transB": 1}))
    text, err = _fused(g)
    att = next(n for n in g.nodes if n.op == "Attention")
    assert att.inputs[2].producer.op == "Transpose" and att.inputs[2].shape == (2, 7, 3), text
    assert att.attrs["scale"] == 0.5 and err <= 1e-6


def heads_graph(where):
    """Projections [B, T, H * D] (torch SDPA, Hugging Face: "bthd") or [T, B, H * D] (nn.MultiheadAttention's
    view(T, B * H, D).transpose(0, 1): "tbhd") made [B, H, T, D] by Reshape and Transpose (K^T by a second
    Transpose), the output transposed back and viewed as the projections were: B 2, H 3, T 5, D 4."""
    shape = (2, 5, 12) if where == "bthd" else (5, 2, 12)
    g, b, (q, k, v) = _graph(shape, shape, shape)

    def heads(x):
        if where == "bthd":
            return b.op("Transpose", [b.op("Reshape", [x], {"shape": (2, 5, 3, 4)})], {"perm": (0, 2, 1, 3)})
        bh = b.op("Transpose", [b.op("Reshape", [x], {"shape": (5, 6, 4)})], {"perm": (1, 0, 2)})
        return b.op("Reshape", [bh], {"shape": (2, 3, 5, 4)})
    kt = b.op("Transpose", [heads(k)], {"perm": (0, 1, 3, 2)})
    y = b.op("Gemm", [b.op("Softmax", [b.op("Gemm", [heads(q), kt], {"alpha": 0.5})], {"axis": 3}), heads(v)])
    if where == "bthd":
        return _finish(g, b.op("Reshape", [b.op("Transpose", [y], {"perm": (0, 2, 1, 3)})], {"shape": (2, 5, 12)}))
    return _finish(g, b.op("Reshape", [b.op("Transpose", [y], {"perm": (2, 0, 1, 3)})], {"shape": (10, 12)}))


@pytest.mark.parametrize("where", ["bthd", "tbhd"])
def test_head_transposes_go_into_the_layout(where):
    """The Attention node reads the projections through Reshape views and writes the transposed output itself (its
    layout attribute): no Transpose is left; the fused graph computes what the chain did, and its print reads back."""
    from dlnet.graph.parser import constants_of, graphs_equal, parse_graph
    g = heads_graph(where)
    text, err = _fused(g)
    assert _body(text) == GOLDEN_HEADS[where], text
    assert [n.op for n in g.nodes] == ["Reshape"] * 3 + ["Attention", "Reshape"] and err <= 1e-6, text
    same, why = graphs_equal(parse_graph(text, constants_of(g)), g)
    assert same, why


GOLDEN_HEADS = {
    "bthd": ["  %3: f32[2,5,3,4] = Reshape(%1) {shape=(2,5,3,4)}",
             "  %6: f32[2,5,3,4] = Reshape(%0) {shape=(2,5,3,4)}",
             "  %10: f32[2,5,3,4] = Reshape(%2) {shape=(2,5,3,4)}",
             "  %13: f32[2,5,3,4] = Attention(%6, %3, %10) {scale=0.5, causal=0, causal_offset=0, softcap=0.0, "
             "layout=(bthd, bthd, bthd, bthd), fused_grad=0}", "  %14: f32[2,5,12] = Reshape(%13) {shape=(2,5,12)}",
             "  return %14 \"y\""],
    "tbhd": ["  %20: f32[5,2,3,4] = Reshape(%0) {shape=(5,2,3,4)}",
             "  %21: f32[5,2,3,4] = Reshape(%1) {shape=(5,2,3,4)}",
             "  %22: f32[5,2,3,4] = Reshape(%2) {shape=(5,2,3,4)}",
             "  %16: f32[5,2,3,4] = Attention(%20, %21, %22) {scale=0.5, causal=0, causal_offset=0, softcap=0.0, "
             "layout=(tbhd, tbhd, tbhd, tbhd), fused_grad=0}", "  %17: f32[10,12] = Reshape(%16) {shape=(10,12)}",
             "  return %17 \"y\""],
}
