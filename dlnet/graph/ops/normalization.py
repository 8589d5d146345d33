"""Row normalisations of the newer op-sets: LayerNorm with its statistics (LayerNormalization-17's optional Mean and
InvStdDev outputs) and RMSNorm (RMSNormalization-23, and the decomposition exporters write before it); one kernel
each (layernorm.cl), gradients as graph nodes."""
import numpy as np

from .base import REQUIRED, Op, register
from .nn import LayerNorm


def _row_mean(b, v):
    return b.op("Reduce", [v], {"mode": "mean", "axes": (v.rank - 1,), "keepdims": 1})


def _is_zero(v):
    """A gradient known to be zero: the constant autodiff gives an output nobody reads."""
    return v is None or (v.const is not None and not np.any(v.const))


def _normalised_grad(b, dy, scale, xhat, inv, centred):
    """dx of y = xhat * scale + bias with xhat = (x - m) * inv, inv = 1 / sqrt(mean((x - m)^2) + eps) over the row
    (centred: m the row's mean, LayerNorm; else m = 0, RMSNorm):
    dx = inv (g - [mean(g)] - xhat mean(g xhat)), g = dy scale."""
    g = b.op("Mul", [dy, scale])
    core = b.op("Sub", [g, b.op("Mul", [xhat, _row_mean(b, b.op("Mul", [g, xhat]))])])
    if centred:
        core = b.op("Sub", [core, _row_mean(b, g)])
    return b.op("Mul", [core, inv])


@register
class LayerNormStats(LayerNorm):
    """y, mean, inv = LayerNorm(x, scale, bias) over the last axis, mean and inv = 1 / sqrt(var + eps) of each row
    kept (float32, shape x.shape[:-1] + [1]); one kernel, as LayerNorm's.
    dx = LayerNorm's dx + dmean / D - dinv inv^2 xhat / D, dscale = dy xhat, dbias = dy (xhat = (x - mean) inv)."""
    name = "LayerNormStats"

    def infer(self, node):
        (dtype, shape), = super().infer(node)
        stats = ("float32", shape[:-1] + (1,))
        return [(dtype, shape), stats, stats]

    def numpy(self, node, x, scale, bias):
        x32 = x.astype(np.float32) if x.dtype != np.float64 else x
        mean = x32.mean(axis=-1, keepdims=True)
        d = x32 - mean
        inv = 1 / np.sqrt((d * d).mean(axis=-1, keepdims=True) + x32.dtype.type(node.attrs["epsilon"]))
        stats = np.float32 if x.dtype != np.float64 else np.float64  # (float64: the gradient check's host maths)
        return [(d * inv * scale + bias).astype(x.dtype), mean.astype(stats), inv.astype(stats)]

    def grad(self, b, node, dys):
        # the kernel's own statistics: nothing recomputed
        x, scale = node.inputs[0], node.inputs[1]
        _, mean, inv = node.outputs
        dy, dmean, dinv = dys
        if _is_zero(dy):
            dy = b.const(np.zeros(x.shape, x.dtype))
        xhat = b.op("Mul", [b.op("Sub", [x, mean]), inv])
        dx = _normalised_grad(b, dy, scale, xhat, inv, centred=True)
        per_row = b.const(np.asarray(1.0 / x.shape[-1], x.dtype))
        if not _is_zero(dmean):  # mean = sum(x) / D
            dx = b.op("Add", [dx, b.op("Mul", [dmean, per_row])])
        if not _is_zero(dinv):  # d inv / dx = -inv^3 (x - mean) / D = -inv^2 xhat / D
            dx = b.op("Sub", [dx, b.op("Mul", [b.op("Mul", [b.op("Mul", [dinv, b.op("Mul", [inv, inv])]), xhat]),
                                               per_row])])
        return [dx, b.op("Mul", [dy, xhat]), dy]


@register
class RMSNorm(Op):
    """y = x / sqrt(mean(x^2) + eps) * scale over the last axis (RMSNormalization-23; x [rows, D], scale [D]);
    dx = inv (g - xhat mean(g xhat)), g = dy scale, dscale = dy xhat (xhat = x inv, inv = 1 / sqrt(mean(x^2) + eps))"""
    name = "RMSNorm"
    dtypes = ("float32",)
    attrs = {"epsilon": REQUIRED}

    def infer(self, node):
        x, scale = node.inputs
        if scale.shape != (x.shape[-1],):
            raise ValueError(f"scale {list(scale.shape)} must be [{x.shape[-1]}]")
        return [(x.dtype, x.shape)]

    def numpy(self, node, x, scale):
        inv = 1 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + x.dtype.type(node.attrs["epsilon"]))
        return [(x * inv * scale).astype(x.dtype)]

    def lower(self, node, lw):
        lw.layernorm(node)

    def grad(self, b, node, dys):
        x, scale = node.inputs
        eps = b.const(np.asarray(node.attrs["epsilon"], x.dtype))
        inv = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [_row_mean(b, b.op("Mul", [x, x])), eps])])])
        xhat = b.op("Mul", [x, inv])
        return [_normalised_grad(b, dys[0], scale, xhat, inv, centred=False), b.op("Mul", [dys[0], xhat])]


def channels_last(rank, axis):
    """The permutation that moves `axis` last, keeping the other axes in order (NCHW -> NHWC at axis 1)."""
    return tuple(a for a in range(rank) if a != axis) + (axis,)


@register
class LayerNormAxis(Op):
    """y = LayerNorm of x over axis `axis` (scale, bias [x.shape[axis]]), written as x is laid out (perm=()) or with
    that axis moved last (perm = channels_last(rank, axis)): ConvNeXt's LayerNorm2d on NCHW's channels, and a
    Transpose -> LayerNorm read through strides (graph/passes/transposes.py, inference graphs). No gradient."""
    name = "LayerNormAxis"
    dtypes = ("float32",)
    attrs = {"epsilon": REQUIRED, "axis": REQUIRED, "perm": ()}

    def infer(self, node):
        x, scale, bias = node.inputs
        axis, perm = node.attrs["axis"], tuple(node.attrs["perm"])
        if not 0 <= axis < x.rank or perm not in ((), channels_last(x.rank, axis)):
            raise ValueError(f"axis {axis} with perm {list(perm)} of a rank-{x.rank} x: expected perm () or "
                             f"{list(channels_last(x.rank, axis))}")
        if scale.shape != (x.shape[axis],) or bias.shape != (x.shape[axis],):
            raise ValueError(f"scale {list(scale.shape)} and bias {list(bias.shape)} must be [{x.shape[axis]}]")
        return [(x.dtype, tuple(x.shape[p] for p in perm) if perm else x.shape)]

    def numpy(self, node, x, scale, bias):
        axis, perm = node.attrs["axis"], tuple(node.attrs["perm"])
        shape = [1] * x.rank
        shape[axis] = x.shape[axis]
        d = x - x.mean(axis=axis, keepdims=True)
        var = (d * d).mean(axis=axis, keepdims=True)
        y = (d / np.sqrt(var + node.attrs["epsilon"]) * scale.reshape(shape) + bias.reshape(shape)).astype(x.dtype)
        return [np.ascontiguousarray(y.transpose(perm)) if perm else y]

    def lower(self, node, lw):
        lw.layernorm_axis(node)
