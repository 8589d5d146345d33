"""Indexing ops: Gather, GatherElements, Scatter/ScatterElements, GatherND, ScatterND, TensorScatter."""
import numpy as np

from ..errors import ModelError
from .common import handler, norm_axis, reshape


@handler("Gather", 1, 11, 13)
def _gather(imp, node, xs, at):
    x, idx = xs
    axis = norm_axis(at.get("axis", 0), x.rank)
    return [imp.b.op("Gather", [x, idx], {"axis": axis})]


@handler("GatherElements", 11, 13)
def _gather_elements(imp, node, xs, at):
    x, idx = xs
    return [imp.b.op("GatherElements", [x, idx], {"axis": norm_axis(at.get("axis", 0), x.rank)})]


@handler("Scatter", 9, 11)
@handler("ScatterElements", 11, 13)
def _scatter_elements(imp, node, xs, at):  # Scatter (deprecated) is ScatterElements without reduction
    x, idx, upd = xs
    return [imp.b.op("ScatterElements", [x, idx, upd], {"axis": norm_axis(at.get("axis", 0), x.rank)})]


@handler("ScatterElements", 16, 18)
def _scatter_elements_16(imp, node, xs, at):  # 16 adds reduction add/mul; 18 adds max/min
    x, idx, upd = xs
    return [imp.b.op("ScatterElements", [x, idx, upd], {"axis": norm_axis(at.get("axis", 0), x.rank),
                                                         "reduction": at.get("reduction", "none")})]


def _nd_linear(imp, x, idx, batch_dims):
    """GatherND/ScatterND indices -> (x viewed as [rows, slice...], row numbers shaped idx.shape[:-1])."""
    b = imp.b
    k = idx.shape[-1]
    lead = x.shape[:batch_dims + k]
    dims = b.const(np.asarray(x.shape[batch_dims:batch_dims + k], np.int64))
    i64 = idx if idx.dtype == "int64" else b.op("Cast", [idx], {"to": "int64"})
    i64 = b.op("Where", [b.op("Less", [i64, b.const(np.asarray(0, np.int64))]), b.op("Add", [i64, dims]), i64])
    strides = np.asarray([int(np.prod(lead[batch_dims + j + 1:], dtype=np.int64)) for j in range(k)], np.int64)
    lin = b.op("Reduce", [b.op("Mul", [i64, b.const(strides)])], {"mode": "sum", "axes": (idx.rank - 1,),
                                                                   "keepdims": 0}) if k else \
        b.const(np.zeros(idx.shape[:-1], np.int64))
    if batch_dims:
        per = int(np.prod(lead[batch_dims:], dtype=np.int64))
        nb = int(np.prod(lead[:batch_dims], dtype=np.int64))
        base = np.arange(nb, dtype=np.int64).reshape(lead[:batch_dims] + (1,) * (idx.rank - 1 - batch_dims)) * per
        lin = b.op("Add", [lin, b.const(base)])
    rows = int(np.prod(lead, dtype=np.int64))
    return reshape(b, x, (rows,) + x.shape[batch_dims + k:]), lin


@handler("GatherND", 11, 12, 13)
def _gather_nd(imp, node, xs, at):  # 12 adds batch_dims
    x, idx = xs
    flat, lin = _nd_linear(imp, x, idx, at.get("batch_dims", 0))
    return [imp.b.op("Gather", [flat, lin], {"axis": 0})]


@handler("ScatterND", 11, 13, 16, 18)
def _scatter_nd(imp, node, xs, at):  # 16 adds reduction add/mul, 18 max/min: a ScatterElements over row numbers
    b = imp.b
    x, idx, upd = xs
    flat, lin = _nd_linear(imp, x, idx, 0)
    n = int(np.prod(lin.shape, dtype=np.int64))
    slice_shape = flat.shape[1:]
    width = int(np.prod(slice_shape, dtype=np.int64))
    rows = b.op("Expand", [reshape(b, lin, (n, 1))], {"shape": (n, width)}) if width != 1 else reshape(b, lin, (n, 1))
    y = b.op("ScatterElements", [reshape(b, flat, (flat.shape[0], width)), rows, reshape(b, upd, (n, width))],
             {"axis": 0, "reduction": at.get("reduction", "none")})
    return [reshape(b, y, x.shape)]


@handler("TensorScatter", 24)
def _tensor_scatter(imp, node, xs, at):
    """present[..., c, ...] = update[..., s, ...] where s = c - write_indices[batch] (mod max_len in circular mode) and
    0 <= s < seq_len, else past[..., c, ...]: a GatherElements of the update, then Where."""
    b, past, update = imp.b, xs[0], xs[1]
    axis = norm_axis(at.get("axis", -2), past.rank)
    mode = at.get("mode", "linear")
    if mode not in ("linear", "circular"):
        raise ModelError(f"mode {mode!r}: expected 'linear' or 'circular'")
    if axis == 0 or update.rank != past.rank or update.dtype != past.dtype or update.shape[axis] > past.shape[axis] \
            or any(u != p for k, (u, p) in enumerate(zip(update.shape, past.shape)) if k != axis):
        raise ModelError(f"update {update.dtype}{list(update.shape)} does not fit past_cache {past.dtype}"
                         f"{list(past.shape)} along axis {axis} (the batch axis 0 cannot be the sequence axis)")
    max_len, seq_len = past.shape[axis], update.shape[axis]
    at_axis = [1] * past.rank
    at_axis[axis] = max_len
    rel = b.const(np.arange(max_len, dtype=np.int64).reshape(at_axis))
    if len(xs) > 2 and xs[2] is not None:
        w = xs[2] if xs[2].dtype == "int64" else b.op("Cast", [xs[2]], {"to": "int64"})
        rel = b.op("Sub", [rel, reshape(b, w, (past.shape[0],) + (1,) * (past.rank - 1))])
    if mode == "circular":
        rel = b.op("Mod", [rel, b.const(np.asarray(max_len, np.int64))], {"fmod": 0})
    valid = b.op("And", [b.op("GreaterOrEqual", [rel, b.const(np.asarray(0, np.int64))]),
                         b.op("Less", [rel, b.const(np.asarray(seq_len, np.int64))])])
    index = b.op("Where", [valid, rel, b.const(np.asarray(0, np.int64))])
    shape = list(past.shape)
    shape[axis] = max_len
    index = b.op("Expand", [index], {"shape": tuple(shape)})
    gathered = b.op("GatherElements", [update, index], {"axis": axis})
    return [b.op("Where", [b.op("Expand", [valid], {"shape": tuple(shape)}), gathered, past])]
