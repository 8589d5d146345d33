"""Sequences whose length is known at load, as tuples of values: torch.chunk and friends export as SplitToSequence
then SequenceAt with constant positions. A sequence never reaches the device; only its tensors do."""
import numpy as np

from ..errors import ModelError
from .common import const, handler, norm_axis, reshape
from .tensor import _split


class Sequence(tuple):
    """A load-time ONNX sequence: its tensors' values, in order (a handler returns it inside a list: a bare tuple
    is a node's list of outputs)."""


def _seq(x, what):
    if not isinstance(x, Sequence):
        raise ModelError(f"{what} expects a sequence (one made by SplitToSequence or SequenceConstruct)")
    return x


@handler("SplitToSequence", 11, 24)  # (24: more types)
def _split_to_sequence(imp, node, xs, at):
    x, split = xs[0], xs[1] if len(xs) > 1 else None
    axis = norm_axis(at.get("axis", 0), x.rank)
    if split is None:  # one piece per position, squeezed unless keepdims
        pieces = _split(imp, x, axis, [1] * x.shape[axis], x.shape[axis])
        if not at.get("keepdims", 1):
            pieces = [reshape(imp.b, p, x.shape[:axis] + x.shape[axis + 1:]) for p in pieces]
        return [Sequence(pieces)]
    sizes = np.asarray(const(split, "SplitToSequence's split")).astype(np.int64)
    if sizes.ndim == 0:  # chunks of this size, the last one smaller
        n = int(sizes)
        sizes = [min(n, x.shape[axis] - i) for i in range(0, x.shape[axis], n)]
    return [Sequence(_split(imp, x, axis, [int(s) for s in sizes], len(sizes)))]


@handler("SequenceConstruct", 11)
def _sequence_construct(imp, node, xs, at):
    return [Sequence(xs)]


@handler("SequenceAt", 11)
def _sequence_at(imp, node, xs, at):
    seq = _seq(xs[0], "SequenceAt")
    i = int(const(xs[1], "SequenceAt's position"))
    if not -len(seq) <= i < len(seq):
        raise ModelError(f"SequenceAt: position {i} of a sequence of {len(seq)}")
    return seq[i]


@handler("SequenceLength", 11)
def _sequence_length(imp, node, xs, at):
    return imp.b.const(np.asarray(len(_seq(xs[0], "SequenceLength")), np.int64))


@handler("ConcatFromSequence", 11)
def _concat_from_sequence(imp, node, xs, at):
    seq = _seq(xs[0], "ConcatFromSequence")
    axis = at.get("axis")
    if at.get("new_axis", 0):
        first = seq[0]
        axis = norm_axis(axis, first.rank + 1)
        seq = [reshape(imp.b, v, v.shape[:axis] + (1,) + v.shape[axis:]) for v in seq]
    return imp.b.op("Concat", list(seq), {"axis": norm_axis(axis, seq[0].rank)})


@handler("OptionalHasElement", 15, 18, 28)  # 18: a tensor or sequence input too, or none; 28 adds types
def _optional_has_element(imp, node, xs, at):  # an optional known at load: whether it holds a value
    return [imp.b.const(np.asarray(bool(xs) and xs[0] is not None))]


@handler("OptionalGetElement", 15, 18, 28)  # 18: a tensor or sequence input is passed on; 28 adds types
def _optional_get_element(imp, node, xs, at):
    if not xs or xs[0] is None:
        raise ModelError("the optional holds no value")
    return [xs[0]]
