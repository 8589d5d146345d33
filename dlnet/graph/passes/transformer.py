"""Transformer fusions (inference; a training graph keeps them unfused: graph/ops/transformer.py has no gradients).

fuse_residual_norm:  s = a + b;  y = LayerNorm(s) (or RMSNorm; through the Reshape view LayerNormalization-17's
    handler flattens s with)  ->  one AddLayerNorm node writing y, and s where anything else reads it (the residual
    stream of pre-LN GPT / ViT blocks; post-LN BERT's s has no other reader). It runs after fuse_epilogues: where a
    Gemm with no bias of its own can take the Add as its C (a bias-free projection then the residual), the Gemm
    writes s in its epilogue and the LayerNorm reads it (two launches, s written once and read once), which moves
    less than a Gemm writing its product for AddLayerNorm to read back with b (two launches too, one more tensor
    read and written); where the Gemm took its bias (every nn.Linear), the residual Add is left, and fuses here.

fuse_qkv:  three (or two) Gemms of one input by constant weights (+ constant bias rows), each read only through
    Reshape views by Attention nodes (fuse_attention's per-operand layouts: the head split and Transposes are
    already gone)  ->  one Gemm by the weights concatenated at load, [K, N_q + N_k + N_v], whose three column
    blocks the Attention nodes read in place through ColumnView values (their strides: the kernels' qsb, qsh, qst).
    A projection with any other reader (one that cannot take a strided view) leaves the group unfused: nothing is
    ever copied. It runs after fuse_attention (the layouts) and fuse_epilogues (the biases as C).

split_packed_projections:  a product that already holds the three side by side (nn.MultiheadAttention's in_proj,
    torchvision ViT's and Swin's qkv Linear), split by the exporter as Reshape -> Transpose -> Gather per projection
    (a copy of the whole product and three more), gives the Attention nodes the same ColumnViews instead.
"""
import numpy as np

from ..ir import Node
from ..ops.transformer import _repeats, view_strides

NORMS = ("LayerNorm", "RMSNorm")


def _before(graph, v, index):
    """v is defined before graph.nodes[index] (a constant, an input, or an earlier node's output)."""
    return v.producer is None or graph.nodes.index(v.producer) < index


def _residual_norm(graph, node):
    """(add, view or None, a, b) of the Add whose sum `node` (a LayerNorm / RMSNorm) normalises, else None."""
    x, view = node.inputs[0], None
    p = x.producer
    if p is not None and p.op == "Reshape" and x.users == [node] and x not in graph.outputs and \
            p.inputs[0].rank and p.inputs[0].shape[-1] == x.shape[-1]:
        view, x = p, p.inputs[0]
    add = x.producer
    if add is None or add.op != "Add" or x.dtype != "float32" or x.rank < 1:
        return None
    a, b = add.inputs
    if a is b or (a.const is not None and b.const is not None):
        return None
    if a.shape != x.shape or not _repeats(b, x.shape):
        a, b = b, a
    if a.shape != x.shape or not _repeats(b, x.shape) or a.dtype != b.dtype:
        return None
    at = graph.nodes.index(add)
    if not all(_before(graph, v, at) for v in node.inputs[1:]):
        return None
    return add, view, a, b


def fuse_residual_norm(graph):
    """Each LayerNorm / RMSNorm of a residual Add's sum -> one AddLayerNorm (module docstring)."""
    changed = False
    for node in list(graph.nodes):
        if node.op not in NORMS or node not in graph.nodes:
            continue
        found = _residual_norm(graph, node)
        if found is None:
            continue
        add, view, a, b = found
        s, y = add.outputs[0], node.outputs[0]
        others = [u for u in s.users if u is not node and u is not view]
        keep = bool(others) or s in graph.outputs
        at = graph.nodes.index(add)
        for n in [node] + ([view] if view is not None else []) + [add]:
            graph.remove_node(n)
        rms = int(node.op == "RMSNorm")
        attrs = {"epsilon": node.attrs["epsilon"], "shape": y.shape, "rms": rms, "keep_sum": int(keep)}
        y.producer = s.producer = None
        fused = Node("AddLayerNorm", [a, b] + node.inputs[1:], [y] + ([s] if keep else []), attrs, node.name)
        graph.add_node(fused, at)
        changed = True
    return changed


