"""GridSample: interpolation at positions a grid gives (op-sets 16 and 20), one kernel (gridsample.cl), and its
gradient GridSampleGrad (dx scattered by the taps' weights, dgrid from the weights' slopes: gridsample_grad); the
numpy forms (float64 on the host: folding and the gradient check) follow the kernel step by step."""
import itertools

import numpy as np

from .base import REQUIRED, Op, register

ATTRS = {"mode": REQUIRED, "padding_mode": "zeros", "align_corners": 0}  # mode: nearest, linear or cubic
TAPS = {"nearest": 1, "linear": 2, "cubic": 4}
CUBIC_A = -0.75  # Keys' cubic, as onnx.reference and PyTorch


def _reflect(v, lo, hi):
    """(v reflected by the nearer border until inside [lo, hi], its slope d/dv: +1 or -1)."""
    span = hi - lo
    below, above = v < lo, v > hi
    dv = np.where(below, lo - v, np.where(above, v - hi, 0.0))
    k = np.floor(dv / span) if span > 0 else np.zeros_like(dv)
    r = dv - k * span
    even = k % 2 == 0
    out = np.where(below, np.where(even, lo + r, hi - r), np.where(above, np.where(even, hi - r, lo + r), v))
    slope = np.where(below | above, np.where(even, -1.0, 1.0), 1.0)
    return out, slope


def _coeffs(t, mode):
    """Per tap: (weights, d weight / dt) at fraction t."""
    if mode == "nearest":
        return [np.ones_like(t)], [np.zeros_like(t)]
    if mode == "linear":
        return [1 - t, t], [-np.ones_like(t), np.ones_like(t)]
    a, u, s, s1 = CUBIC_A, t + 1, 1 - t, 2 - t
    w = [((a * u - 5 * a) * u + 8 * a) * u - 4 * a, ((a + 2) * t - (a + 3)) * t * t + 1,
         ((a + 2) * s - (a + 3)) * s * s + 1, ((a * s1 - 5 * a) * s1 + 8 * a) * s1 - 4 * a]
    dw = [(3 * a * u - 10 * a) * u + 8 * a, (3 * (a + 2) * t - 2 * (a + 3)) * t,
          -(3 * (a + 2) * s - 2 * (a + 3)) * s, -((3 * a * s1 - 10 * a) * s1 + 8 * a)]
    return w, dw


def _axis_taps(nv, length, attrs):
    """One spatial axis at normalised coordinates nv: (tap indices (-1: a zero), weights, d weight / d nv), each a
    list over the taps, as gridsample.cl's loop over d."""
    mode, pad, align = attrs["mode"], attrs["padding_mode"], attrs["align_corners"]
    scale = 0.5 * (length - 1) if align else 0.5 * length
    v = (nv + 1) * scale if align else ((nv + 1) * length - 1) * 0.5
    if mode == "nearest":
        v = np.rint(v)
    lo, hi = (0.0, length - 1.0) if align else (-0.5, length - 0.5)
    outside = (v < lo) | (v > hi)
    slope = np.ones_like(v)
    if pad == "border":
        v, slope = np.where(outside, np.clip(v, 0, length - 1), v), np.where(outside, 0.0, 1.0)
    elif pad == "reflection":
        v, slope = _reflect(v, lo, hi)
    if mode == "nearest":
        first, t = np.trunc(v), np.zeros_like(v)
    else:
        f = np.floor(v)
        first, t = f - (1 if mode == "cubic" else 0), v - f
    w, dw = _coeffs(t, mode)
    idx = []
    for k in range(TAPS[mode]):
        i = first + k
        if pad == "zeros":
            i = np.where((i >= 0) & (i < length), i, -1)
        elif pad == "border":
            i = np.clip(i, 0, length - 1)
        else:
            i = np.trunc(_reflect(i, lo, hi)[0])
        idx.append(i.astype(np.int64))
    return idx, w, [d * scale * slope for d in dw]


