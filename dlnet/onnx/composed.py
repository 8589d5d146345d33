"""ONNX ops written as compositions of existing IR ops (no kernels of their own).

CumSum, CumProd, OneHot, EyeLike, LpNormalization, InstanceNormalization, LpPool/GlobalLpPool,
DepthToSpace/SpaceToDepth, ReverseSequence, TopK, Einsum, MaxUnpool, quantisation, the window functions (Hann,
Hamming, Blackman: constants).
"""
import numpy as np

from ..errors import ModelError
from .common import (
    HANDLERS,
    auto_pads,
    const,
    handler,
    norm_axis,
    onnx_dtype,
    pad,
    reshape,
    slice_axes,
    spatial_attrs,
)


def _c(b, value, dtype):
    return b.const(np.asarray(value, dtype))


def _sum(b, x, axes, keepdims):
    return b.op("Reduce", [x], {"mode": "sum", "axes": tuple(axes), "keepdims": keepdims})


# ---------------------------------------------------------------- CumSum -----------------------------------------
@handler("CumSum", 11, 14)  # 14 adds types
def _cumsum(imp, node, xs, at):
    """y[i] = sum_j T[i, j] x[j] along axis, T the (exclusive, reverse) triangle: a Gemm in float32, else Mul+Reduce."""
    b, x = imp.b, xs[0]
    axis = norm_axis(int(np.asarray(const(xs[1], "CumSum's axis")).reshape(-1)[0]), x.rank)
    n = x.shape[axis]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    rev, excl = at.get("reverse", 0), at.get("exclusive", 0)
    tri = (j > i if excl else j >= i) if rev else (j < i if excl else j <= i)
    pre = int(np.prod(x.shape[:axis], dtype=np.int64))
    post = int(np.prod(x.shape[axis + 1:], dtype=np.int64))
    x3 = reshape(b, x, (pre, n, post))
    if x.dtype == "float32":
        y = b.op("Gemm", [b.const(tri.astype(np.float32)), x3], {})
    else:
        prod = b.op("Mul", [reshape(b, x3, (pre, 1, n, post)), b.const(tri.astype(x.dtype).reshape(1, n, n, 1))])
        y = _sum(b, prod, (2,), 0)
    return [reshape(b, y, x.shape)]


@handler("CumProd", 26)
def _cumprod(imp, node, xs, at):
    """y[i] = prod_j (T[i, j] ? x[j] : 1) along axis, T the (exclusive, reverse) triangle: Where, then Reduce prod."""
    b, x = imp.b, xs[0]
    axis = norm_axis(int(np.asarray(const(xs[1], "CumProd's axis")).reshape(-1)[0]), x.rank)
    n = x.shape[axis]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    rev, excl = at.get("reverse", 0), at.get("exclusive", 0)
    tri = (j > i if excl else j >= i) if rev else (j < i if excl else j <= i)
    pre = int(np.prod(x.shape[:axis], dtype=np.int64))
    post = int(np.prod(x.shape[axis + 1:], dtype=np.int64))
    x4 = reshape(b, x, (pre, 1, n, post))
    picked = b.op("Where", [b.const(tri.reshape(1, n, n, 1)), x4, _c(b, 1, x.dtype)])
    y = b.op("Reduce", [picked], {"mode": "prod", "axes": (2,), "keepdims": 0})
    return [reshape(b, y, x.shape)]


# ---------------------------------------------------------------- OneHot, EyeLike ---------------------------------
@handler("OneHot", 9, 11, 28)  # 11: negative indices count from the end; 28 adds types
def _onehot(imp, node, xs, at):
    b = imp.b
    idx, values = xs[0], xs[2]
    depth = int(np.asarray(const(xs[1], "OneHot's depth")).reshape(-1)[0])
    rank = idx.rank + 1
    axis = norm_axis(at.get("axis", -1), rank)
    i64 = idx if idx.dtype == "int64" else b.op("Cast", [idx], {"to": "int64"})
    i64 = b.op("Where", [b.op("Less", [i64, _c(b, 0, np.int64)]), b.op("Add", [i64, _c(b, depth, np.int64)]), i64])
    shape = list(idx.shape)
    shape.insert(axis, 1)
    ids = b.const(np.arange(depth, dtype=np.int64).reshape((depth,) + (1,) * (rank - axis - 1)))
    hit = b.op("Equal", [reshape(b, i64, shape), ids])
    off = reshape(b, slice_axes(imp, values, [0], [1], None, None), ())
    on = reshape(b, slice_axes(imp, values, [1], [2], None, None), ())
    return [b.op("Where", [hit, on, off])]