# ------------------------------------------------------------------------------------------------------------ QKV


def _attention_readers(graph, y, n):
    """[(Reshape or None, value)]: the Reshape views of y (or y itself: None) through which only Attention nodes read
    it, as q, k or v, each a view that n columns of a wider product can be (view_strides); None where any other
    node reads it (or it is a graph output)."""
    if y in graph.outputs or not y.users:
        return None
    readers = []
    for u in set(y.users):
        if u.op == "Attention":
            reshape, v = None, y
        elif u.op == "Reshape" and u.outputs[0] not in graph.outputs:
            reshape, v = u, u.outputs[0]
        else:
            return None
        attn = v.users
        if not attn or any(r.op != "Attention" or v in r.inputs[3:] for r in attn) or \
                view_strides(v.shape, n, 2 * n) is None:
            return None
        readers.append((reshape, v))
    return readers


def _projection(graph, g):
    """(weight [K, N], bias [N] or None, [(reader, shape)]) of a Gemm that fuse_qkv may pack, else None. Readers:
    the Reshape views (or y itself: reader None) that only Attention nodes read, as q, k or v."""
    a = g.attrs
    w, y = g.inputs[1], g.outputs[0]
    c = g.inputs[2] if len(g.inputs) > 2 else None
    if a["transA"] or a.get("act") or w.const is None or w.param or w.rank != 2 or y.dtype != "float32" or \
            y in graph.outputs or not y.users:
        return None
    n = y.shape[-1]
    if c is not None and (c.const is None or c.param or c.size != n or c.rank != 1):
        return None
    readers = _attention_readers(graph, y, n)
    if readers is None:
        return None
    weight = np.asarray(w.const.T if a["transB"] else w.const)
    bias = None if c is None else np.asarray(c.const).reshape(-1) * np.asarray(a["beta"], c.dtype)
    return weight, bias, readers


def _pack(graph, group):
    """One Gemm of the group's input by their weights side by side, and a ColumnView per reader."""
    first = min(group, key=lambda item: graph.nodes.index(item[0]))[0]
    x = first.inputs[0]
    weights = [w for _, (w, _, _) in group]
    biases = [b if b is not None else np.zeros(w.shape[1], w.dtype) for _, (w, b, _) in group]
    has_bias = any(b is not None for _, (_, b, _) in group)
    inputs = [x, graph.constant(np.ascontiguousarray(np.concatenate(weights, axis=1)))]
    if has_bias:
        inputs.append(graph.constant(np.concatenate(biases).astype(weights[0].dtype)))
    width = sum(w.shape[1] for w in weights)
    y = graph.new_value("float32", first.outputs[0].shape[:-1] + (width,))
    attrs = dict(first.attrs, transB=0, beta=1.0)
    at = graph.nodes.index(first)
    for g, _ in group:
        graph.remove_node(g)
    graph.add_node(Node("Gemm", inputs, [y], attrs, first.name, first.schedule), at)
    start = 0
    for g, (w, _, readers) in group:
        for reshape, v in readers:
            if reshape is not None:
                graph.remove_node(reshape)
            at += 1
            v.producer = None
            graph.add_node(Node("ColumnView", [y], [v], {"start": start, "columns": w.shape[1], "shape": v.shape},
                                g.name), at)
        start += w.shape[1]


