"""Recognise attention in the chains exporters write for it and replace each by one Attention node (the fused kernel:
no Tq x Tk scores in memory).

    s = Gemm(q', kT')           q' = q [* or / c]..., kT' = kT [* or / c]... (PyTorch's SDPA scales both by sqrt(scale))
    s = s [* or / c]...         (q @ k.transpose(-2, -1) / sqrt(d) written by hand)
    z = s [+ m | Where(cond, s, fill)]...   (float masks, bool masks as Where(m, 0, -inf), causal masks, padding)
    p = Softmax(z, last axis) [-> Where(IsNaN(p), 0, p)]   (the NaN guard PyTorch writes with a bool mask)
    y = Gemm(p, v)

c: one-element constants (not trainable weights: a training graph keeps those where they are). kT: K is read back
through the Transpose and the leading-dim Reshapes that made it (a new Transpose where no Transpose did), and through
the Reshape(Expand(Reshape(k))) that repeats grouped-query heads. A constant mask that is exactly a causal triangle
becomes the kernel's causal flag, one that hides nothing goes. A row with every key hidden gives 0 (ONNX Attention's
rule, and PyTorch's eager scaled_dot_product_attention's) where the decomposition gives NaN (0 after PyTorch's
guard) or, with float32's lowest in place of -inf, the mean of v.

Rank-4 q, k, v are read where they were stored before the head Transposes and Reshape views that made them (the
node's `layout`: "bthd" for the Reshape of a [B, T, H * D] projection), and y is written in the order of the
Transpose that was its only reader: the kernel reads and writes through strides, the Transposes (copies) go.
"""
from itertools import permutations

import numpy as np

from ..ir import Node
from ..ops import get_op
from ..ops.attention import DEFAULT_LAYOUT, LOGICAL, MAX_RANK, stored_shape

# a bias this low hides a key as -inf does: PyTorch writes float32's lowest (-3.4e38) for causal and bool masks, and
# s + lowest rounds to lowest (or -inf) for any score |s| < 1e31
FILL_LIMIT = -1e30


def _scalar(v):
    """The value of a one-element constant that is not a trainable weight, else None."""
    if v is None or v.const is None or v.size != 1 or v.param:
        return None
    return float(np.asarray(v.const, np.float64).reshape(()))


def _scale_of(node, x):
    """The factor node = x * c or x / c applies (c: _scalar, x the other operand, of node's shape), else None."""
    if node is None or node.op not in ("Mul", "Div") or x not in node.inputs or node.outputs[0].shape != x.shape:
        return None
    a, c = node.inputs
    if node.op == "Mul" and a is not x:
        a, c = c, a
    f = _scalar(c) if a is x and c is not x else None
    if f is None or (node.op == "Div" and f == 0):
        return None
    return 1.0 / f if node.op == "Div" else f


def _peel(x):
    """(y, f): x = y * f through a chain of Mul / Div by constants (readers of the chain elsewhere keep it)."""
    factor = 1.0
    while x.producer is not None and x.producer.op in ("Mul", "Div"):
        n = x.producer
        y = n.inputs[0] if n.inputs[0].shape == x.shape and n.inputs[0].const is None else n.inputs[1]
        f = _scale_of(n, y)
        if f is None:
            break
        x, factor = y, factor * f
    return x, factor


def _sole(graph, v, node):
    """`node` is the only reader of v, which is no graph output."""
    return v not in graph.outputs and len(v.users) == 1 and v.users[0] is node