@handler("EyeLike", 9, 22)  # 22 adds types; the output depends on the input's shape only
def _eyelike(imp, node, xs, at):
    x = xs[0]
    dtype = onnx_dtype(at["dtype"]) if "dtype" in at else x.dtype
    return [imp.b.const(np.eye(x.shape[0], x.shape[1], k=at.get("k", 0), dtype=dtype))]


# ---------------------------------------------------------------- normalisations ----------------------------------
@handler("LpNormalization", 1, 22)
def _lp_normalization(imp, node, xs, at):  # y = x / ||x||_p along axis (p = 1 or 2), 0 where the norm is 0
    b, x = imp.b, xs[0]
    p = at.get("p", 2)
    if p not in (1, 2):
        raise ModelError(f"LpNormalization with p={p}: only 1 and 2 exist")
    axis = norm_axis(at.get("axis", -1), x.rank)
    norm = b.op("Reduce", [x], {"mode": "l1" if p == 1 else "l2", "axes": (axis,), "keepdims": 1})
    zero = _c(b, 0, x.dtype)
    norm = b.op("Where", [b.op("Equal", [norm, zero]), _c(b, 1, x.dtype), norm])  # 0 / 0 = 0 (the reference)
    return [b.op("Div", [x, norm])]


@handler("InstanceNormalization", 1, 6, 22)  # 6 drops consumed_inputs; 22 adds types
def _instance_norm(imp, node, xs, at):  # y = (x - mean) / sqrt(var + eps) * scale + B over the spatial axes
    b = imp.b
    x, scale, bias = xs
    axes = tuple(range(2, x.rank))
    cshape = (x.shape[1],) + (1,) * (x.rank - 2)
    centred = b.op("Sub", [x, b.op("Reduce", [x], {"mode": "mean", "axes": axes, "keepdims": 1})])
    var = b.op("Reduce", [b.op("Mul", [centred, centred])], {"mode": "mean", "axes": axes, "keepdims": 1})
    std = b.op("Sqrt", [b.op("Add", [var, _c(b, at.get("epsilon", 1e-5), x.dtype)])])
    y = b.op("Mul", [b.op("Div", [centred, std]), reshape(b, scale, cshape)])
    return [b.op("Add", [y, reshape(b, bias, cshape)])]


# ---------------------------------------------------------------- Lp pooling --------------------------------------
def _pow_abs(b, x, p):
    return b.op("Mul", [x, x]) if p == 2 else b.op("Pow", [b.op("Abs", [x]), _c(b, p, x.dtype)])


def _root(b, x, p):
    return b.op("Sqrt", [x]) if p == 2 else b.op("Pow", [x, _c(b, 1.0 / p, x.dtype)])


@handler("LpPool", 1, 2, 11, 18, 22)  # 2: integer p; 11: auto_pad/pads; 18: dilations, ceil_mode
def _lppool(imp, node, xs, at):  # y = (sum over the window of |x|^p)^(1/p) = (avg-with-padding * size)^(1/p)
    b, x = imp.b, xs[0]
    p = float(at.get("p", 2))
    nsp = x.rank - 2
    kernel = list(at["kernel_shape"])
    strides, pads, dil = spatial_attrs(at, nsp)
    pads = auto_pads(at, pads, x.shape[2:], kernel, strides, dil)
    attrs = {"kernel_shape": tuple(kernel), "strides": tuple(strides), "pads": tuple(pads), "dilations": tuple(dil),
             "count_include_pad": 1}
    if at.get("ceil_mode", 0):
        attrs["ceil_mode"] = 1
    avg = b.op("AveragePool", [_pow_abs(b, x, p)], attrs)
    total = b.op("Mul", [avg, _c(b, float(np.prod(kernel)), x.dtype)])
    return [_root(b, total, p)]


