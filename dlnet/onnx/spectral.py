"""Spectral ops: DFT (17, 20), STFT (17), MelWeightMatrix (17).

A DFT along one axis is linear in the real and imaginary parts, so it is products with constant cosine and sine
matrices (a Gemm in float32, Mul and Reduce otherwise), the signal's truncation or zero padding to dft_length folded
into them; STFT gathers the frames by a constant index first. MelWeightMatrix is a constant computed at load.
"""
import numpy as np

from ..errors import ModelError
from .common import const, handler, norm_axis, onnx_dtype, pad, reshape, slice_axes


def _scalar(v, what):
    return np.asarray(const(v, what)).reshape(-1)[0].item()


def _matrices(n, length, inverse, onesided):
    """(re <- re, re <- im, im <- re, im <- im) as [K, n] float64 matrices (None where a part is 0), and K."""
    used = min(n, length)
    if inverse and onesided:  # irfft: the one-sided bins of a real signal of `length` samples
        bins = min(n, length // 2 + 1)
        t, k = np.arange(length)[:, None], np.arange(bins)[None, :]
        w = np.where((k == 0) | (2 * k == length), 1.0, 2.0) / length
        ang = 2 * np.pi * t * k / length
        sin = np.where((k == 0) | (2 * k == length), 0.0, np.sin(ang))  # (their imaginary parts do not count)
        full = [np.zeros((length, n)) for _ in range(2)]
        full[0][:, :bins], full[1][:, :bins] = w * np.cos(ang), -w * sin
        return (full[0], full[1], None, None), length
    out = length // 2 + 1 if onesided and not inverse else length
    k, m = np.arange(out)[:, None], np.arange(used)[None, :]
    ang = 2 * np.pi * ((k * m) % length) / length
    cos, sin = np.zeros((out, n)), np.zeros((out, n))
    cos[:, :used], sin[:, :used] = np.cos(ang), np.sin(ang)
    if inverse:
        return (cos / length, -sin / length, sin / length, cos / length), out
    return (cos, sin, -sin, cos), out


def _apply(b, m, x3):
    """m [K, N] times x3 [pre, N, post] along N: [pre, K, post]."""
    if x3.dtype == "float32":
        return b.op("Gemm", [b.const(m.astype(np.float32)), x3], {})
    pre, n, post = x3.shape
    prod = b.op("Mul", [reshape(b, x3, (pre, 1, n, post)), b.const(m.astype(x3.dtype).reshape((1,) + m.shape + (1,)))])
    return b.op("Reduce", [prod], {"mode": "sum", "axes": (2,), "keepdims": 0})


def dft(imp, x, axis, length, inverse, onesided):
    """x [..., n at axis, ..., 1 or 2 (real, imaginary)] -> its DFT along axis, as the ONNX DFT defines it."""
    b = imp.b
    if x.rank < 2 or x.shape[-1] not in (1, 2):
        raise ModelError(f"the input's last dim holds the real (1) or real and imaginary (2) parts, got "
                         f"{list(x.shape)}")
    if x.dtype not in ("float32", "float64", "float16"):
        raise ModelError(f"dtype {x.dtype} is not supported (supported: float32, float64, float16)")
    axis = norm_axis(axis, x.rank)
    if axis == x.rank - 1:
        raise ModelError(f"axis {axis} is the real/imaginary dim; the transform runs along another")
    n = x.shape[axis]
    if length is None:
        length = 2 * (n - 1) if inverse and onesided else n
    if length < 1:
        raise ModelError(f"dft_length {length}: expected >= 1")
    mats, out = _matrices(n, int(length), inverse, onesided)
    pre = int(np.prod(x.shape[:axis], dtype=np.int64))
    post = int(np.prod(x.shape[axis + 1:-1], dtype=np.int64))
    wide = x.dtype == "float16"  # (float16 runs the products in float32)
    xw = b.op("Cast", [x], {"to": "float32"}) if wide else x
    x4 = reshape(b, xw, (pre, n, post, x.shape[-1]))
    parts = [reshape(b, slice_axes(imp, x4, [c], [c + 1], [3], None), (pre, n, post)) for c in range(x.shape[-1])]
    ys = []
    for row in (mats[:2], mats[2:]):
        terms = [_apply(b, m, p) for m, p in zip(row, parts) if m is not None]
        if terms:
            ys.append(terms[0] if len(terms) == 1 else b.op("Add", terms))
    y = ys[0] if len(ys) == 1 else b.op("Concat", [reshape(b, v, (pre, out, post, 1)) for v in ys], {"axis": 3})
    y = reshape(b, y, x.shape[:axis] + (out,) + x.shape[axis + 1:-1] + (len(ys),))
    return b.op("Cast", [y], {"to": "float16"}) if wide else y


@handler("DFT", 17)
def _dft_17(imp, node, xs, at):  # 17: the axis is an attribute (default 1)
    length = _scalar(xs[1], "DFT's dft_length") if len(xs) > 1 and xs[1] is not None else None
    return [dft(imp, xs[0], at.get("axis", 1), length, at.get("inverse", 0), at.get("onesided", 0))]


@handler("DFT", 20)
def _dft_20(imp, node, xs, at):  # 20: the axis is an input (default -2)
    length = _scalar(xs[1], "DFT's dft_length") if len(xs) > 1 and xs[1] is not None else None
    axis = _scalar(xs[2], "DFT's axis") if len(xs) > 2 and xs[2] is not None else -2
    return [dft(imp, xs[0], axis, length, at.get("inverse", 0), at.get("onesided", 0))]


@handler("STFT", 17)
def _stft(imp, node, xs, at):
    """Frames of the signal [batch, length, 1 or 2] every frame_step, times the window, each DFT'd (frame_length
    points): [batch, frames, bins, 2]."""
    b, x = imp.b, xs[0]
    if x.rank != 3:
        raise ModelError(f"signal must be [batch, length, 1 or 2], got {list(x.shape)}")
    step = int(_scalar(xs[1], "STFT's frame_step"))
    window = xs[2] if len(xs) > 2 else None
    size = window.shape[0] if window is not None else None
    length = int(_scalar(xs[3], "STFT's frame_length")) if len(xs) > 3 and xs[3] is not None else size or x.shape[1]
    size = size or length
    if step < 1 or length < 1 or length > x.shape[1] or (window is not None and window.rank != 1):
        raise ModelError(f"frame_step {step}, frame_length {length}, window {None if window is None else window.shape}"
                         f" do not fit a signal of {x.shape[1]} samples")
    frames = 1 + (x.shape[1] - length) // step
    need = (frames - 1) * step + size
    if need > x.shape[1]:  # the last frames run past the end: zeros there
        x = pad(imp, x, [0, 0, 0, 0, need - x.shape[1], 0], "constant", 0.0)
    index = np.arange(frames)[:, None] * step + np.arange(size)[None, :]
    framed = b.op("Gather", [x, b.const(index.astype(np.int64))], {"axis": 1})
    if window is not None:
        framed = b.op("Mul", [framed, reshape(b, window, (1, 1, size, 1))])
    return [dft(imp, framed, 2, length, 0, at.get("onesided", 1))]


@handler("MelWeightMatrix", 17)
def _mel_weight_matrix(imp, node, xs, at):
    """[dft_length // 2 + 1, num_mel_bins] triangular filters between mel-spaced edges (the ONNX reference's
    integer bin edges), computed at load."""
    names = ("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz")
    mels, length, rate, low, high = [_scalar(v, f"MelWeightMatrix's {n}") for v, n in zip(xs, names)]
    if mels < 1 or length < 1 or rate <= 0 or not 0 <= low < high:
        raise ModelError(f"num_mel_bins {mels}, dft_length {length}, sample_rate {rate}, edges {low}..{high}: "
                         "expected positive sizes and 0 <= lower_edge_hertz < upper_edge_hertz")
    lo, hi = (2595 * np.log1p(f / 700) / np.log(10) for f in (low, high))
    edges = np.arange(mels + 2) * ((hi - lo) / (mels + 2)) + lo
    edges = (((length + 1) * (700 * np.expm1(edges / 2595 * np.log(10)))) // rate).astype(int)
    out = np.zeros((length // 2 + 1, mels))
    for i in range(mels):
        left, center, right = edges[i:i + 3]
        if center == left:
            out[center, i] = 1
        else:
            out[left:center + 1, i] = (np.arange(left, center + 1) - left) / (center - left)
        if right > center:
            out[center:right, i] = (right - np.arange(center, right)) / (right - center)
    return [imp.b.const(out.astype(onnx_dtype(at.get("output_datatype", 1))))]