def _walk(graph, x, masks, nodes, factor, scaling):
    """From score value x back to the Q K^T product: (gemm, factor, masks, nodes) or None. masks: ("add", m) or
    ("where", cond, fill, keep) as met; once a scale is met (scaling) no mask may follow. The nodes may have other
    readers (an exporter that computed the scores once for two softmaxes): those keep them."""
    n = x.producer
    if n is None or x.dtype != "float32":
        return None
    if n.op == "Gemm":
        if n.attrs["transA"] or len(n.inputs) != 2 or n.attrs.get("act"):
            return None
        return n, factor * n.attrs["alpha"], masks, nodes + [n]
    if n.op in ("Mul", "Div"):
        for y in n.inputs:
            f = _scale_of(n, y) if y.shape == x.shape else None
            if f is not None:
                return _walk(graph, y, masks, nodes + [n], factor * f, True)
        return None
    if scaling:
        return None
    if n.op == "Add":
        for s, m in (n.inputs, n.inputs[::-1]):
            if s is not m and s.shape == x.shape and m.rank <= MAX_RANK and m.dtype == "float32":
                found = _walk(graph, s, masks + [("add", m)], nodes + [n], factor, False)
                if found is not None:
                    return found
        return None
    if n.op == "Where":
        cond, a, c = n.inputs
        for s, fill, keep in ((a, c, True), (c, a, False)):
            f = _scalar(fill)
            if s is not fill and s.shape == x.shape and f is not None and f <= FILL_LIMIT and cond.rank <= MAX_RANK:
                found = _walk(graph, s, masks + [("where", cond, f, keep)], nodes + [n], factor, False)
                if found is not None:
                    return found
    return None


def _tail(graph, softmax):
    """(final gemm, [guard nodes]) when the softmax's output only feeds (through PyTorch's NaN guard or not) the A side
    of a plain product, else None."""
    p = softmax.outputs[0]
    if p in graph.outputs:
        return None
    users, guard = set(p.users), []
    if len(users) == 2 and len(p.users) == 2:
        isnan = next((u for u in users if u.op == "IsNaN"), None)
        where = next((u for u in users if u.op == "Where"), None)
        if isnan is None or where is None or not _sole(graph, isnan.outputs[0], where) or \
                where.inputs[0] is not isnan.outputs[0] or _scalar(where.inputs[1]) != 0.0 or where.inputs[2] is not p:
            return None
        guard, p = [isnan, where], where.outputs[0]
        if p in graph.outputs or len(p.users) != 1:
            return None
    elif len(p.users) != 1:
        return None
    final = p.users[0]
    if final.op != "Gemm" or final.inputs[0] is not p or final.inputs[1] is p or len(final.inputs) != 2 or \
            final.attrs["transA"] or final.attrs["alpha"] != 1.0 or final.attrs.get("act"):
        return None
    return final, guard


class _Emitter:
    """New nodes inserted one after the other before `before`; a node of constants (not weights) folded at once."""

    def __init__(self, graph, before):
        self.graph, self.before = graph, before
        self.nodes = []  # (those left unread at the end go)

    def op(self, op, inputs, attrs=None):
        spec = get_op(op)
        node = Node(op, inputs, [], attrs or {}, self.before.name)
        types = spec.infer(node)
        if spec.numpy is not None and all(v.const is not None and not v.param for v in inputs):
            out = spec.numpy(node, *[v.const for v in inputs])[0]
            return self.graph.constant(np.asarray(out, types[0][0]).reshape(types[0][1]))
        node.outputs = [self.graph.new_value(dt, shape) for dt, shape in types]
        self.graph.add_node(node, self.graph.nodes.index(self.before))
        self.nodes.append(node)
        return node.outputs[0]


def _leading_view(n):
    """A Reshape that only merges or splits the dims before the last two."""
    return n is not None and n.op == "Reshape" and n.inputs[0].rank >= 2 and \
        n.inputs[0].shape[-2:] == n.outputs[0].shape[-2:]


def _unviewed(x):
    while _leading_view(x.producer):
        x = x.producer.inputs[0]
    return x


def _swapped(em, x, lead):
    """A value y [*lead, b, a] with x [..., a, b] = y.swapaxes(-1, -2) up to leading-dim views: read through the
    Transpose that made x where one did, else a new Transpose."""
    src = _unviewed(x)
    n = src.producer
    if n is not None and n.op == "Transpose":
        perm = tuple(n.attrs["perm"])
        src, perm = n.inputs[0], perm[:-2] + (perm[-1], perm[-2])
    else:
        perm = tuple(range(src.rank - 2)) + (src.rank - 1, src.rank - 2)
    if perm != tuple(range(src.rank)):
        src = em.op("Transpose", [src], {"perm": perm})
    return _with_lead(em, _unviewed(src), lead)


