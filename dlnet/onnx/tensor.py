"""Constants and tensor manipulation: Constant, ConstantOfShape, Shape, Size, Reshape, Flatten, Squeeze, Unsqueeze,
Transpose, Concat, Slice, Split, Expand, Tile, Range, Pad, Trilu, CenterCropPad."""
import math

import numpy as np

from ..errors import ModelError
from ..limits import MAX_ELEMENTS, over_cap
from .common import const, handler, norm_axis, pad, reshape, slice_axes


@handler("Constant", 1, 9, 11, 12, 13, 19, 21, 23, 24, 25)
def _constant(imp, node, xs, at):
    if "value" in at:
        return [imp.b.const(at["value"])]
    for key, dt in (("value_float", np.float32), ("value_int", np.int64)):
        if key in at:
            return [imp.b.const(np.asarray(at[key], dt))]
    for key, dt in (("value_floats", np.float32), ("value_ints", np.int64)):
        if key in at:
            return [imp.b.const(np.asarray(at[key], dt))]
    raise ModelError(f"Constant without a supported value attribute ({sorted(at)})")


@handler("ConstantOfShape", 9, 20, 21, 23, 24, 25)
def _constant_of_shape(imp, node, xs, at):
    shape = [int(d) for d in const(xs[0], "ConstantOfShape's shape").reshape(-1)]
    if over_cap(shape):  # (before numpy allocates it)
        raise ModelError(f"shape {shape} {over_cap(shape)}")
    value = at.get("value", np.zeros(1, np.float32))
    return [imp.b.const(np.full(tuple(shape), value.reshape(-1)[0], value.dtype))]


@handler("Shape", 1, 13)
def _shape_1(imp, node, xs, at):
    return [imp.b.const(np.asarray(xs[0].shape, np.int64))]


@handler("Shape", 15, 19, 21, 23, 24, 25)
def _shape_15(imp, node, xs, at):  # op-set 15 adds start/end
    s = xs[0].shape
    return [imp.b.const(np.asarray(s[at.get("start", 0):at.get("end", len(s))], np.int64))]


@handler("Size", 1, 13, 19, 21, 23, 24, 25)
def _size(imp, node, xs, at):
    return [imp.b.const(np.asarray(xs[0].size, np.int64))]


@handler("Reshape", 1)
def _reshape_1(imp, node, xs, at):  # op-set 1: shape is an attribute
    return [_reshape(imp, xs[0], np.asarray(at["shape"], np.int64), 0)]


@handler("Reshape", 5, 13)
def _reshape_5(imp, node, xs, at):
    return [_reshape(imp, xs[0], const(xs[1], "Reshape's shape"), 0)]


@handler("Reshape", 14, 19, 21, 23, 24, 25)
def _reshape_14(imp, node, xs, at):  # op-set 14 adds allowzero
    return [_reshape(imp, xs[0], const(xs[1], "Reshape's shape"), at.get("allowzero", 0))]


def _reshape(imp, x, shape, allowzero):
    shape = [int(d) for d in shape]
    out = []
    for i, d in enumerate(shape):
        out.append(x.shape[i] if d == 0 and not allowzero else d)
    if out.count(-1) > 1:
        raise ModelError(f"Reshape to {shape}: more than one -1")
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1], dtype=np.int64))
        out[out.index(-1)] = x.size // known if known else 0
    return reshape(imp.b, x, out)


