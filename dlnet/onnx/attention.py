"""Attention (op-sets 23, 24, 25), as onnx.reference's op_attention computes it: one Attention IR node (the fused
kernel) reading the cache-concatenated keys and values; the masks the kernel does not take on its own (the
per-batch ones of nonpad_kv_seqlen, the windows of 25) built as one bool mask; qk_matmul_output, where asked for,
by the decomposition (it is the Tq x Tk scores the kernel never holds)."""
import math

import numpy as np

from ..errors import ModelError
from ..graph.ops.attention import masked_softmax, repeat_heads, score_bias
from .common import handler, reshape, widen_float16

# softmax_precision: the kernel's softmax is float32 for each of these (the reference's float16 / bfloat16 round
# less; its float64 more, within the node cases' tolerance)
SOFTMAX_PRECISIONS = {1: "float", 10: "float16", 11: "double", 16: "bfloat16"}


def _heads_first(b, x, heads, what):
    """[B, S, heads * size] -> [B, heads, S, size] (3-D inputs)."""
    n, s, hidden = x.shape
    if heads <= 0 or hidden % heads:
        raise ModelError(f"{what} of hidden size {hidden} does not split into {heads} heads")
    return b.op("Transpose", [reshape(b, x, (n, s, heads, hidden // heads))], {"perm": (0, 2, 1, 3)})


def _layout(imp, q, k, v, at):
    """q, k, v as [B, heads, S, size], and whether they came as 3-D [B, S, hidden]."""
    if not q.rank == k.rank == v.rank or q.rank not in (3, 4):
        raise ModelError(f"Q {list(q.shape)}, K {list(k.shape)} and V {list(v.shape)}: expected all 3-D "
                         "[batch, seq, hidden] or all 4-D [batch, heads, seq, head size]")
    given = [name for name in ("q_num_heads", "kv_num_heads") if name in at]
    if q.rank == 4:
        if given and imp.opset >= 25:  # (op-set 25 forbids them with 4-D inputs; 23 and 24 ignore them)
            raise ModelError(f"{' and '.join(given)} must not be set for 4-D inputs (op-set 25)")
        return q, k, v, False
    if len(given) < 2:
        raise ModelError("3-D inputs need the q_num_heads and kv_num_heads attributes")
    b = imp.b
    hq, hk = at["q_num_heads"], at["kv_num_heads"]
    return _heads_first(b, q, hq, "Q"), _heads_first(b, k, hk, "K"), _heads_first(b, v, hk, "V"), True


def _cache(b, x, past, what):
    """present = concat(past, x) along the sequence (axis 2), or x without a past."""
    if past is None:
        return x
    if past.rank != 4 or past.shape[:2] != x.shape[:2] or past.shape[3] != x.shape[3]:
        raise ModelError(f"past_{what} {list(past.shape)} does not match the new {what}s {list(x.shape)} "
                         "(expected [batch, kv heads, past length, head size])")
    return b.op("Concat", [past, x], {"axis": 2})


def _padded(b, mask, tk):
    """attn_mask padded along its last axis to the tk keys (False / -inf: the keys beyond it are not attended)."""
    short = tk - mask.shape[-1]
    if short < 0:
        raise ModelError(f"attn_mask {list(mask.shape)} has more keys than the {tk} of K (past included)")
    if short == 0:
        return mask
    fill = np.zeros if mask.dtype == "bool" else lambda s, dtype: np.full(s, -np.inf, dtype)
    return b.op("Concat", [mask, b.const(fill(mask.shape[:-1] + (short,), mask.dtype))], {"axis": mask.rank - 1})


def _structure(b, tq, tk, batch, offset, nonpad, causal, window):
    """The bool mask [B or 1, 1, tq, tk] of the per-batch and window conditions (None: none). Query i sits at
    i + offset, offset = nonpad[b] - tq per batch when nonpad_kv_seqlen is given (op-set 24): key j is visible iff
    j < nonpad[b], j <= i + offset (causal, left to the kernel without nonpad), i + offset - j <= left and
    j - i - offset <= right (op-set 25's windows, -1: unbounded)."""
    rel = np.arange(tq)[:, None] - np.arange(tk)[None, :]  # i - j
    left, right = window
    bounds = ([(-1, 0)] if causal and nonpad is not None else []) + ([(1, left)] if left >= 0 else []) + \
        ([(-1, right)] if right >= 0 else [])  # (sign, limit): sign * (i - j + offset) <= limit
    conds = []
    if nonpad is not None:
        lens = b.op("Reshape", [nonpad], {"shape": (batch, 1, 1, 1)})
        conds.append(b.op("Less", [b.const(np.arange(tk, dtype=nonpad.dtype)), lens]))
        shift = b.op("Sub", [lens, b.const(np.asarray(tq, nonpad.dtype))])  # offset[b]
        at = b.op("Add", [b.const(rel.astype(nonpad.dtype)), shift])
    for sign, limit in bounds:
        if nonpad is None:
            conds.append(b.const(sign * (rel + offset) <= limit))
        else:
            op = "LessOrEqual" if sign > 0 else "GreaterOrEqual"
            conds.append(b.op(op, [at, b.const(np.asarray(sign * limit, nonpad.dtype))]))
    if not conds:
        return None
    out = conds[0]
    for c in conds[1:]:
        out = b.op("And", [out, c])
    return out


def _combined(b, mask, structure):
    """attn_mask and the structural bool mask as one mask (bool: both; float: -inf where the structure hides)."""
    if structure is None:
        return mask
    if mask is None:
        return structure
    if mask.dtype == "bool":
        return b.op("And", [mask, structure])
    return b.op("Where", [structure, mask, b.const(np.asarray(-np.inf, mask.dtype))])


def _qk_output(b, q, k, mask, attrs, mode):
    """qk_matmul_output: the scaled scores (modes 0 and 1, softcapped as the reference does), with the bias (2), or
    their softmax with rows that see no key 0 (3)."""
    group = q.shape[1] // k.shape[1]
    s = b.op("Gemm", [q, repeat_heads(b, k, group)], {"transB": 1, "alpha": attrs["scale"]})
    cap = attrs["softcap"]
    if cap > 0:
        t = b.op("Tanh", [b.op("Mul", [s, b.const(np.asarray(1.0 / cap, s.dtype))])])
        s = b.op("Mul", [t, b.const(np.asarray(cap, s.dtype))])
    if mode < 2:
        return s
    bias, empty = score_bias(b, s.dtype, *s.shape[-2:], mask, attrs["causal"], attrs["causal_offset"])
    z = s if bias is None else b.op("Add", [s, bias])
    if mode == 2:
        return z if z.shape == s.shape else b.op("Expand", [z], {"shape": s.shape})
    return masked_softmax(b, z, empty)


def _check(q, at):
    if q.dtype != "float32":
        raise ModelError(f"dtype {q.dtype} is not supported (supported: float32, float16)")
    precision = at.get("softmax_precision")
    if precision is not None and precision not in SOFTMAX_PRECISIONS:
        raise ModelError(f"softmax_precision {precision} is not supported (supported: "
                         f"{', '.join(f'{k} ({v})' for k, v in SOFTMAX_PRECISIONS.items())})")
    mode = at.get("qk_matmul_output_mode", 0)
    if mode not in (0, 1, 2, 3):
        raise ModelError(f"qk_matmul_output_mode {mode}: expected 0, 1, 2 or 3")
    return mode


@handler("Attention", 23, 24, 25)  # 24 adds nonpad_kv_seqlen; 25 the sliding window (left/right_window_size)
@widen_float16
def _attention(imp, node, xs, at):
    b = imp.b
    q, k, v, mask, past_k, past_v, nonpad = (list(xs) + [None] * 7)[:7]
    mode = _check(q, at)
    if (past_k is None) != (past_v is None):
        raise ModelError("past_key and past_value must be given together")
    if nonpad is not None and past_k is not None:
        raise ModelError("nonpad_kv_seqlen cannot be combined with past_key / past_value")
    q, k, v, flat = _layout(imp, q, k, v, at)
    k, v = _cache(b, k, past_k, "key"), _cache(b, v, past_v, "value")
    batch, hq, tq, size = q.shape
    hk, tk = k.shape[1], k.shape[2]
    if hq % hk or v.shape[1] != hk:
        raise ModelError(f"{hq} query heads, {hk} key and {v.shape[1]} value heads: the key and value heads must be "
                         "equal and divide the query heads")
    causal = bool(at.get("is_causal", 0))
    offset = past_k.shape[2] if past_k is not None else 0
    window = (at.get("left_window_size", -1), at.get("right_window_size", -1))
    structure = _structure(b, tq, tk, batch, offset, nonpad, causal, window)
    mask = _padded(b, mask, tk) if mask is not None else None
    mask = _combined(b, mask, structure)
    scale = at.get("scale", 1.0 / math.sqrt(size))
    attrs = {"scale": float(scale), "softcap": float(at.get("softcap", 0.0)), "causal": int(causal and nonpad is None),
             "causal_offset": int(offset)}
    y = b.op("Attention", [q, k, v] + ([mask] if mask is not None else []), attrs)
    if flat:  # back to [B, S, heads * head size]
        y = reshape(b, b.op("Transpose", [y], {"perm": (0, 2, 1, 3)}), (batch, tq, hq * v.shape[3]))
    outs = [y, k, v]
    if len(node.output) > 3 and node.output[3]:
        outs.append(_qk_output(b, q, k, mask, attrs, mode))
    return outs