def _with_lead(em, y, lead):
    shape = tuple(lead) + y.shape[-2:]
    return y if y.shape == shape else em.op("Reshape", [y], {"shape": shape})


def _kv_heads(em, x):
    """x [..., H, T, D], or its un-repeated [..., Hk, T, D] where x = Reshape(Expand(Reshape(k))) repeats each of
    k's heads H / Hk times in place (grouped-query attention as PyTorch and Hugging Face write it)."""
    n = x.producer
    if x.rank < 3 or n is None or n.op != "Reshape" or n.inputs[0].producer is None:
        return x
    expand = n.inputs[0].producer
    lead, (h, t, d) = x.shape[:-3], x.shape[-3:]
    if expand.op != "Expand" or expand.inputs[0].rank != x.rank + 1:
        return x
    one = expand.inputs[0]
    hk = one.shape[-4]
    if one.shape != lead + (hk, 1, t, d) or expand.outputs[0].shape != lead + (hk, h // hk, t, d) or h % hk:
        return x
    return em.op("Reshape", [one], {"shape": lead + (hk, t, d)})


def _contiguous(shape):
    strides, step = [0] * len(shape), 1
    for a in reversed(range(len(shape))):
        strides[a], step = step, step * shape[a]
    return strides


def _axis_of(shape, stride):
    """(axis, multiple): the axis of contiguous `shape` along which a step of `stride` elements goes, else None."""
    step = 1
    for j in reversed(range(len(shape))):
        if shape[j] > 1 and step <= stride < step * shape[j]:
            return (j, stride // step) if stride % step == 0 else None
        step *= shape[j]
    return None


def _through_transpose(node, strides, extents):
    """The element strides in the Transpose's input of the axes (of these extents) that step `strides` through its
    output; None where an axis does not stay within one axis of the output."""
    out, perm = node.outputs[0].shape, tuple(node.attrs["perm"])
    src = _contiguous(node.inputs[0].shape)
    reach, new = [0] * len(out), []
    for s, n in zip(strides, extents, strict=True):
        found = _axis_of(out, s) if n > 1 else (0, 0)
        if found is None:
            return None
        j, c = found
        reach[j] += (n - 1) * c
        new.append(c * src[perm[j]])
    return None if any(r >= d for r, d in zip(reach, out, strict=True)) else new


def _layout_of(strides, extents):
    """The layout (an order of b, h and t, then d) whose contiguous stored shape has these strides, else None."""
    for order in permutations(LOGICAL[:3]):
        layout = "".join(order) + LOGICAL[3]
        want = dict(zip(layout, _contiguous(stored_shape(extents, layout)), strict=True))
        if all(n == 1 or s == want[c] for c, s, n in zip(LOGICAL, strides, extents, strict=True)):
            return layout
    return None


def _stored(em, x, walked):
    """(value, layout) of the operand x [B, H, T, D] ([H, T, D]: B 1): read where it was stored before the Reshape
    views and Transposes that made it (a Reshape view of that value in the layout's shape), or x itself in bhtd. The
    nodes passed go to `walked`."""
    extents, cur = (1,) * (MAX_RANK - x.rank) + x.shape, x
    strides = _contiguous(extents)
    best = (x, LOGICAL)
    while cur.producer is not None and cur.producer.op in ("Reshape", "Transpose"):
        n = cur.producer
        if n.op == "Transpose":
            strides = _through_transpose(n, strides, extents)
            if strides is None:
                break
        walked.append(n)
        cur = n.inputs[0]
        layout = _layout_of(strides, extents)
        if layout is not None:
            best = (cur, layout)
    src, layout = best
    shape = stored_shape(extents, layout)
    if src.shape == shape:
        return src, layout
    view = next((u.outputs[0] for u in src.users if u.op == "Reshape" and u.outputs[0].shape == shape), None)
    return (view if view is not None else em.op("Reshape", [src], {"shape": shape})), layout


def _stored_output(graph, y):
    """(Transpose node, layout) where y [B, H, T, DV] ([H, T, DV]: B 1)'s only reader is a Transpose that keeps DV
    last (the kernel writes its output instead of y), else (None, bhtd)."""
    if y in graph.outputs or len(y.users) != 1 or y.users[0].op != "Transpose":
        return None, LOGICAL
    perm = tuple(y.users[0].attrs["perm"])
    if perm[-1] != y.rank - 1:
        return None, LOGICAL
    perm = (0,) * (MAX_RANK - y.rank) + tuple(p + MAX_RANK - y.rank for p in perm)
    return y.users[0], "".join(LOGICAL[p] for p in perm)


def _drop_unread(graph, nodes):
    """Remove those of `nodes` whose outputs nobody reads (the later first, so that chains go whole)."""
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    for n in sorted({id(n): n for n in nodes if id(n) in order}.values(), key=lambda n: -order[id(n)]):
        if not any(v.users or v in graph.outputs for v in n.outputs):
            graph.remove_node(n)


def _mask_value(em, item):
    """One mask of the chain as a bool (True: visible) or float (added) value."""
    if item[0] == "add":
        m = item[1]
        w = m.producer
        low = _scalar(w.inputs[2]) if w is not None and w.op == "Where" else None
        if low is not None and low <= FILL_LIMIT and _scalar(w.inputs[1]) == 0.0 and w.inputs[0].dtype == "bool":
            return w.inputs[0]  # Where(m, 0, -inf or lowest): the bool mask itself
        return m
    _, cond, _, keep = item  # (a fill <= FILL_LIMIT: hidden where it is written)
    if cond.dtype != "bool":
        cond = em.op("Cast", [cond], {"to": "bool"})
    return cond if keep else em.op("Not", [cond])


def _one_mask(em, values):
    """The masks as one: bool and bool: both; float and float: summed; a float where the bool shows, -inf elsewhere."""
    out = values[0]
    for m in values[1:]:
        if out.dtype == m.dtype == "bool":
            out = em.op("And", [out, m])
        elif out.dtype == m.dtype:
            out = em.op("Add", [out, m])
        else:
            shown, added = (out, m) if out.dtype == "bool" else (m, out)
            out = em.op("Where", [shown, added, em.graph.constant(np.asarray(-np.inf, np.float32))])
    return out


def _causal_offset(mask, tq, tk):
    """(True, offset) when constant `mask` (broadcast over every leading dim) is exactly the causal triangle j <=
    i + offset; (True, None) when it hides nothing; (False, None) otherwise."""
    if mask.const is None or mask.param or any(d != 1 for d in mask.shape[:-2]):
        return False, None
    m = np.broadcast_to(np.asarray(mask.const).reshape(mask.shape[-2:]), (tq, tk))
    visible = m if m.dtype == np.bool_ else m == 0
    if m.dtype != np.bool_ and not np.all(visible | (m <= FILL_LIMIT)):
        return False, None
    if visible.all():
        return True, None
    counts = visible.sum(axis=1)
    rows = np.nonzero((counts > 0) & (counts < tk))[0]
    if not len(rows):
        return False, None
    offset = int(counts[rows[0]] - 1 - rows[0])
    ok = np.array_equal(visible, np.arange(tk)[None, :] <= np.arange(tq)[:, None] + offset)
    return (True, offset) if ok else (False, None)


def _match(graph, softmax):
    z = softmax.inputs[0]
    if z.dtype != "float32" or not 2 <= z.rank <= MAX_RANK or softmax.attrs["axis"] % z.rank != z.rank - 1:
        return None
    tail = _tail(graph, softmax)
    found = _walk(graph, z, [], [], 1.0, False) if tail is not None else None
    if found is None:
        return None
    final, guard = tail
    qk, factor, masks, chain = found
    (q, fq), (kt, fk) = _peel(qk.inputs[0]), _peel(qk.inputs[1])
    v = final.inputs[1]
    lead = z.shape[:-2]
    if q.shape[:-2] != lead or kt.shape[:-2] != lead or v.shape[:-2] != lead or q.dtype != "float32":
        return None
    return {"final": final, "nodes": [final] + guard[::-1] + [softmax] + chain, "q": q, "kt": kt, "v": v, "lead": lead,
            "trans_k": qk.attrs["transB"], "trans_v": final.attrs["transB"], "scale": factor * fq * fk, "masks": masks}


def _rewrite(graph, m):
    final = m["final"]
    em = _Emitter(graph, final)
    lead = m["lead"]
    k = _with_lead(em, _unviewed(m["kt"]), lead) if m["trans_k"] else _swapped(em, m["kt"], lead)
    v = _swapped(em, m["v"], lead) if m["trans_v"] else _with_lead(em, _unviewed(m["v"]), lead)
    kh, vh = _kv_heads(em, k), _kv_heads(em, v)
    if kh.shape[:-2] == vh.shape[:-2]:  # (else one of them repeats its heads and the other not: both as they are)
        k, v = kh, vh
    values = [_mask_value(em, item) for item in m["masks"]]
    y, q, tk = final.outputs[0], m["q"], k.shape[-2]
    attrs = {"scale": float(m["scale"]), "causal": 0, "causal_offset": 0, "softcap": 0.0, "layout": DEFAULT_LAYOUT}
    inputs = [q, k, v]
    if values:
        mask = _one_mask(em, values)
        known, offset = _causal_offset(mask, m["q"].shape[-2], tk)
        if known and offset is not None:
            attrs.update(causal=1, causal_offset=offset)
        elif not known:
            inputs.append(mask)
    graph.add_node(Node("Attention", inputs, [y], attrs, final.name), graph.nodes.index(final))
    for n in m["nodes"]:  # from the product back; a node whose output another node reads stays
        if n is final or not any(v.users or v in graph.outputs for v in n.outputs):
            graph.remove_node(n)
    _drop_unread(graph, em.nodes)


def _absorb_layouts(graph, node):
    """A rank-4 Attention node in bhtd (fused here or imported) reads its operands where they were stored and writes
    its output in the order of the Transpose that reads it; the Transposes and views nothing else reads go. A rank-3
    one ([B * H, T, D], nn.MultiheadAttention's products) becomes rank 4 with B 1 where that removes a Transpose. True
    where a layout changed."""
    y = node.outputs[0]
    if node.attrs["layout"] != DEFAULT_LAYOUT or node.inputs[0].rank not in (MAX_RANK - 1, MAX_RANK):
        return False
    em, walked = _Emitter(graph, node), []
    stored = [_stored(em, x, walked) for x in node.inputs[:3]]
    out, ly = _stored_output(graph, y)
    layout = tuple(s for _, s in stored) + (ly,)
    if layout == DEFAULT_LAYOUT:
        _drop_unread(graph, em.nodes)
        return False
    for i, (x, _) in enumerate(stored):
        graph.set_input(node, i, x)
    node.attrs = dict(node.attrs, layout=layout)
    target = y if out is None else out.outputs[0]
    if out is not None:
        graph.remove_node(out)
    shape = stored_shape((1,) * (MAX_RANK - y.rank) + y.shape, ly)
    if target.shape == shape:
        node.outputs = [target]
        target.producer = node
    else:  # (rank 3: the node writes [1, ...] and a view gives the value its shape)
        node.outputs = [graph.new_value(y.dtype, shape)]
        node.outputs[0].producer = node
        graph.add_node(Node("Reshape", node.outputs, [target], {"shape": target.shape}, node.name),
                       graph.nodes.index(node) + 1)
    _drop_unread(graph, walked + em.nodes)
    return True


def fused_attention_grads(graph, applies=None):
    """Every Attention node (for which `applies(node)`, where given) takes its fused gradient rule (Attention's
    fused_grad: one AttentionGrad node, no T x T scores) where that applies, before autodiff."""
    changed = False
    for node in graph.nodes:
        if node.op == "Attention" and not node.attrs["fused_grad"] and (applies is None or applies(node)):
            node.attrs["fused_grad"] = 1
            changed = True
    return changed


def fuse_attention(graph):
    """Replace each recognised Q K^T -> [scale] -> [mask] -> Softmax -> V chain by one Attention node; then every
    Attention node takes its operands' layouts."""
    changed = False
    for node in list(graph.nodes):
        if node.op == "Softmax" and node in graph.nodes:
            found = _match(graph, node)
            if found is not None:
                _rewrite(graph, found)
                changed = True
    for node in list(graph.nodes):
        if node.op == "Attention":
            changed = _absorb_layouts(graph, node) or changed
    return changed
