"""Scaled dot-product attention as one op: the fused kernel (kernels/families/attention.py) runs it without the
T x T scores; its gradient is the decomposition (recomputed scores, softmax, products), or with `fused_grad` one
AttentionGrad node (kernels/cl/attention_grad.cl: no T x T scores either)."""
import numpy as np

from .base import REQUIRED, Op, register

MAX_RANK = 4  # q, k, v: [T, D], [H, T, D] or [B, H, T, D]; the mask broadcasts to [B, Hq, Tq, Tk]
# The axes of q, k, v and y in memory (the `layout` attribute, one per operand): "bhtd" [B, H, T, D] is the default;
# any order of b, h and t with d last names a rank-4 operand stored so ("bthd": [B, T, H, D], a Reshape view of the
# projections' [B, T, H * D], no head Transpose).
LOGICAL = "bhtd"
DEFAULT_LAYOUT = (LOGICAL,) * 4


def check_layout(layout, shapes):
    """ValueError unless `layout` is four permutations of bhtd with d last, the non-default ones of rank-4 operands."""
    if not isinstance(layout, tuple) or len(layout) != 4:
        raise ValueError(f"Attention: layout must be 4 strings (q, k, v, y), got {layout!r}")
    for name, s, shape in zip("qkvy", layout, shapes, strict=True):
        if not isinstance(s, str) or sorted(s) != sorted(LOGICAL) or s[-1] != "d":
            raise ValueError(f"Attention: layout of {name} must be an order of b, h, t then d, got {s!r}")
        if s != LOGICAL and len(shape) != MAX_RANK:
            raise ValueError(f"Attention: layout {s} of {name} needs a rank-4 {name}, got {list(shape)}")


def to_logical(layout):
    """The perm with logical [B, H, T, D] = stored.transpose(perm)."""
    return tuple(layout.index(c) for c in LOGICAL)


def to_stored(layout):
    """The perm with stored = logical [B, H, T, D].transpose(perm)."""
    return tuple(LOGICAL.index(c) for c in layout)


def logical_shape(shape, layout):
    return tuple(shape) if layout == LOGICAL else tuple(shape[i] for i in to_logical(layout))


def stored_shape(shape, layout):
    return tuple(shape) if layout == LOGICAL else tuple(shape[i] for i in to_stored(layout))


def lead4(shape):
    """(B, H) of a q / k / v shape [..., T, D] read as [B, H, T, D]."""
    lead = (1,) * (MAX_RANK - len(shape)) + tuple(shape)
    return lead[0], lead[1]


def causal_allowed(tq, tk, offset):
    """bool [tq, tk]: key j is visible to query i iff j <= i + offset (ONNX Attention's bottom-right alignment for
    offset = the cached keys before the block; PyTorch's is_causal: offset 0)."""
    return np.arange(tk)[None, :] <= np.arange(tq)[:, None] + offset


def additive(mask, dtype):
    """A mask as the bias it adds: a bool mask (True: attend) as 0 / -inf, a float mask as itself."""
    if mask.dtype == np.bool_:
        return np.where(mask, 0.0, -np.inf).astype(dtype)
    return mask.astype(dtype)


