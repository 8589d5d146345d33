"""Ops whose output shapes are their input values: NonZero, Compress, Unique, NonMaxSuppression.

Each builds host ops (dlnet/graph/ops/host.py): folded at load when the values are constants, otherwise run on the
host at run time, the rest of the model planned for the shapes they give (dlnet/stages.py).
"""
from .common import handler, norm_axis, reshape, slice_axes


@handler("NonZero", 9, 13)  # 13 adds types
def _nonzero(imp, node, xs, at):
    return [imp.b.op("NonZero", [xs[0]])]


@handler("Compress", 9, 11, 28)  # 11: negative axis; 28 adds types
def _compress(imp, node, xs, at):  # y = take(x, nonzero(condition), axis); a condition shorter than the axis stops
    b, x = imp.b, xs[0]
    if "axis" in at:
        axis = norm_axis(at["axis"], x.rank)
    else:
        x, axis = reshape(b, x, (x.size,)), 0
    cond = reshape(b, xs[1], (xs[1].size,))
    if cond.size > x.shape[axis]:
        cond = slice_axes(imp, cond, [0], [x.shape[axis]], None, None)
    if cond.dtype != "bool":
        cond = b.op("Cast", [cond], {"to": "bool"})
    keep = b.op("NonZero", [cond])
    return [b.op("Gather", [x, reshape(b, keep, (keep.size,))], {"axis": axis})]


@handler("Unique", 11, 28)  # 28 adds types
def _unique(imp, node, xs, at):
    x = xs[0]
    attrs = {"sorted": at.get("sorted", 1)}
    if at.get("axis") is not None:
        attrs["axis"] = norm_axis(at["axis"], x.rank)
    return imp.b.op("Unique", [x], attrs, n_out=4)[:len(node.output)]


@handler("NonMaxSuppression", 10, 11)  # 11 only relaxes the input shapes' documentation
def _non_max_suppression(imp, node, xs, at):
    return [imp.b.op("NonMaxSuppression", list(xs) + [None] * (5 - len(xs)),
                     {"center_point_box": at.get("center_point_box", 0)})]