@handler("Flatten", 1, 9, 11, 13, 21, 23, 24, 25)
def _flatten(imp, node, xs, at):
    x = xs[0]
    axis = at.get("axis", 1)
    axis = axis % x.rank if axis < 0 else axis
    outer = int(np.prod(x.shape[:axis], dtype=np.int64))
    return [reshape(imp.b, x, (outer, x.size // outer if outer else 0))]


def _squeeze(imp, x, axes):
    axes = [norm_axis(a, x.rank) for a in axes] if axes is not None else [i for i, d in enumerate(x.shape) if d == 1]
    for a in axes:
        if x.shape[a] != 1:
            raise ModelError(f"Squeeze axis {a} has size {x.shape[a]}, expected 1")
    return reshape(imp.b, x, [d for i, d in enumerate(x.shape) if i not in axes])


def _unsqueeze(imp, x, axes):
    rank = x.rank + len(axes)
    axes = sorted(norm_axis(a, rank) for a in axes)
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return reshape(imp.b, x, shape)


@handler("Squeeze", 1, 11)
def _squeeze_1(imp, node, xs, at):  # axes attribute (negative allowed from 11)
    return [_squeeze(imp, xs[0], at.get("axes"))]


@handler("Squeeze", 13, 21, 23, 24, 25)
def _squeeze_13(imp, node, xs, at):  # op-set 13: axes moved to an optional input
    axes = const(xs[1], "Squeeze's axes").tolist() if len(xs) > 1 and xs[1] is not None else None
    return [_squeeze(imp, xs[0], axes)]


@handler("Unsqueeze", 1, 11)
def _unsqueeze_1(imp, node, xs, at):
    return [_unsqueeze(imp, xs[0], at["axes"])]


@handler("Unsqueeze", 13, 21, 23, 24, 25)
def _unsqueeze_13(imp, node, xs, at):  # op-set 13: axes moved to an input
    return [_unsqueeze(imp, xs[0], const(xs[1], "Unsqueeze's axes").reshape(-1).tolist())]


@handler("Transpose", 1, 13, 21, 23, 24, 25)
def _transpose(imp, node, xs, at):
    x = xs[0]
    perm = at.get("perm") or list(range(x.rank))[::-1]
    return [imp.b.op("Transpose", [x], {"perm": tuple(int(p) % max(x.rank, 1) for p in perm)})]


@handler("Concat", 1, 4, 11, 13)
def _concat(imp, node, xs, at):
    xs = [x for x in xs if x is not None]
    axis = norm_axis(at.get("axis", 1), xs[0].rank)
    nonempty = [x for x in xs if x.shape[axis] != 0] or xs[:1]
    if len(nonempty) == 1:
        return [imp.b.op("Identity", nonempty)]
    return [imp.b.op("Concat", nonempty, {"axis": axis})]


@handler("Slice", 1)
def _slice_1(imp, node, xs, at):  # op-set 1: starts/ends/axes are attributes
    return [slice_axes(imp, xs[0], at["starts"], at["ends"], at.get("axes"), None)]


@handler("Slice", 10, 11, 13)
def _slice_10(imp, node, xs, at):  # op-set 10: inputs, with steps
    opt = [const(v, "Slice's " + n).reshape(-1).tolist() if v is not None else None
           for v, n in zip(list(xs[1:]) + [None] * (5 - len(xs)), ("starts", "ends", "axes", "steps"), strict=False)]
    return [slice_axes(imp, xs[0], *opt)]


@handler("Split", 2, 11)
def _split_2(imp, node, xs, at):  # split sizes as an attribute
    return _split(imp, xs[0], at.get("axis", 0), at.get("split"), len(node.output))


@handler("Split", 13)
def _split_13(imp, node, xs, at):  # op-set 13: split sizes moved to an input
    sizes = const(xs[1], "Split's split").tolist() if len(xs) > 1 and xs[1] is not None else None
    return _split(imp, xs[0], at.get("axis", 0), sizes, len(node.output))


@handler("Split", 18)
def _split_18(imp, node, xs, at):  # op-set 18: num_outputs, uneven last chunk
    sizes = const(xs[1], "Split's split").tolist() if len(xs) > 1 and xs[1] is not None else None
    x = xs[0]
    axis = norm_axis(at.get("axis", 0), x.rank)
    if sizes is None:
        n = at.get("num_outputs", len(node.output))
        chunk = -(-x.shape[axis] // n)
        sizes = [min(chunk, x.shape[axis] - i * chunk) for i in range(n)]
    return _split(imp, x, axis, sizes, len(node.output))


def _split(imp, x, axis, sizes, n):
    axis = norm_axis(axis, x.rank)
    if not sizes:
        if x.shape[axis] % n:
            raise ModelError(f"Split of {x.shape[axis]} into {n} equal parts")
        sizes = [x.shape[axis] // n] * n
    outs, start = [], 0
    for s in sizes:
        starts = [0] * x.rank
        ends = list(x.shape)
        starts[axis], ends[axis] = start, start + int(s)
        outs.append(slice_axes(imp, x, starts, ends, None, None))
        start += int(s)
    return outs


@handler("Expand", 8, 13)
def _expand(imp, node, xs, at):
    x = xs[0]
    shape = np.broadcast_shapes(x.shape, tuple(int(d) for d in const(xs[1], "Expand's shape")))
    return [x if shape == x.shape else imp.b.op("Expand", [x], {"shape": shape})]


@handler("Tile", 6, 13)
def _tile(imp, node, xs, at):
    # tile = interleave unit dims, broadcast them to the repeat counts, merge: a view + Expand, no kernel of its own
    x = xs[0]
    reps = [int(r) for r in const(xs[1], "Tile's repeats")]
    inter = [d for dim in x.shape for d in (1, dim)]
    target = [d for r, dim in zip(reps, x.shape, strict=False) for d in (r, dim)]
    y = imp.b.op("Expand", [reshape(imp.b, x, inter)], {"shape": tuple(target)})
    return [reshape(imp.b, y, [r * d for r, d in zip(reps, x.shape, strict=False)])]


@handler("Range", 11, 27)
def _range(imp, node, xs, at):
    start, limit, delta = (np.asarray(const(v, "Range's inputs")) for v in xs)
    # (scalars; one-element tensors, as some function bodies pass them, read as their element)
    start, limit, delta = (a.reshape(()) if a.size == 1 else a for a in (start, limit, delta))
    if delta.size == 1 and (float(delta) == 0 or
                            math.ceil((float(limit) - float(start)) / float(delta)) > MAX_ELEMENTS):  # (before numpy)
        raise ModelError(f"Range({start}, {limit}, {delta}): a delta of 0 or more than {MAX_ELEMENTS} elements")
    return [imp.b.const(np.arange(start, limit, delta).astype(start.dtype))]


def _pads_2(at):
    return list(at.get("pads") or at.get("paddings")), at.get("mode", "constant"), at.get("value", 0.0)


@handler("Pad", 2)
def _pad_2(imp, node, xs, at):  # op-set 2: pads and value are attributes
    pads, mode, value = _pads_2(at)
    return [pad(imp, xs[0], pads, mode, value)]


@handler("Pad", 11, 13)
def _pad_11(imp, node, xs, at):  # op-set 11: pads and constant value are inputs
    pads = const(xs[1], "Pad's pads").tolist()
    value = const(xs[2], "Pad's value").reshape(-1)[0] if len(xs) > 2 and xs[2] is not None else 0
    return [pad(imp, xs[0], pads, at.get("mode", "constant"), value)]


@handler("Pad", 18, 19, 21, 23, 24, 25)
def _pad_18(imp, node, xs, at):  # op-set 18: optional axes input; 19 adds mode 'wrap'
    x = xs[0]
    pads = const(xs[1], "Pad's pads").tolist()
    value = const(xs[2], "Pad's value").reshape(-1)[0] if len(xs) > 2 and xs[2] is not None else 0
    if len(xs) > 3 and xs[3] is not None:
        axes = [norm_axis(int(a), x.rank) for a in const(xs[3], "Pad's axes")]
        full = [0] * (2 * x.rank)
        for i, a in enumerate(axes):
            full[a], full[a + x.rank] = pads[i], pads[i + len(axes)]
        pads = full
    return [pad(imp, x, pads, at.get("mode", "constant"), value)]


@handler("Trilu", 14)
def _trilu(imp, node, xs, at):
    """y = x where j - i >= k (upper) or j - i <= k (lower) over the last two axes, else 0: a Where on a constant
    mask (k must be known at load)."""
    x = xs[0]
    if x.rank < 2:
        raise ModelError(f"Trilu takes a tensor of rank >= 2, got {list(x.shape)}")
    k = int(np.asarray(const(xs[1], "Trilu's k")).reshape(-1)[0]) if len(xs) > 1 and xs[1] is not None else 0
    n, m = x.shape[-2:]
    diagonal = np.arange(m)[None, :] - np.arange(n)[:, None]
    keep = diagonal >= k if at.get("upper", 1) else diagonal <= k
    if keep.all():
        return [imp.b.op("Identity", [x])]
    zero = np.asarray("" if x.dtype == "object" else 0).astype(x.dtype)
    return [imp.b.op("Where", [imp.b.const(keep), x, imp.b.const(zero)])]


@handler("CenterCropPad", 18)
def _center_crop_pad(imp, node, xs, at):
    """Each listed axis cropped to its centred window (odd excess: the extra cell cut at the end) or zero-padded
    around the input (odd: the extra cell at the end)."""
    x = xs[0]
    shape = [int(s) for s in np.asarray(const(xs[1], "CenterCropPad's shape")).reshape(-1)]
    axes = [norm_axis(int(a), x.rank) for a in at.get("axes") or range(x.rank)]
    if len(axes) != len(shape):
        raise ModelError(f"CenterCropPad's shape has {len(shape)} entries for {len(axes)} axes")
    starts, ends = [0] * x.rank, list(x.shape)
    pads = [0] * (2 * x.rank)
    for a, want in zip(axes, shape, strict=True):
        have = x.shape[a]
        if want < have:
            starts[a] = (have - want) // 2
            ends[a] = starts[a] + want
        elif want > have:
            pads[a] = (want - have) // 2
            pads[a + x.rank] = want - have - pads[a]
    y = slice_axes(imp, x, starts, ends, None, None)
    y = pad(imp, y, pads, "constant", 0)
    return [y if y is not x else imp.b.op("Identity", [x])]