def _combos(x_shape, grid, attrs):
    """Each combination of one tap per axis: (flat index into a plane [N, O] (0 where outside), inside [N, O],
    weight [N, O], [d weight / d grid[..., j] for j]), grid [N, O, r]."""
    dims = x_shape[2:]
    r = len(dims)
    axes = [_axis_taps(grid[..., r - 1 - d], dims[d], attrs) for d in range(r)]
    for taps in itertools.product(range(TAPS[attrs["mode"]]), repeat=r):
        flat, inside = 0, True
        for d, t in enumerate(taps):
            i = axes[d][0][t]
            inside = inside & (i >= 0)
            flat = flat * dims[d] + np.maximum(i, 0)
        w = np.prod([axes[d][1][t] for d, t in enumerate(taps)], axis=0)
        slopes = [np.prod([axes[e][2 if e == d else 1][t] for e, t in enumerate(taps)], axis=0) for d in range(r)]
        yield flat, inside, w, slopes[::-1]  # grid component j is axis r - 1 - j


def _planes(x, grid):
    n, c = x.shape[:2]
    return x.reshape(n, c, -1).astype(np.float64), grid.reshape(n, -1, grid.shape[-1]).astype(np.float64)


def gridsample_numpy(node, x, grid):
    xp, g = _planes(x, grid)
    y = np.zeros(xp.shape[:2] + g.shape[1:2])
    for flat, inside, w, _ in _combos(x.shape, g, node.attrs):
        taken = np.take_along_axis(xp, np.broadcast_to(flat[:, None, :], y.shape), axis=2)
        y += np.where(inside, w, 0.0)[:, None, :] * taken
    return [y.reshape(x.shape[:2] + grid.shape[1:-1]).astype(x.dtype)]


@register
class GridSample(Op):
    """y[n, c, o] = sum over taps of w(grid[n, o]) x[n, c, tap] (nearest, linear, cubic; grid normalised to [-1, 1],
    innermost spatial dim first), padding zeros / border / reflection;
    dx[n, c, tap] += w dy[n, c, o], dgrid[n, o] = sum_c, taps dy x[tap] dw/dgrid (0 for nearest, and where border
    padding clamps)  (GridSampleGrad)"""
    name = "GridSample"
    dtypes = ("float32",)
    attrs = ATTRS
    numpy = staticmethod(gridsample_numpy)

    def infer(self, node):
        x, grid = node.inputs
        r = x.rank - 2
        if not 1 <= r <= 3 or grid.rank != r + 2 or grid.shape[0] != x.shape[0] or grid.shape[-1] != r:
            raise ValueError(f"GridSample takes x [N, C, {r} spatial dims] (1 to 3) and grid [N, ..., {r}], got "
                             f"{list(x.shape)} and {list(grid.shape)}")
        return [(x.dtype, x.shape[:2] + grid.shape[1:-1])]

    def lower(self, node, lw):
        lw.gridsample(node)

    def grad(self, b, node, dys):
        x, grid = node.inputs
        dx, dgrid = b.op("GridSampleGrad", [dys[0], x, grid], dict(node.attrs), n_out=2)
        return [dx, dgrid]


@register
class GridSampleGrad(Op):
    """dx, dgrid of GridSample (inputs dy, x, grid; GridSample's attrs): dx zero-filled, then each output position
    adds dy * w to its taps (atomically: positions share taps); dgrid summed over the channels per position"""
    name = "GridSampleGrad"
    dtypes = ("float32",)
    attrs = ATTRS

    def infer(self, node):
        _, x, grid = node.inputs
        return [(x.dtype, x.shape), (grid.dtype, grid.shape)]

    def numpy(self, node, dy, x, grid):
        xp, g = _planes(x, grid)
        gy = dy.reshape(xp.shape[:2] + g.shape[1:2]).astype(np.float64)
        dx, dgrid = np.zeros_like(xp), np.zeros_like(g)
        n_idx, c_idx = np.indices(gy.shape)[:2]
        for flat, inside, w, slopes in _combos(x.shape, g, node.attrs):
            mask, at = inside[:, None, :], np.broadcast_to(flat[:, None, :], gy.shape)
            np.add.at(dx, (n_idx, c_idx, at), np.where(mask, w[:, None, :] * gy, 0.0))
            taken = np.take_along_axis(xp, at, axis=2)
            seen = np.where(mask, gy * taken, 0.0).sum(axis=1)  # [N, O]
            for j, s in enumerate(slopes):
                dgrid[..., j] += seen * s
        return [dx.reshape(x.shape).astype(x.dtype), dgrid.reshape(grid.shape).astype(grid.dtype)]

    def lower(self, node, lw):
        lw.gridsample_grad(node)
