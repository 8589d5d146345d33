"""The transformer fusions' ops (graph/passes/transformer.py): a residual Add with the LayerNorm / RMSNorm after it
(one row kernel, add_layernorm.cl), and the column views through which the Q, K and V projections' one product is
read in place. Inference only: a training graph keeps them unfused (no gradients here)."""
import numpy as np

from .base import REQUIRED, Op, register


def _repeats(b, shape):
    """b broadcasts to `shape` by repeating whole rows: leading ones, then shape's trailing dims (b[r % rows])."""
    lead = shape[:len(shape) - b.rank] if b.rank <= len(shape) else None
    if lead is None or not b.rank:
        return False
    ones = 0
    while ones < b.rank - 1 and b.shape[ones] == 1:
        ones += 1
    return tuple(b.shape[ones:]) == tuple(shape[len(lead) + ones:])


@register
class AddLayerNorm(Op):
    """s = a + b,  y = LayerNorm(s, scale, bias) (rms: RMSNorm(s, scale), no bias) over the last axis; outputs y (of
    attrs shape: the normalised value's, maybe a flattened view of s) and, with keep_sum, s (a's shape) for its other
    readers (the residual stream). a has s's shape; b that or whole rows of it repeated (a position table)."""
    name = "AddLayerNorm"
    dtypes = ("float32",)
    attrs = {"epsilon": REQUIRED, "shape": REQUIRED, "rms": 0, "keep_sum": 0}

    def infer(self, node):
        a, b, scale = node.inputs[:3]
        shape = tuple(node.attrs["shape"])
        D = a.shape[-1] if a.rank else 0
        if not _repeats(b, a.shape) or b.dtype != a.dtype:
            raise ValueError(f"AddLayerNorm: b {b.type_str()} must be a's {a.type_str()} shape or its rows repeated")
        n_norm = 1 if node.attrs["rms"] else 2
        if len(node.inputs) != 2 + n_norm or any(v.shape != (D,) for v in node.inputs[2:]):
            raise ValueError(f"AddLayerNorm: scale{'' if n_norm == 1 else ' and bias'} must be [{D}]")
        if int(np.prod(shape, dtype=np.int64)) != a.size or not shape or shape[-1] != D:
            raise ValueError(f"AddLayerNorm: y's shape {list(shape)} must hold a's {list(a.shape)} rows of {D}")
        return [(a.dtype, shape)] + ([(a.dtype, a.shape)] if node.attrs["keep_sum"] else [])

    def numpy(self, node, a, b, scale, bias=None):
        s = a + b
        x = s.reshape(node.attrs["shape"])
        mean = 0.0 if node.attrs["rms"] else x.mean(axis=-1, keepdims=True)
        d = x - mean
        y = d / np.sqrt((d * d).mean(axis=-1, keepdims=True) + node.attrs["epsilon"]) * scale
        y = (y if bias is None else y + bias).astype(a.dtype)
        return [y, s] if node.attrs["keep_sum"] else [y]

    def lower(self, node, lw):
        lw.add_layernorm(node)


@register
class ColumnView(Op):
    """y = x[..., start:start + columns] viewed as `shape` (no copy): one of the projections a packed product
    [..., W] computes side by side (Q, K, V). Not contiguous: only kernels that take its strides read it
    (column_view_strides; the Attention kernels)."""
    name = "ColumnView"
    kind = "alias"
    attrs = {"start": REQUIRED, "columns": REQUIRED, "shape": REQUIRED}

    def infer(self, node):
        x, a = node.inputs[0], node.attrs
        shape = tuple(a["shape"])
        rows = x.size // x.shape[-1] if x.rank and x.shape[-1] else 0
        if not 0 <= a["start"] <= a["start"] + a["columns"] <= x.shape[-1] or \
                int(np.prod(shape, dtype=np.int64)) != rows * a["columns"] or \
                view_strides(shape, a["columns"], x.shape[-1]) is None:
            raise ValueError(f"ColumnView: columns [{a['start']}, +{a['columns']}) of {x.type_str()} cannot be "
                             f"viewed as {list(shape)}")
        return [(x.dtype, shape)]

    def numpy(self, node, x):
        a = node.attrs
        return [np.ascontiguousarray(x[..., a["start"]:a["start"] + a["columns"]]).reshape(a["shape"])]

    def view_offset(self, node):
        return node.attrs["start"]

    def lower(self, node, lw):
        lw.alias(node.outputs[0], node.inputs[0])  # (the memory plan put it at its column of the product)


def view_strides(shape, columns, width):
    """Element strides of a view of `shape` over `columns` of each row of a [rows, width] matrix: its trailing axes
    hold one row's columns (their product is `columns`), the leading ones step by whole rows; None where no suffix
    of the shape holds exactly one row's columns."""
    strides, step, crossed = [0] * len(shape), 1, False
    for a in reversed(range(len(shape))):
        if step == columns and not crossed:
            step, crossed = width, True
        strides[a], step = step, step * shape[a]
    if not crossed and step != columns:
        return None
    return strides


def element_strides(x):
    """x's element strides: a ColumnView's (view_strides), a TransposeView's (its input's, permuted), else
    contiguous."""
    p = x.producer
    if p is not None and p.op == "ColumnView":
        return view_strides(x.shape, p.attrs["columns"], p.inputs[0].shape[-1])
    if p is not None and p.op == "TransposeView":
        inner = element_strides(p.inputs[0])
        return [inner[a] for a in p.attrs["perm"]]
    return view_strides(x.shape, x.size, x.size)  # (contiguous: one row of every element)
