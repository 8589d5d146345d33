"""Resize (op-sets 10-19) and Upsample (7, 9), composed from existing IR ops.

Interpolation is separable, so each resized axis is one linear map along that axis. The handler builds, on the
host, a small constant table per axis (output index -> input taps and weights, the spec's coordinate transform
and coefficient functions) and applies it as:
- nearest: a Gather of the chosen input index (exact, any dtype);
- linear / cubic (antialias included): a Gemm with the (out, in) weight matrix over x viewed as [pre, in, post].
tf_crop_and_resize rows that fall outside the input take `extrapolation_value` (a Where, or the Gemm's C).
"""
import numpy as np

from ..errors import ModelError
from .common import const, handler, norm_axis, reshape


def _x_original(mode, y, scale, in_len, out_len, roi):
    """Source coordinate of each output index (the spec's coordinate_transformation_mode); float64."""
    out_w = scale * in_len
    if mode == "align_corners":
        return np.zeros(out_len) if out_w == 1 else y * (in_len - 1) / (out_w - 1)
    if mode == "asymmetric":
        return y / scale
    if mode == "tf_crop_and_resize":
        if out_w == 1:
            x = np.full(out_len, (roi[1] - roi[0]) * (in_len - 1) / 2)
        else:
            x = y * (roi[1] - roi[0]) * (in_len - 1) / (out_w - 1)
        return x + roi[0] * (in_len - 1)
    if mode == "pytorch_half_pixel":
        return np.full(out_len, -0.5) if out_w == 1 else (y + 0.5) / scale - 0.5
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / out_w)
        return offset + (y + 0.5) / scale - 0.5
    raise ModelError(f"Resize: unknown coordinate_transformation_mode {mode!r}")


def _nearest(ratio, rounding):
    if float(ratio).is_integer():
        return np.array([0.0, 1.0])
    table = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5, "floor": False, "ceil": True}
    if rounding not in table:
        raise ModelError(f"Resize: unknown nearest_mode {rounding!r}")
    up = table[rounding]
    return np.array([0.0 if up else 1.0, 1.0 if up else 0.0])


def _linear(ratio, scale, antialias):
    if not antialias or scale >= 1:
        return np.array([1 - ratio, ratio])
    start = int(np.floor(-1 / scale) + 1)
    args = (np.arange(start, 2 - start) - ratio) * scale
    w = np.clip(1 - np.abs(args), 0, 1)
    return w / w.sum()