@register
class Attention(Op):
    """y = softmax(z) v,  z = cap(scale q k^T) + mask (+ -inf where j > i + causal_offset when causal), cap(s) =
    softcap tanh(s / softcap) when softcap > 0; a row with no visible key (every z -inf) is 0. Grouped-query: q head
    h reads k / v head h // (Hq / Hk).  dv = p^T dy, ds = p (dp - rowsum(dp p)) with dp = dy v^T, dmask = ds,
    dq = scale cap'(s) ds k, dk = scale cap'(s) ds^T q (k / v gradients summed over each kv head's q heads).
    fused_grad: the gradient as one AttentionGrad node where it applies (no softcap; no mask, or a bool or constant
    one), else the decomposition (passes/attention.py fused_attention_grads sets it for training).

    Inputs q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv], optional mask (float: added; bool: True attends) that
    broadcasts to [..., Hq, Tq, Tk]; ranks 2 to 4, leading dims of q and k equal but for the heads axis (-3). Each of
    q, k, v and y is stored in the order its `layout` names (rank 4; the shapes above are the logical bhtd ones)."""
    name = "Attention"
    dtypes = ("float32",)
    attrs = {"scale": REQUIRED, "causal": 0, "causal_offset": 0, "softcap": 0.0, "layout": DEFAULT_LAYOUT,
             "fused_grad": 0}

    def infer(self, node):
        layout = node.attrs["layout"]
        check_layout(layout, [x.shape for x in node.inputs[:3]] + [node.inputs[0].shape])
        q, k, v = (_Logical(x, s) for x, s in zip(node.inputs[:3], layout, strict=False))
        mask = node.inputs[3] if len(node.inputs) > 3 else None
        if not 2 <= q.rank <= MAX_RANK or k.rank != q.rank or v.rank != q.rank:
            raise ValueError(f"Attention takes q, k, v of one rank in 2..{MAX_RANK}, got {list(q.shape)}, "
                             f"{list(k.shape)}, {list(v.shape)}")
        if k.shape[-1] != q.shape[-1] or v.shape[-2] != k.shape[-2] or v.shape[:-2] != k.shape[:-2]:
            raise ValueError(f"Attention: q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)} do not agree "
                             "(q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv])")
        if q.shape[:-3] != k.shape[:-3] or (q.rank > 2 and q.shape[-3] % k.shape[-3]):
            raise ValueError(f"Attention: the heads of k {list(k.shape)} must divide those of q {list(q.shape)} "
                             "(the other leading dims equal)")
        scores = q.shape[:-1] + (k.shape[-2],)
        if mask is not None:
            if mask.dtype not in ("bool", q.dtype) or mask.rank > MAX_RANK or \
                    np.broadcast_shapes(mask.shape, scores) != scores:
                raise ValueError(f"Attention: mask {mask.type_str()} must be bool or {q.dtype} and broadcast to "
                                 f"the scores {list(scores)}")
        return [(q.dtype, stored_shape(q.shape[:-1] + (v.shape[-1],), layout[3]))]

    def numpy(self, node, q, k, v, mask=None):
        a = node.attrs
        dt, out = np.float64, q.dtype
        q, k, v = (_np_permuted(x, to_logical(s)).astype(dt) for x, s in zip((q, k, v), a["layout"], strict=False))
        if q.ndim > 2 and q.shape[-3] != k.shape[-3]:
            group = q.shape[-3] // k.shape[-3]
            k, v = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
        s = np.matmul(q, np.swapaxes(k, -1, -2)) * a["scale"]
        if a["softcap"] > 0:
            s = a["softcap"] * np.tanh(s / a["softcap"])
        if a["causal"]:
            s = s + additive(causal_allowed(s.shape[-2], s.shape[-1], a["causal_offset"]), dt)
        if mask is not None:
            s = s + additive(mask, dt)
        top = s.max(axis=-1, keepdims=True)
        e = np.exp(s - np.where(np.isneginf(top), 0.0, top))
        total = e.sum(axis=-1, keepdims=True)
        y = np.matmul(e / np.where(total == 0, 1.0, total), v).astype(out)
        return [np.ascontiguousarray(_np_permuted(y, to_stored(a["layout"][3])))]

    def lower(self, node, lw):
        lw.attention(node)

    def grad(self, b, node, dys):
        mask = node.inputs[3] if len(node.inputs) > 3 else None
        a = node.attrs
        if a["fused_grad"] and a["softcap"] == 0 and (mask is None or mask.dtype == "bool" or mask.const is not None):
            keep = {name: a[name] for name in ("scale", "causal", "causal_offset", "layout")}
            dq, dk, dv, _ = b.op("AttentionGrad", node.inputs[:3] + [node.outputs[0], dys[0]] + node.inputs[3:], keep,
                                 n_out=4)
            return [dq, dk, dv, None]
        return attention_grad(b, node, dys[0])


