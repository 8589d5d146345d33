"""RotaryEmbedding (23) as existing IR ops: y = x * C + partner(x) * S along the head dim, where partner(x) is x with
each rotated pair swapped (one Gather of a constant permutation), and C, S are the cos / sin caches widened to the head
dim (cos twice, -sin then sin, 1 and 0 on the part not rotated). The widening happens on the caches, before the rows
are picked by position_ids, so constant caches fold at load: at run time a Gather per table, the permutation's
Gather and one fused pointwise kernel; the gradient follows from the ops' own rules."""
import numpy as np

from ..errors import ModelError
from .common import handler, reshape, widen_float16

DTYPES = ("float32",)  # the spec's T: float16 arrives widened (widen_float16), bfloat16 has no numpy dtype


def _indices(half, rot, dim, interleaved):
    """(cos, sin, partner) index vectors over the head dim: cos into [cos, 1], sin into [-sin, sin, 0], partner
    into x itself."""
    rest = dim - rot
    if interleaved:  # pairs (2i, 2i + 1)
        cos = np.repeat(np.arange(half), 2)
        sin = np.stack([np.arange(half), half + np.arange(half)], axis=1).reshape(-1)
        partner = np.arange(rot).reshape(half, 2)[:, ::-1].reshape(-1)
    else:  # halves (i, i + half)
        cos = np.concatenate([np.arange(half)] * 2)
        sin = np.arange(rot)
        partner = np.concatenate([np.arange(half, rot), np.arange(half)])
    return (np.concatenate([cos, np.full(rest, half)]), np.concatenate([sin, np.full(rest, rot)]),
            np.concatenate([partner, np.arange(rot, dim)]))


def _widened(b, cache, extra, index, negate):
    """cache [..., half] -> [..., dim]: columns of [(-cache,) cache, extra] picked by `index` (extra: 1 or 0)."""
    parts = ([b.op("Neg", [cache])] if negate else []) + [cache]
    if extra is not None:
        parts.append(b.const(np.full(cache.shape[:-1] + (1,), extra, cache.dtype)))
    table = b.op("Concat", parts, {"axis": cache.rank - 1}) if len(parts) > 1 else parts[0]
    return b.op("Gather", [table, b.const(index.astype(np.int64))], {"axis": cache.rank - 1})


@handler("RotaryEmbedding", 23)
@widen_float16  # (float16 in float32: the Gather kernels take no half where the device has no cl_khr_fp16)
def _rotary_embedding(imp, node, xs, at):
    """X [B, heads, S, head] (4-D) or [B, S, heads * head] (3-D, num_heads given); cos / sin caches [B, S, rot / 2],
    or [positions, rot / 2] rows picked by position_ids [B, S]; the first rotary_embedding_dim (0: all) of each
    head rotated by halves or by interleaved pairs."""
    b = imp.b
    x, cos, sin = xs[:3]
    pos = xs[3] if len(xs) > 3 else None
    for v, what in ((x, "X"), (cos, "cos_cache"), (sin, "sin_cache")):
        if v.dtype not in DTYPES or v.dtype != x.dtype:
            raise ModelError(f"{what} of dtype {v.dtype}: expected X's dtype, float32 or float16")
    heads = at.get("num_heads", 0)
    if x.rank == 4:
        batch, _, seq, dim = x.shape
        view = x
    elif x.rank == 3:
        batch, seq, hidden = x.shape
        if heads <= 0 or hidden % heads:
            raise ModelError(f"a 3-D X [B, S, {hidden}] needs num_heads dividing {hidden}, got num_heads={heads}")
        dim = hidden // heads
        view = reshape(b, x, (batch, seq, heads, dim))
    else:
        raise ModelError(f"X of shape {list(x.shape)}: expected [B, heads, S, head] or [B, S, hidden]")
    rot = at.get("rotary_embedding_dim", 0) or dim
    if rot % 2 or rot > dim:
        raise ModelError(f"rotary_embedding_dim {rot}: expected an even number <= the head size {dim}")
    half = rot // 2
    rows = (batch, seq) if pos is None else (cos.shape[0],)
    for v, what in ((cos, "cos_cache"), (sin, "sin_cache")):
        if v.shape != rows + (half,):
            want = "[B, S, rot / 2]" if pos is None else "[positions, rot / 2]"
            raise ModelError(f"{what} of shape {list(v.shape)}: expected {want} = {list(rows + (half,))}")
    if pos is not None and (pos.dtype != "int64" or pos.shape != (batch, seq)):
        raise ModelError(f"position_ids {pos.dtype}{list(pos.shape)}: expected int64 [{batch}, {seq}]")
    ci, si, partner = _indices(half, rot, dim, at.get("interleaved", 0))
    extra = rot < dim
    c = _widened(b, cos, 1 if extra else None, ci, False)
    s = _widened(b, sin, 0 if extra else None, si, True)
    if pos is not None:
        c, s = (b.op("Gather", [t, pos], {"axis": 0}) for t in (c, s))
    # [B, S, dim] against the heads: [B, 1, S, dim] (4-D X) or [B, S, 1, dim] (3-D X viewed as [B, S, heads, dim])
    at_heads = (batch, 1, seq, dim) if x.rank == 4 else (batch, seq, 1, dim)
    c, s = reshape(b, c, at_heads), reshape(b, s, at_heads)
    swapped = b.op("Gather", [view, b.const(partner.astype(np.int64))], {"axis": 3})
    y = b.op("Add", [b.op("Mul", [view, c]), b.op("Mul", [swapped, s])])
    return [reshape(b, y, x.shape)]
