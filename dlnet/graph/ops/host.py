"""Ops whose output shapes are their input values, or that work on strings: host ops.

They have no kernels. With constant inputs they fold at load like any op; otherwise the importer ends the device
graph before their ONNX node and they run here, on the host, between device graphs (dlnet/stages.py). `infer`
gives dtypes only (the shapes come from the values).
"""
import numpy as np

from ...errors import ModelError
from .base import Op, register


class HostOp(Op):
    kind = "host"
    out_dtypes = ("int64",)

    def infer(self, node):
        return [(dt, None) for dt in self.out_dtypes]


@register
class NonZero(HostOp):
    """y = the indices of the non-zero entries of x, one row per axis: int64[rank, count]"""
    name = "NonZero"

    def numpy(self, node, x):
        return [np.asarray(np.nonzero(x), np.int64).reshape(x.ndim, -1)]


@register
class Unique(HostOp):
    """y, first index, inverse, counts of the distinct values (or slices along `axis`), sorted or in first order"""
    name = "Unique"
    attrs = {"axis": None, "sorted": 1}  # axis None: over the flattened input

    def infer(self, node):
        return [(node.inputs[0].dtype, None)] + [("int64", None)] * 3

    def numpy(self, node, x):
        axis = node.attrs["axis"]
        y, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True, return_counts=True,
                                              axis=axis)
        if not node.attrs["sorted"]:  # first-occurrence order
            order = np.argsort(first, kind="stable")
            y = np.take(y, order, axis=0 if axis is None else axis)
            first, counts = first[order], counts[order]
            inverse = np.argsort(order)[inverse.reshape(-1)]
        return [y, first.astype(np.int64), inverse.reshape(-1).astype(np.int64), counts.astype(np.int64)]


def _corners(boxes, center):
    """(x_min, x_max, y_min, y_max) of [y1, x1, y2, x2] boxes (either corner order) or [x, y, w, h] centred ones."""
    if center:
        half_w, half_h = boxes[:, 2] / 2, boxes[:, 3] / 2
        return boxes[:, 0] - half_w, boxes[:, 0] + half_w, boxes[:, 1] - half_h, boxes[:, 1] + half_h
    return (np.minimum(boxes[:, 1], boxes[:, 3]), np.maximum(boxes[:, 1], boxes[:, 3]),
            np.minimum(boxes[:, 0], boxes[:, 2]), np.maximum(boxes[:, 0], boxes[:, 2]))


