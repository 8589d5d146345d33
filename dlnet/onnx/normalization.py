"""The normalisations of the newer op-sets: LayerNormalization (17), GroupNormalization (18, 21) and RMSNormalization
(23), each one LayerNorm (RMSNorm) kernel over the last axis of a view of x (a Reshape, no copy), then the
per-channel affine where it is not the kernel's own."""
import numpy as np

from ..errors import ModelError
from .common import handler, norm_axis, reshape

FLOATS = ("float32", "float64", "float16")


def _check(x, at):
    """The ops normalise in float32 (stash_type 1, the only stash type exporters write); x of float16 or float64 is
    cast to float32 for it and back."""
    stash = at.get("stash_type", 1)
    if stash != 1:
        raise ModelError(f"stash_type {stash} is not supported (supported: 1, float32)")
    if x.dtype not in FLOATS:
        raise ModelError(f"dtype {x.dtype} is not supported (supported: {', '.join(FLOATS)})")


def _f32(b, v):
    return v if v is None or v.dtype == "float32" else b.op("Cast", [v], {"to": "float32"})


def _rows(b, v, shape, what):
    """v broadcast to `shape` (the normalised dims), flattened: LayerNorm's [D] scale or bias."""
    if np.broadcast_shapes(v.shape, shape) != tuple(shape):
        raise ModelError(f"{what} of shape {list(v.shape)} does not broadcast to the normalised shape {list(shape)}")
    if v.shape != tuple(shape):
        v = b.op("Expand", [v], {"shape": tuple(shape)})
    return reshape(b, v, (int(np.prod(shape, dtype=np.int64)),))


def layer_norm(b, x, scale, bias, axis, eps, stats=False):
    """y (x's dtype) of LayerNorm over x's axes [axis, rank), with the float32 mean and inverse deviation of each row
    (shape x.shape[:axis] + ones) when `stats`."""
    inner = x.shape[axis:]
    D = int(np.prod(inner, dtype=np.int64))
    scale = _rows(b, _f32(b, scale), inner, "Scale")
    bias = _rows(b, _f32(b, bias), inner, "B") if bias is not None else b.const(np.zeros(D, np.float32))
    x2 = reshape(b, _f32(b, x), x.shape[:axis] + (D,))
    outs = b.op("LayerNormStats" if stats else "LayerNorm", [x2, scale, bias], {"epsilon": float(eps)},
                n_out=3 if stats else 1)
    y = outs[0] if stats else outs
    y = reshape(b, y, x.shape)
    if x.dtype != "float32":
        y = b.op("Cast", [y], {"to": x.dtype})
    if not stats:
        return y
    keep = x.shape[:axis] + (1,) * (x.rank - axis)
    return [y, reshape(b, outs[1], keep), reshape(b, outs[2], keep)]


@handler("LayerNormalization", 17)
def _layer_normalization(imp, node, xs, at):
    """Y = (X - mean) / sqrt(var + eps) * Scale + B over axes [axis, rank); Mean and InvStdDev float32 (type U)."""
    x, scale = xs[0], xs[1]
    bias = xs[2] if len(xs) > 2 else None
    _check(x, at)
    axis = norm_axis(at.get("axis", -1), x.rank)
    stats = any(node.output[1:])
    outs = layer_norm(imp.b, x, scale, bias, axis, at.get("epsilon", 1e-5), stats)
    return outs[:len(node.output)] if stats else [outs]


@handler("GroupNormalization", 18, 21)
def _group_normalization(imp, node, xs, at):
    """y = (x - mean) / sqrt(var + eps) * scale + bias, mean and var over each image's group of C / num_groups
    channels. Op-set 18 takes scale and bias per group, 21 per channel."""
    b = imp.b
    x, scale, bias = xs
    _check(x, at)
    groups = at["num_groups"]
    n, c = x.shape[0], x.shape[1]
    if groups <= 0 or c % groups:
        raise ModelError(f"num_groups {groups} does not divide the {c} channels")
    per_channel = imp.opset >= 21
    want = c if per_channel else groups
    for v, what in ((scale, "scale"), (bias, "bias")):
        if v.shape != (want,):
            raise ModelError(f"{what} of shape {list(v.shape)}: op-set {imp.opset} expects [{want}] (one per "
                             f"{'channel' if per_channel else 'group'})")
    grouped = reshape(b, x, (n, groups, x.size // max(n * groups, 1)))
    D = grouped.shape[2]
    y = layer_norm(b, grouped, b.const(np.ones(D, x.dtype)), None, 2, at.get("epsilon", 1e-5))
    y = reshape(b, y, x.shape)
    channel = (c,) + (1,) * (x.rank - 2)
    if not per_channel:  # each group's value repeated for its channels
        scale, bias = (reshape(b, b.op("Expand", [reshape(b, v, (groups, 1))], {"shape": (groups, c // groups)}),
                               (c,)) for v in (scale, bias))
    return [b.op("Add", [b.op("Mul", [y, reshape(b, scale, channel)]), reshape(b, bias, channel)])]


def _broadcasts(shape, to):
    """Does `shape` broadcast to `to` unidirectionally (to unchanged)?"""
    try:
        return np.broadcast_shapes(shape, to) == tuple(to)
    except ValueError:
        return False


@handler("RMSNormalization", 23)
def _rms_normalization(imp, node, xs, at):
    """Y = X / sqrt(mean(X^2 over axes [axis, rank)) + eps) * scale, scale broadcasting to X (unidirectionally); Y
    of scale's type (V)."""
    b = imp.b
    x, scale = xs
    _check(x, at)
    if scale.dtype not in FLOATS:
        raise ModelError(f"scale of dtype {scale.dtype} is not supported (supported: {', '.join(FLOATS)})")
    axis = norm_axis(at.get("axis", -1), x.rank)
    inner = x.shape[axis:]
    D = int(np.prod(inner, dtype=np.int64))
    if not _broadcasts(scale.shape, x.shape):
        raise ModelError(f"scale of shape {list(scale.shape)} does not broadcast to X's {list(x.shape)}")
    x2 = reshape(b, _f32(b, x), x.shape[:axis] + (D,))
    lead = scale.shape[:max(0, scale.rank - len(inner))]
    per_row = all(d == 1 for d in lead) and _broadcasts(scale.shape[len(lead):], inner)
    if per_row:
        w = _rows(b, reshape(b, _f32(b, scale), scale.shape[len(lead):]), inner, "scale")
    else:
        w = b.const(np.ones(D, np.float32))
    y = reshape(b, b.op("RMSNorm", [x2, w], {"epsilon": float(at.get("epsilon", 1e-5))}), x.shape)
    if not per_row:  # a scale that varies along the leading axes too: its own Mul
        y = b.op("Mul", [y, _f32(b, scale)])
    return [y if scale.dtype == "float32" else b.op("Cast", [y], {"to": scale.dtype})]