@handler("GlobalLpPool", 1, 2, 22)
def _global_lppool(imp, node, xs, at):
    b, x = imp.b, xs[0]
    p = float(at.get("p", 2))
    return [_root(b, _sum(b, _pow_abs(b, x, p), range(2, x.rank), 1), p)]


# ---------------------------------------------------------------- DepthToSpace, SpaceToDepth ----------------------
@handler("DepthToSpace", 1, 11, 13, 28)  # 11 adds mode CRD (default DCR)
def _depth_to_space(imp, node, xs, at):
    b, x = imp.b, xs[0]
    n, c, h, w = x.shape
    s = at["blocksize"]
    if at.get("mode", "DCR") == "CRD":
        y = b.op("Transpose", [reshape(b, x, (n, c // (s * s), s, s, h, w))], {"perm": (0, 1, 4, 2, 5, 3)})
    else:
        y = b.op("Transpose", [reshape(b, x, (n, s, s, c // (s * s), h, w))], {"perm": (0, 3, 4, 1, 5, 2)})
    return [reshape(b, y, (n, c // (s * s), h * s, w * s))]


@handler("SpaceToDepth", 1, 13, 28)  # 28 adds mode (CRD); DCR before
def _space_to_depth(imp, node, xs, at):
    b, x = imp.b, xs[0]
    n, c, h, w = x.shape
    s = at["blocksize"]
    perm = (0, 1, 3, 5, 2, 4) if at.get("mode", "DCR") == "CRD" else (0, 3, 5, 1, 2, 4)
    y = b.op("Transpose", [reshape(b, x, (n, c, h // s, s, w // s, s))], {"perm": perm})
    return [reshape(b, y, (n, c * s * s, h // s, w // s))]


# ---------------------------------------------------------------- ReverseSequence ---------------------------------
@handler("ReverseSequence", 10, 28)
def _reverse_sequence(imp, node, xs, at):  # src[t] = len - 1 - t for t < len, else t; a GatherElements on time
    b = imp.b
    x, lens = xs
    t_axis, b_axis = at.get("time_axis", 0), at.get("batch_axis", 1)
    shape = [1] * x.rank
    shape[b_axis] = x.shape[b_axis]
    lens = reshape(b, b.op("Cast", [lens], {"to": "int64"}) if lens.dtype != "int64" else lens, shape)
    tshape = [1] * x.rank
    tshape[t_axis] = x.shape[t_axis]
    t = b.const(np.arange(x.shape[t_axis], dtype=np.int64).reshape(tshape))
    src = b.op("Where", [b.op("Less", [t, lens]), b.op("Sub", [b.op("Sub", [lens, _c(b, 1, np.int64)]), t]), t])
    src = b.op("Expand", [src], {"shape": x.shape})
    return [b.op("GatherElements", [x, src], {"axis": t_axis})]


# ---------------------------------------------------------------- TopK --------------------------------------------
def _topk(imp, x, k, axis, largest):
    """rank[i] = #{j: x_j beats x_i} (ties: lower index first); index of output r = the i with rank r; values
    gathered."""
    b = imp.b
    n = x.shape[axis]
    if not 0 <= k <= n:
        raise ModelError(f"TopK with k={k} over an axis of {n}")
    xi = reshape(b, x, x.shape[:axis + 1] + (1,) + x.shape[axis + 1:])
    xj = reshape(b, x, x.shape[:axis] + (1,) + x.shape[axis:])
    tail = (1,) * (x.rank - axis - 1)
    earlier = b.const((np.arange(n)[None, :] < np.arange(n)[:, None]).reshape((n, n) + tail))
    beats = b.op("Or", [b.op("Greater" if largest else "Less", [xj, xi]),
                        b.op("And", [b.op("Equal", [xj, xi]), earlier])])
    rank = _sum(b, b.op("Cast", [beats], {"to": "int64"}), (axis + 1,), 1)
    is_r = b.op("Equal", [rank, b.const(np.arange(k, dtype=np.int64).reshape((1, k) + tail))])
    ids = b.const(np.arange(n, dtype=np.int64).reshape((n, 1) + tail))
    idx = _sum(b, b.op("Mul", [b.op("Cast", [is_r], {"to": "int64"}), ids]), (axis,), 0)
    return [b.op("GatherElements", [x, idx], {"axis": axis}), idx]


@handler("TopK", 1)
def _topk_1(imp, node, xs, at):  # k attribute, largest only
    x = xs[0]
    return _topk(imp, x, at["k"], norm_axis(at.get("axis", -1), x.rank), True)


@handler("TopK", 10)
def _topk_10(imp, node, xs, at):  # k moved to an input
    x = xs[0]
    k = int(np.asarray(const(xs[1], "TopK's k")).reshape(-1)[0])
    return _topk(imp, x, k, norm_axis(at.get("axis", -1), x.rank), True)


@handler("TopK", 11, 24)  # 11 adds largest/sorted (sorted output is always given); 24 adds types
def _topk_11(imp, node, xs, at):
    x = xs[0]
    k = int(np.asarray(const(xs[1], "TopK's k")).reshape(-1)[0])
    return _topk(imp, x, k, norm_axis(at.get("axis", -1), x.rank), at.get("largest", 1))


# ---------------------------------------------------------------- Einsum ------------------------------------------
@handler("Einsum", 12, 28)
def _einsum(imp, node, xs, at):
    """Broadcast product over the union of labels, then a sum over the labels not in the output.

    A label repeated within one operand (a diagonal) becomes a fresh label times an identity mask.
    """
    b = imp.b
    eq = at["equation"].replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(xs):
        raise ModelError(f"Einsum {eq!r} names {len(terms)} operands, got {len(xs)}")
    fresh = iter("ABCDEFGHIJKLMNOPQRSTUVWXYZ" + "αβγδεζηθικλμνξοπρστυφχψω")
    ell_rank = max((x.rank - len(t.replace("...", "")) for t, x in zip(terms, xs, strict=False) if "..." in t),
                   default=0)
    ell = [next(fresh) for _ in range(ell_rank)]
    labels, ops = [], []
    for t, x in zip(terms, xs, strict=False):
        if "..." in t:
            head, tail = t.split("...")
            n = x.rank - len(head) - len(tail)
            t = list(head) + ell[ell_rank - n:] + list(tail)
        else:
            t = list(t)
        if len(t) != x.rank:
            raise ModelError(f"Einsum term {''.join(t)!r} for an operand of rank {x.rank}")
        seen = []
        for i, lab in enumerate(t):
            if lab in seen:  # diagonal: x * eye over (first occurrence, this one), this one summed away
                new = next(fresh)
                first = t.index(lab)
                mask = (np.arange(x.shape[first]).reshape([-1 if d == first else 1 for d in range(x.rank)])
                        == np.arange(x.shape[i]).reshape([-1 if d == i else 1 for d in range(x.rank)]))
                x = b.op("Mul", [x, b.const(mask.astype(x.dtype))])
                t[i] = new
            seen.append(t[i])
        labels.append(t)
        ops.append(x)
    if not arrow:
        counts = {}
        for t in labels:
            for lab in t:
                counts[lab] = counts.get(lab, 0) + 1
        out = ell + sorted(lab for lab, c in counts.items() if c == 1 and lab not in ell)
    else:
        out = list(out.replace("...", "".join(ell)))
    allv = list(out) + [lab for t in labels for lab in t if lab not in out]
    allv = list(dict.fromkeys(allv))
    y = None
    for t, x in zip(labels, ops, strict=False):
        order = sorted(range(len(t)), key=lambda d: allv.index(t[d]))
        if order != list(range(len(t))):
            x = b.op("Transpose", [x], {"perm": tuple(order)})
        tt = [t[d] for d in order]
        dims = {lab: x.shape[i] for i, lab in enumerate(tt)}
        x = reshape(b, x, [dims.get(lab, 1) for lab in allv])
        y = x if y is None else b.op("Mul", [y, x])
    summed = tuple(range(len(out), len(allv)))
    sizes = {}
    for t, x in zip(labels, ops, strict=False):
        for i, lab in enumerate(t):
            sizes[lab] = max(sizes.get(lab, 1), x.shape[i])
    full = tuple(sizes[lab] for lab in allv)
    if y.shape != full:
        y = b.op("Expand", [y], {"shape": full})
    if summed:
        y = _sum(b, y, summed, 0)
    return [y if y is not xs[0] else b.op("Identity", [y])]


# ---------------------------------------------------------------- MaxUnpool -------------------------------------
@handler("MaxUnpool", 9, 11, 22)  # 11 adds types; output_shape is an optional input
def _maxunpool(imp, node, xs, at):
    """y = zeros(pooled-from shape); y.flat[indices] = x (a ScatterElements); output_shape zero-pads the ends."""
    b = imp.b
    x, idx = xs[0], xs[1]
    nsp = x.rank - 2
    kernel = at["kernel_shape"]
    strides, pads, _ = spatial_attrs(at, nsp)
    shape = x.shape[:2] + tuple((d - 1) * s + k - pads[i] - pads[i + nsp]
                                for i, (d, s, k) in enumerate(zip(x.shape[2:], strides, kernel, strict=False)))
    total = int(np.prod(shape, dtype=np.int64))
    zeros = b.const(np.zeros(total, x.dtype))
    y = b.op("ScatterElements", [zeros, reshape(b, idx, (x.size,)), reshape(b, x, (x.size,))], {"axis": 0})
    y = reshape(b, y, shape)
    if len(xs) > 2 and xs[2] is not None:
        out = [int(d) for d in const(xs[2], "MaxUnpool's output_shape")]
        y = pad(imp, y, [0] * x.rank + [o - d for o, d in zip(out, shape, strict=False)], "constant", 0.0)
    return [y]


# ---------------------------------------------------------------- linear quantisation ------------------------------
QUANT_RANGE = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767),
               "int32": (-2**31, 2**31 - 1)}


def _per_axis(imp, v, x, axis, block=0):
    """A scale/zero point: scalar, 1-D along `axis` (op-set 13), or blocks along `axis` (op-set 21: each entry
    repeated block_size times, an Expand of an inserted unit dim)."""
    b = imp.b
    if v.rank == 0 or v.size == 1:
        return reshape(b, v, ())
    axis = norm_axis(axis, x.rank)
    if v.rank == x.rank and block:
        inter = v.shape[:axis + 1] + (1,) + v.shape[axis + 1:]
        full = v.shape[:axis + 1] + (block,) + v.shape[axis + 1:]
        v = reshape(b, b.op("Expand", [reshape(b, v, inter)], {"shape": full}),
                    v.shape[:axis] + (v.shape[axis] * block,) + v.shape[axis + 1:])
        return v if v.shape == x.shape else slice_axes(imp, v, [0] * x.rank, list(x.shape), None, None)
    if v.rank != 1:
        raise ModelError(f"a quantisation scale of shape {list(v.shape)} for input {list(x.shape)}")
    return reshape(imp.b, v, [v.size if d == axis else 1 for d in range(x.rank)])


def _quantize(b, x, scale, zp, dtype):
    """y = saturate(round_half_even(x / scale) + zp) in dtype."""
    lo, hi = QUANT_RANGE[dtype]
    y = b.op("Round", [b.op("Div", [x, scale])])
    if zp is not None:
        y = b.op("Add", [y, b.op("Cast", [zp], {"to": x.dtype})])
    y = b.op("Max", [b.op("Min", [y, _c(b, hi, x.dtype)]), _c(b, lo, x.dtype)])
    return b.op("Cast", [y], {"to": dtype})


@handler("QuantizeLinear", 10, 13, 19, 21, 23, 24, 25, 28)  # 13: per-axis; 19: float16 scales; 21: blocks, output_dtype
def _quantize_linear(imp, node, xs, at):
    b, x = imp.b, xs[0]
    axis = at.get("axis", 1)
    zp = xs[2] if len(xs) > 2 and xs[2] is not None else None
    dtype = zp.dtype if zp is not None else "uint8"
    if zp is None and at.get("output_dtype", 0):
            dtype = onnx_dtype(at["output_dtype"])
    if dtype not in QUANT_RANGE:
        raise ModelError(f"QuantizeLinear to {dtype} is not supported (supported: {sorted(QUANT_RANGE)})")
    block = at.get("block_size", 0)
    scale = _per_axis(imp, xs[1], x, axis, block)
    xf = x if x.dtype == scale.dtype else b.op("Cast", [x], {"to": scale.dtype})
    return [_quantize(b, xf, scale, _per_axis(imp, zp, x, axis, block) if zp is not None else None, dtype)]


@handler("DequantizeLinear", 10, 13, 19, 21, 23, 24, 25, 28)  # later versions add types
def _dequantize_linear(imp, node, xs, at):  # y = (x - zp) * scale, in the scale's dtype
    b, x = imp.b, xs[0]
    axis = at.get("axis", 1)
    block = at.get("block_size", 0)
    scale = _per_axis(imp, xs[1], x, axis, block)
    y = b.op("Cast", [x], {"to": scale.dtype})
    if len(xs) > 2 and xs[2] is not None:
        y = b.op("Sub", [y, b.op("Cast", [_per_axis(imp, xs[2], x, axis, block)], {"to": scale.dtype})])
    return [b.op("Mul", [y, scale])]


@handler("DynamicQuantizeLinear", 11)
def _dynamic_quantize_linear(imp, node, xs, at):
    """scale = (max(x, 0) - min(x, 0)) / 255, zp = saturate(round(-min / scale)), y = quantize(x) to uint8."""
    b, x = imp.b, xs[0]
    every = tuple(range(x.rank))
    zero = _c(b, 0, x.dtype)
    lo = b.op("Min", [b.op("Reduce", [x], {"mode": "min", "axes": every, "keepdims": 0}), zero])
    hi = b.op("Max", [b.op("Reduce", [x], {"mode": "max", "axes": every, "keepdims": 0}), zero])
    scale = b.op("Div", [b.op("Sub", [hi, lo]), _c(b, 255, x.dtype)])
    zp = _quantize(b, b.op("Neg", [lo]), scale, None, "uint8")
    return [_quantize(b, x, scale, zp, "uint8"), scale, zp]


# ---------------------------------------------------------------- integer and quantised linear algebra -----------
# Integer products run through the float32 kernels: exact while every partial sum stays below 2^24.
def _minus_zp(imp, v, zp, axis=None):
    b = imp.b
    y = b.op("Cast", [v], {"to": "float32"})
    if zp is None:
        return y
    z = b.op("Cast", [zp], {"to": "float32"})
    if zp.rank == 1 and zp.size > 1 and axis is not None:
        z = reshape(b, z, [zp.size if d == axis % v.rank else 1 for d in range(v.rank)])
    else:
        z = reshape(b, z, ()) if zp.size == 1 else z
    return b.op("Sub", [y, z])


def _matmul(imp, a, bm):
    return HANDLERS["MatMul"][13](imp, None, [a, bm], {})[0]


def _conv_float(imp, x, w, at):
    return HANDLERS["Conv"][11](imp, None, [x, w], at)[0]


def _opt_in(xs, i):
    return xs[i] if len(xs) > i and xs[i] is not None else None


@handler("MatMulInteger", 10)
def _matmul_integer(imp, node, xs, at):  # y = (A - a_zp) @ (B - b_zp) in int32; b_zp may be per column
    a = _minus_zp(imp, xs[0], _opt_in(xs, 2))
    bm = _minus_zp(imp, xs[1], _opt_in(xs, 3), axis=-1)
    return [imp.b.op("Cast", [_matmul(imp, a, bm)], {"to": "int32"})]


@handler("ConvInteger", 10)
def _conv_integer(imp, node, xs, at):  # y = conv(x - x_zp, w - w_zp) in int32; w_zp may be per output channel
    x = _minus_zp(imp, xs[0], _opt_in(xs, 2))
    w = _minus_zp(imp, xs[1], _opt_in(xs, 3), axis=0)
    return [imp.b.op("Cast", [_conv_float(imp, x, w, at)], {"to": "int32"})]


def _dequant(imp, v, scale, zp, axis=None):
    b = imp.b
    s = b.op("Cast", [scale], {"to": "float32"}) if scale.dtype != "float32" else scale
    if scale.rank == 1 and scale.size > 1 and axis is not None:
        s = reshape(b, s, [scale.size if d == axis % v.rank else 1 for d in range(v.rank)])
    else:
        s = reshape(b, s, ()) if scale.size == 1 else s
    return b.op("Mul", [_minus_zp(imp, v, zp, axis), s])


def _requant(imp, y, scale, zp):
    b = imp.b
    s = b.op("Cast", [scale], {"to": "float32"}) if scale.dtype != "float32" else scale
    return _quantize(b, y, reshape(b, s, ()), reshape(b, zp, ()), zp.dtype)


@handler("QLinearMatMul", 10, 21)  # 21 adds float16 scales and more types
def _qlinear_matmul(imp, node, xs, at):  # y = quantize(dequant(a) @ dequant(b), y_scale, y_zp)
    a = _dequant(imp, xs[0], xs[1], xs[2])
    bm = _dequant(imp, xs[3], xs[4], xs[5], axis=-1)
    return [_requant(imp, _matmul(imp, a, bm), xs[6], xs[7])]


@handler("QLinearConv", 10)
def _qlinear_conv(imp, node, xs, at):  # y = quantize(conv(dequant(x), dequant(w)) + B * x_scale * w_scale)
    b = imp.b
    x = _dequant(imp, xs[0], xs[1], xs[2])
    w = _dequant(imp, xs[3], xs[4], xs[5], axis=0)
    y = _conv_float(imp, x, w, at)
    if _opt_in(xs, 8) is not None:
        bias = b.op("Mul", [b.op("Cast", [xs[8]], {"to": "float32"}),
                            b.op("Mul", [reshape(b, xs[1], ()), xs[4] if xs[4].size > 1 else reshape(b, xs[4], ())])])
        y = b.op("Add", [y, reshape(b, bias, (xs[8].size,) + (1,) * (y.rank - 2))])
    return [_requant(imp, y, xs[6], xs[7])]


# ---------------------------------------------------------------- window functions (op-set 17) ------------------
WINDOWS = {  # w[n] over t = 2 pi n / N (N = size when periodic, else size - 1), as onnx.reference computes them
    "HannWindow": lambda t: 0.5 - 0.5 * np.cos(t),
    "HammingWindow": lambda t: 25.0 / 46.0 - (1 - 25.0 / 46.0) * np.cos(t),
    "BlackmanWindow": lambda t: 0.42 - 0.5 * np.cos(t) + 0.08 * np.cos(2 * t),
}


@handler("HannWindow", 17)
@handler("HammingWindow", 17)
@handler("BlackmanWindow", 17)
def _window(imp, node, xs, at):  # a constant: the size must be known at load
    size = int(np.asarray(const(xs[0], f"{node.op_type}'s size")).reshape(-1)[0])
    span = size if at.get("periodic", 1) else size - 1
    t = 2 * np.pi * np.arange(size, dtype=np.float64) / span if span else np.zeros(size)
    return [imp.b.const(WINDOWS[node.op_type](t).astype(onnx_dtype(at.get("output_datatype", 1))))]