def fuse_qkv(graph):
    """The Q, K and V projections of one input as one product read in place (module docstring)."""
    changed = False
    groups = {}
    for node in graph.nodes:
        if node.op == "Gemm" and node.inputs[0].const is None:
            groups.setdefault(node.inputs[0].id, []).append(node)
    for gemms in groups.values():
        if len(gemms) < 2:
            continue
        found = [(g, _projection(graph, g)) for g in gemms]
        group = [(g, p) for g, p in found if p is not None]
        keys = {(g.attrs["alpha"], g.outputs[0].shape[:-1], p[0].shape[0], p[0].dtype) for g, p in group}
        if len(group) < 2 or len(keys) != 1 or group[0][0].attrs["alpha"] != 1.0:
            continue
        width = sum(p[0].shape[1] for _, p in group)
        if any(view_strides(v.shape, p[0].shape[1], width) is None for _, p in group for _, v in p[2]):
            continue
        _pack(graph, group)
        changed = True
    return changed


# ------------------------------------------------------------------------------------------- packed projections


def _split_source(graph, gather):
    """(P, start, columns) where `gather` (axis 0, one constant index) takes columns [start, start + columns) of each
    row of value P [..., W] through the Reshapes and Transposes between them (nn.MultiheadAttention's and Swin's one
    in-projection, split as proj.unflatten(-1, (3, E)).transpose(...)[i]), else None. Decided on the element index
    map of the chain, as fold_channel_shuffles does."""
    index = gather.inputs[1]
    if gather.attrs["axis"] != 0 or index.const is None or index.size != 1 or gather.inputs[0] in graph.outputs:
        return None
    chain, v = [], gather.inputs[0]
    while v.producer is not None and v.producer.op in ("Reshape", "Transpose") and len(chain) < 8:
        chain.insert(0, v.producer)
        v = v.producer.inputs[0]
    if not any(n.op == "Transpose" for n in chain) or v.const is not None or not v.rank or v.dtype != "float32":
        return None
    width, y = v.shape[-1], gather.outputs[0]
    rows = v.size // max(width, 1)
    if not rows or y.size % rows:
        return None
    idx = np.arange(v.size, dtype=np.int64 if v.size >= 2**31 else np.int32).reshape(v.shape)
    for n in chain + [gather]:
        idx = n.spec.numpy(n, idx, *[x.const for x in n.inputs[1:]])[0]
    columns, start = y.size // rows, int(idx.flat[0])
    want = np.arange(rows)[:, None] * width + start + np.arange(columns)[None, :]
    if start + columns > width or not np.array_equal(idx.reshape(-1), want.reshape(-1)):
        return None
    return v, start, columns


def _slice_source(graph, node):
    """(P, start, columns) where Slice `node` takes whole rows of its input P but a block of its last axis (the Split
    of Hugging Face GPT-2's c_attn product into q, k and v), else None."""
    x, a = node.inputs[0], node.attrs
    last = x.rank - 1
    if x.const is not None or x.dtype != "float32" or last < 0 or any(st != 1 for st in a["steps"]) or \
            (x.producer is not None and x.producer.op == "ColumnView") or \
            any(a["starts"][i] != 0 or a["counts"][i] != x.shape[i] for i in range(last)):
        return None
    return x, a["starts"][last], a["counts"][last]


def split_packed_projections(graph):
    """Each Gather (through the Transpose of _split_source) or Slice (_slice_source) that takes one projection's
    columns of a packed product, read only by Attention nodes (through Reshape views or not), becomes a ColumnView
    of the product: the split's copies go."""
    changed = False
    for node in list(graph.nodes):
        if node.op not in ("Gather", "Slice") or node not in graph.nodes:
            continue
        found = _split_source(graph, node) if node.op == "Gather" else _slice_source(graph, node)
        if found is None:
            continue
        p, start, columns = found
        readers = _attention_readers(graph, node.outputs[0], columns)
        if readers is None or any(view_strides(v.shape, columns, p.shape[-1]) is None for _, v in readers):
            continue
        at = graph.nodes.index(node)
        graph.remove_node(node)
        for reshape, v in readers:
            if reshape is not None:
                graph.remove_node(reshape)
            v.producer = None
            graph.add_node(Node("ColumnView", [p], [v], {"start": start, "columns": columns, "shape": v.shape},
                                node.name), at)
        changed = True
    return changed