def _suppressed(c, i, kept, iou_threshold):
    """Whether box i overlaps any kept box by IoU > threshold (empty or degenerate overlaps never suppress)."""
    x0, x1, y0, y1 = c
    kept = np.asarray(kept, np.int64)
    ix = np.minimum(x1[i], x1[kept]) - np.maximum(x0[i], x0[kept])
    iy = np.minimum(y1[i], y1[kept]) - np.maximum(y0[i], y0[kept])
    inter = ix * iy
    area_i = (x1[i] - x0[i]) * (y1[i] - y0[i])
    area_k = (x1[kept] - x0[kept]) * (y1[kept] - y0[kept])
    union = area_i + area_k - inter
    valid = (ix > 0) & (iy > 0) & (inter > 0) & (area_i > 0) & (area_k > 0) & (union > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = inter / np.where(valid, union, 1)
    return bool(np.any(valid & (iou > iou_threshold)))


@register
class NonMaxSuppression(HostOp):
    """Per batch and class: boxes by descending score (ties: lower index), each kept unless its IoU with a kept box
    exceeds iou_threshold, scores <= score_threshold dropped, at most max_output_boxes_per_class:
    int64[selected, 3] of (batch, class, box)"""
    name = "NonMaxSuppression"
    attrs = {"center_point_box": 0}

    def numpy(self, node, boxes, scores, max_out=None, iou_threshold=None, score_threshold=None):
        limit = 0 if max_out is None or max_out.size == 0 else max(int(max_out.reshape(-1)[0]), 0)
        iou_t = boxes.dtype.type(0) if iou_threshold is None or iou_threshold.size == 0 else \
            iou_threshold.reshape(-1)[0]
        score_t = None if score_threshold is None or score_threshold.size == 0 else score_threshold.reshape(-1)[0]
        if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 or scores.shape[0] != boxes.shape[0] or \
                scores.shape[2] != boxes.shape[1]:
            raise ModelError(f"NonMaxSuppression takes boxes [batches, boxes, 4] and scores [batches, classes, "
                             f"boxes], got {list(boxes.shape)} and {list(scores.shape)}")
        center = node.attrs["center_point_box"]
        out = []
        for n in range(boxes.shape[0]):
            c = _corners(boxes[n], center)
            for k in range(scores.shape[1]):
                s = scores[n, k]
                ids = np.arange(s.size)
                if score_t is not None:
                    ids = ids[s > score_t]
                kept = []
                for i in ids[np.lexsort((ids, -s[ids]))]:
                    if len(kept) >= limit:
                        break
                    if not kept or not _suppressed(c, i, kept, iou_t):
                        kept.append(i)
                out += [(n, k, i) for i in kept]
        return [np.asarray(out, np.int64).reshape(-1, 3)]


@register
class StringNormalizer(HostOp):
    """y = x without the stopwords (whole elements; case-insensitive unless is_case_sensitive), then lower- or
    upper-cased; [""] when nothing is left. x is [C] or [1, C]"""
    name = "StringNormalizer"
    out_dtypes = ("object",)
    attrs = {"stopwords": (), "is_case_sensitive": 0, "case_change_action": "NONE"}

    def numpy(self, node, x):
        at = node.attrs
        if x.ndim not in (1, 2) or (x.ndim == 2 and x.shape[0] != 1):
            raise ModelError(f"StringNormalizer takes strings [C] or [1, C], got shape {list(x.shape)}")
        words = [w.decode() if isinstance(w, bytes) else str(w) for w in x.reshape(-1)]
        stops = at["stopwords"]
        if at["is_case_sensitive"]:
            words = [w for w in words if w not in set(stops)]
        else:
            folded = {s.lower() for s in stops}
            words = [w for w in words if w.lower() not in folded]
        action = at["case_change_action"]
        if action not in ("NONE", "LOWER", "UPPER"):
            raise ModelError(f"StringNormalizer's case_change_action is {action!r}; expected NONE, LOWER or UPPER")
        words = [w.lower() if action == "LOWER" else w.upper() if action == "UPPER" else w for w in words] or [""]
        y = np.empty(len(words), object)
        y[:] = words
        return [y.reshape((1, -1) if x.ndim == 2 else (-1,))]


def _strings(x):
    return [w.decode() if isinstance(w, bytes) else str(w) for w in x.reshape(-1)]


@register
class StringConcat(HostOp):
    """y = x + z, elementwise on strings, broadcasting as numpy does"""
    name = "StringConcat"
    out_dtypes = ("object",)

    def numpy(self, node, x, z):
        shape = np.broadcast_shapes(x.shape, z.shape)
        a, b = np.broadcast_to(x, shape), np.broadcast_to(z, shape)
        y = np.empty(shape, object)
        y.reshape(-1)[:] = [p + q for p, q in zip(_strings(a), _strings(b))] if y.size else []
        return [y]


@register
class StringSplit(HostOp):
    """substrings [..., most] (padded with ""), counts [...] of each string split at `delimiter` at most `maxsplit`
    times; no delimiter (or ""): runs of whitespace, leading and trailing whitespace dropped (Python's str.split)"""
    name = "StringSplit"
    out_dtypes = ("object", "int64")
    attrs = {"delimiter": "", "maxsplit": None}

    def numpy(self, node, x):
        sep = node.attrs["delimiter"] or None
        most = node.attrs["maxsplit"]
        parts = [w.split(sep, -1 if most is None else int(most)) for w in _strings(x)]
        width = max((len(p) for p in parts), default=0)
        y = np.empty((len(parts), width), object)
        for i, p in enumerate(parts):
            y[i] = p + [""] * (width - len(p))
        counts = np.asarray([len(p) for p in parts], np.int64).reshape(x.shape)
        return [y.reshape(x.shape + (width,)), counts]


@register
class RegexFullMatch(HostOp):
    """y = whether each string matches `pattern` in full (Python's re, which reads the RE2 syntax ONNX names, and
    more: lookarounds and backreferences are not refused)"""
    name = "RegexFullMatch"
    out_dtypes = ("bool",)
    attrs = {"pattern": ""}

    def numpy(self, node, x):
        import re
        try:
            regex = re.compile(node.attrs["pattern"])
        except re.error as e:
            raise ModelError(f"RegexFullMatch: pattern {node.attrs['pattern']!r} is not a regular expression ({e})") \
                from None
        return [np.asarray([regex.fullmatch(w) is not None for w in _strings(x)], bool).reshape(x.shape)]