def _cubic(ratio, scale, antialias, a):
    if not antialias or scale >= 1:
        r, s = ratio, 1 - ratio
        return np.array([((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
                         ((a + 2) * r - (a + 3)) * r * r + 1,
                         ((a + 2) * s - (a + 3)) * s * s + 1,
                         ((a * (s + 1) - 5 * a) * (s + 1) + 8 * a) * (s + 1) - 4 * a])
    start = int(np.floor(-2 / scale) + 1)
    x = np.abs(scale * (np.arange(start, 2 - start) - ratio))
    w = np.where(x <= 1, (a + 2) * x ** 3 - (a + 3) * x ** 2 + 1,
                 np.where(x < 2, a * x ** 3 - 5 * a * x ** 2 + 8 * a * x - 4 * a, 0.0))
    return w / w.sum()


def axis_table(at, in_len, out_len, scale, roi):
    """(weights [out, in] float64, extrapolated rows mask or None) of one resized axis."""
    mode = at.get("mode", "nearest")
    ctm = at.get("coordinate_transformation_mode", "half_pixel")
    antialias = at.get("antialias", 0)
    y = np.arange(out_len, dtype=np.float64)
    x = _x_original(ctm, y, scale, in_len, out_len, roi)
    lo = np.floor(x)
    ratios = np.where(x == lo, 1.0, x - lo)
    if mode == "nearest":
        coeffs = [_nearest(r, at.get("nearest_mode", "round_prefer_floor")) for r in ratios]
    elif mode == "linear":
        coeffs = [_linear(r, scale, antialias) for r in ratios]
    elif mode == "cubic":
        coeffs = [_cubic(r, scale, antialias, at.get("cubic_coeff_a", -0.75)) for r in ratios]
    else:
        raise ModelError(f"Resize: unknown mode {mode!r}")
    coeffs = np.asarray(coeffs, np.float64).reshape(out_len, -1)
    n = coeffs.shape[1]
    # the n taps nearest to x, preferring lower indices (the spec's neighbour rule, in edge-padded coordinates)
    pad = int(np.ceil(n / 2))
    xp = x + pad
    p = np.floor(xp)
    frac = xp - p
    if n % 2 == 0:
        first = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        first = np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    taps = (p.astype(np.int64) + first)[:, None] + np.arange(n)[None, :] - pad
    if at.get("exclude_outside", 0):
        coeffs = np.where((taps < 0) | (taps >= in_len), 0.0, coeffs)
        total = coeffs.sum(axis=1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    weights = np.zeros((out_len, in_len))
    np.add.at(weights, (np.repeat(np.arange(out_len), n), np.clip(taps, 0, in_len - 1).ravel()), coeffs.ravel())
    extrapolated = None
    if ctm == "tf_crop_and_resize":
        extrapolated = (x < 0) | (x > in_len - 1)
        weights[extrapolated] = 0.0
    return weights, extrapolated


def resize_axis(b, x, axis, weights, extrapolated, at):
    """x resized along `axis` by the table of axis_table."""
    out_len, in_len = weights.shape
    shape = list(x.shape)
    shape[axis] = out_len
    extrap = float(at.get("extrapolation_value", 0.0))
    if at.get("mode", "nearest") == "nearest":
        idx = np.argmax(weights, axis=1).astype(np.int64)
        y = b.op("Gather", [x, b.const(idx)], {"axis": axis})
        if extrapolated is not None and extrapolated.any():
            mask = extrapolated.reshape((out_len,) + (1,) * (x.rank - axis - 1))
            y = b.op("Where", [b.const(mask), b.const(np.asarray(extrap, x.dtype)), y])
        return y
    pre = int(np.prod(x.shape[:axis], dtype=np.int64))
    post = int(np.prod(x.shape[axis + 1:], dtype=np.int64))
    xf = x if x.dtype == "float32" else b.op("Cast", [x], {"to": "float32"})
    inputs = [b.const(weights.astype(np.float32)), reshape(b, xf, (pre, in_len, post))]
    if extrapolated is not None and extrapolated.any():
        inputs.append(b.const((extrapolated * extrap).astype(np.float32).reshape(out_len, 1)))
    y = reshape(b, b.op("Gemm", inputs, {}), shape)
    return y if x.dtype == "float32" else b.op("Cast", [y], {"to": x.dtype})


def resize(imp, x, at, scales=None, sizes=None, roi=None, axes=None):
    """Output sizes and effective scales per the spec (sizes win over scales), then one map per resized axis."""
    r = x.rank
    axes = list(range(r)) if axes is None else [norm_axis(int(a), r) for a in axes]
    full_roi = [0.0] * r + [1.0] * r
    if roi is not None and len(roi):
        for i, a in enumerate(axes):
            full_roi[a], full_roi[a + r] = float(roi[i]), float(roi[i + len(axes)])
    scale = [1.0] * r
    out = list(x.shape)
    if sizes is not None and len(sizes):
        for i, a in enumerate(axes):
            out[a] = int(sizes[i])
            scale[a] = out[a] / x.shape[a]
        policy = at.get("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            pick = {"not_larger": min, "not_smaller": max}.get(policy)
            if pick is None:
                raise ModelError(f"Resize: unknown keep_aspect_ratio_policy {policy!r}")
            s = pick(scale[a] for a in axes)
            for a in axes:
                scale[a] = s
                out[a] = int(s * x.shape[a] + 0.5)
    elif scales is not None and len(scales):
        for i, a in enumerate(axes):
            scale[a] = float(scales[i])
            out[a] = int(np.floor(x.shape[a] * scale[a]))
    else:
        raise ModelError("Resize needs scales or sizes")
    if at.get("mode", "nearest") == "nearest" and at.get("antialias", 0):
        raise ModelError("Resize: antialias applies to linear and cubic modes only")
    y = x
    for a in axes:
        roi_a = (full_roi[a], full_roi[a + r])
        if np.isclose(scale[a], 1.0) and out[a] == y.shape[a] and roi_a == (0.0, 1.0):
            continue
        if out[a] == 0 or y.shape[a] == 0:
            raise ModelError(f"Resize of axis {a} from {y.shape[a]} to {out[a]} elements")
        weights, extrapolated = axis_table(at, y.shape[a], out[a], scale[a], roi_a)
        y = resize_axis(imp.b, y, a, weights, extrapolated, at)
    return y if y is not x else imp.b.op("Identity", [x])


def _opt(xs, i, what):
    v = xs[i] if len(xs) > i else None
    return None if v is None else np.asarray(const(v, what)).reshape(-1)


@handler("Upsample", 7)
def _upsample_7(imp, node, xs, at):  # scales attribute; asymmetric coordinates, nearest rounds down
    at_scales = at["scales"]
    at = {"mode": at.get("mode", "nearest"), "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    return [resize(imp, xs[0], at, scales=list(at_scales))]


@handler("Upsample", 9)
@handler("Resize", 10)
def _resize_10(imp, node, xs, at):  # scales input; op-set 10 semantics = Upsample: asymmetric, floor
    at = {"mode": at.get("mode", "nearest"), "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    return [resize(imp, xs[0], at, scales=_opt(xs, 1, "Resize's scales"))]


@handler("Resize", 11, 13, 18, 19)
def _resize_11(imp, node, xs, at):  # X, roi, scales, sizes; 18 adds antialias/axes/policy, 19 half_pixel_symmetric
    roi = _opt(xs, 1, "Resize's roi")
    scales = _opt(xs, 2, "Resize's scales")
    sizes = _opt(xs, 3, "Resize's sizes")
    return [resize(imp, xs[0], at, scales=scales, sizes=sizes, roi=roi, axes=at.get("axes"))]