@register
class AttentionGrad(Op):
    """dq, dk, dv, stats = the gradients of Attention(q, k, v[, mask]) (its attributes, but softcap) from its output
    y and dy: ds = p (dp - rowsum(dy y)), dp = dy v^T, each score and p recomputed from its row's log-sum-exp, never
    the T x T matrices (kernels/cl/attention_grad.cl). stats [B * Hq * Tq * 2]: each query row's log-sum-exp (+inf
    where it sees no key) and rowsum(dy y). The mask is bool or float and gets no gradient."""
    name = "AttentionGrad"
    dtypes = ("float32",)
    attrs = {"scale": REQUIRED, "causal": 0, "causal_offset": 0, "layout": DEFAULT_LAYOUT}

    def infer(self, node):
        q, k, v = node.inputs[:3]
        lq = logical_shape(q.shape, node.attrs["layout"][0])
        rows = int(np.prod(lead4(lq), dtype=np.int64)) * lq[-2]
        return [(q.dtype, q.shape), (k.dtype, k.shape), (v.dtype, v.shape), ("float32", (rows * 2,))]

    def numpy(self, node, q, k, v, y, dy, mask=None):
        a, dt = node.attrs, np.float64
        lay = a["layout"]
        q, k, v, y, dy = (_np_permuted(x, to_logical(s)).astype(dt)
                          for x, s in zip((q, k, v, y, dy), lay + lay[3:], strict=True))
        group = q.shape[-3] // k.shape[-3] if q.ndim > 2 else 1
        ke, ve = (np.repeat(x, group, axis=-3) for x in (k, v)) if group > 1 else (k, v)
        s = np.matmul(q, np.swapaxes(ke, -1, -2)) * a["scale"]
        if a["causal"]:
            s = s + additive(causal_allowed(s.shape[-2], s.shape[-1], a["causal_offset"]), dt)
        if mask is not None:
            s = s + additive(mask, dt)
        top = s.max(axis=-1, keepdims=True)
        top = np.where(np.isneginf(top), 0.0, top)
        e = np.exp(s - top)
        total = e.sum(axis=-1, keepdims=True)
        p = e / np.where(total == 0, 1.0, total)
        rowsum = (dy * y).sum(axis=-1, keepdims=True)
        ds = p * (np.matmul(dy, np.swapaxes(ve, -1, -2)) - rowsum)
        dq = np.matmul(ds, ke) * a["scale"]
        dk, dv = np.matmul(np.swapaxes(ds, -1, -2), q) * a["scale"], np.matmul(np.swapaxes(p, -1, -2), dy)
        if group > 1:
            dk, dv = (x.reshape(x.shape[:-3] + (k.shape[-3], group) + x.shape[-2:]).sum(axis=-3) for x in (dk, dv))
        with np.errstate(divide="ignore"):
            lse = np.where(total > 0, top + np.log(np.where(total > 0, total, 1.0)), np.inf)
        stats = np.concatenate([lse, rowsum], axis=-1).astype(np.float32).ravel()
        grads = [np.ascontiguousarray(_np_permuted(g, to_stored(s))).astype(np.float32)
                 for g, s in zip((dq, dk, dv), lay, strict=False)]
        return grads + [stats]

    def lower(self, node, lw):
        lw.attention_grad(node)


def _np_permuted(x, perm):
    return x if perm == tuple(range(len(perm))) else np.transpose(x, perm)


class _Logical:
    """The dtype, logical shape and rank of an operand stored in `layout`."""

    def __init__(self, x, layout):
        self.dtype, self.shape, self.rank = x.dtype, logical_shape(x.shape, layout), x.rank


def repeat_heads(b, x, group):
    """k or v [..., Hk, T, D] with each head repeated `group` times in place: [..., Hk * group, T, D]."""
    if group == 1:
        return x
    lead, (hk, t, d) = x.shape[:-3], x.shape[-3:]
    one = b.op("Reshape", [x], {"shape": lead + (hk, 1, t, d)})
    many = b.op("Expand", [one], {"shape": lead + (hk, group, t, d)})
    return b.op("Reshape", [many], {"shape": lead + (hk * group, t, d)})


def _sum_heads(b, g, group):
    """The gradient of repeat_heads: [..., Hk * group, T, D] summed over each head's copies."""
    if group == 1:
        return g
    lead, (hq, t, d) = g.shape[:-3], g.shape[-3:]
    split = b.op("Reshape", [g], {"shape": lead + (hq // group, group, t, d)})
    return b.op("Reduce", [split], {"mode": "sum", "axes": (len(lead) + 1,), "keepdims": 0})


def score_bias(b, dtype, tq, tk, mask, causal, causal_offset):
    """The additive bias of `dtype` scores [..., tq, tk] (causal and mask together; None without either) and whether
    some row of it may be all -inf (then the softmax of that row is NaN, to be replaced by 0 as the kernel does)."""
    bias, empty = None, False
    if causal:
        allowed = causal_allowed(tq, tk, causal_offset)
        bias = b.const(additive(allowed, dtype))
        empty = not allowed.any(axis=-1).all()
    if mask is not None:
        m = b.op("Where", [mask, b.const(np.zeros((), dtype)), b.const(np.asarray(-np.inf, dtype))]) \
            if mask.dtype == "bool" else mask
        bias = m if bias is None else b.op("Add", [bias, m])
        empty = True
    return bias, empty


def masked_softmax(b, z, empty):
    """softmax(z) over the last axis, a row of z that is all -inf 0 (not NaN) where `empty` says one may be."""
    p = b.op("Softmax", [z], {"axis": z.rank - 1})
    if not empty:
        return p
    top = b.op("Reduce", [z], {"mode": "max", "axes": (z.rank - 1,), "keepdims": 1})
    seen = b.op("Greater", [top, b.const(np.asarray(-np.inf, z.dtype))])
    return b.op("Where", [seen, p, b.const(np.zeros((), z.dtype))])


def attention_grad(b, node, dy):
    """[dq, dk, dv, dmask] of Attention by its decomposition: the scores and their softmax recomputed (operands
    stored in another layout than bhtd transposed to it, and their gradients back)."""
    a = node.attrs
    layout = a["layout"]
    q, k, v = (_permuted(b, x, to_logical(s)) for x, s in zip(node.inputs[:3], layout, strict=False))
    dy = _permuted(b, dy, to_logical(layout[3]))
    mask = node.inputs[3] if len(node.inputs) > 3 else None
    group = q.shape[-3] // k.shape[-3] if q.rank > 2 else 1
    ke, ve = repeat_heads(b, k, group), repeat_heads(b, v, group)
    cap = a["softcap"]
    bias, empty = score_bias(b, q.dtype, q.shape[-2], ke.shape[-2], mask, a["causal"], a["causal_offset"])
    c = [bias] if bias is not None and cap == 0 else []  # (the product's C: added in its epilogue, no pass of its own)
    s = b.op("Gemm", [q, ke] + c, {"transB": 1, "alpha": float(a["scale"])})
    if cap > 0:
        t = b.op("Tanh", [b.op("Mul", [s, b.const(np.asarray(1.0 / cap, s.dtype))])])
        s = b.op("Mul", [t, b.const(np.asarray(cap, s.dtype))])
    z = s if bias is None or c else b.op("Add", [s, bias])
    p = masked_softmax(b, z, empty)
    dv = b.op("Gemm", [p, dy], {"transA": 1})
    dp = b.op("Gemm", [dy, ve], {"transB": 1})
    rows = b.op("Reduce", [b.op("Mul", [dp, p])], {"mode": "sum", "axes": (z.rank - 1,), "keepdims": 1})
    ds = b.op("Mul", [p, b.op("Sub", [dp, rows])])
    dmask = ds if mask is not None and mask.dtype != "bool" else None
    if cap > 0:  # d(cap tanh(s / cap)) / ds = 1 - tanh^2
        ds = b.op("Mul", [ds, b.op("Sub", [b.const(np.ones((), s.dtype)), b.op("Mul", [t, t])])])
    dq = b.op("Gemm", [ds, ke], {"alpha": float(a["scale"])})
    dk = b.op("Gemm", [ds, q], {"transA": 1, "alpha": float(a["scale"])})
    grads = (dq, _sum_heads(b, dk, group), _sum_heads(b, dv, group))
    return [_permuted(b, g, to_stored(s)) for g, s in zip(grads, layout, strict=False)] + [dmask]


def _permuted(b, x, perm):
    return x if perm == tuple(range(len(perm))) else b.op("Transpose", [x], {"perm": perm})
