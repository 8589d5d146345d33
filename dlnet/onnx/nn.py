"""Neural-network layers: Conv, ConvTranspose (composed), MaxPool/AveragePool (MaxPool's Indices composed),
global pools, BatchNormalization, RoiAlign, LRN, MeanVarianceNormalization."""
import numpy as np

from ..errors import ModelError
from .common import auto_pads, handler, norm_axis, pad, reshape, slice_axes, spatial_attrs, widen_float16


@handler("Conv", 1, 11, 22)
@widen_float16
def _conv(imp, node, xs, at):
    x, w = xs[0], xs[1]
    nsp = x.rank - 2
    kernel = list(at.get("kernel_shape") or w.shape[2:])
    strides, pads, dil = spatial_attrs(at, nsp)
    pads = auto_pads(at, pads, x.shape[2:], kernel, strides, dil)
    inputs = [x, w] + ([xs[2]] if len(xs) > 2 and xs[2] is not None else [])
    return [imp.b.op("Conv", inputs, {"strides": tuple(strides), "pads": tuple(pads), "dilations": tuple(dil),
                                      "group": at.get("group", 1)})]


def _pool(imp, node, xs, at, op):
    x = xs[0]
    nsp = x.rank - 2
    kernel = list(at["kernel_shape"])
    strides, pads, dil = spatial_attrs(at, nsp)
    pads = auto_pads(at, pads, x.shape[2:], kernel, strides, dil)
    attrs = {"kernel_shape": tuple(kernel), "strides": tuple(strides), "pads": tuple(pads), "dilations": tuple(dil)}
    if at.get("ceil_mode", 0):
        attrs["ceil_mode"] = 1
    if op == "AveragePool":
        attrs["count_include_pad"] = at.get("count_include_pad", 0)
    y = imp.b.op(op, [x], attrs)
    if len(node.output) > 1 and node.output[1]:  # op-set 8+
        return [y, _maxpool_indices(imp.b, x, y, kernel, strides, pads, dil, at.get("storage_order", 0))]
    return [y]


def _maxpool_indices(b, x, y, kernel, strides, pads, dil, storage_order):
    """MaxPool's Indices: the flat index into x (row-major, or column-major over the spatial dims when
    storage_order=1) of the first maximum of each window. Windows are gathered from x with one padding slot
    (the lowest value) appended, arg-maxed, and mapped through a table of window offset -> flat index."""
    n, c, space, out = x.shape[0], x.shape[1], x.shape[2:], y.shape[2:]
    size = int(np.prod(space))
    grid = np.stack(np.meshgrid(*[np.arange(o) * st - p for o, st, p in zip(out, strides, pads, strict=False)],
                                indexing="ij"), -1)
    taps = np.stack(np.meshgrid(*[np.arange(k) * d for k, d in zip(kernel, dil, strict=False)], indexing="ij"), -1)
    at = grid.reshape(-1, 1, len(space)) + taps.reshape(1, -1, len(space))  # [windows, taps, spatial dims]
    inside = np.all((at >= 0) & (at < np.asarray(space)), axis=-1)
    row_major = np.ravel_multi_index(tuple(np.clip(at, 0, np.asarray(space) - 1).transpose(2, 0, 1)), space)
    col_major = np.ravel_multi_index(tuple(np.clip(at, 0, np.asarray(space) - 1)[..., ::-1].transpose(2, 0, 1)),
                                     space[::-1])
    lowest = np.finfo(x.dtype).min if np.dtype(x.dtype).kind == "f" else np.iinfo(x.dtype).min
    flat = b.op("Concat", [reshape(b, x, (n, c, size)), b.const(np.full((n, c, 1), lowest, x.dtype))], {"axis": 2})
    windows = b.op("Gather", [flat, b.const(np.where(inside, row_major, size).astype(np.int64))], {"axis": 2})
    first = b.op("ArgReduce", [windows], {"mode": "max", "axis": 3, "keepdims": 1})
    table = (col_major if storage_order else row_major).astype(np.int64)
    table = b.op("Expand", [b.const(table[None, None])], {"shape": (n, c) + table.shape})
    index = b.op("GatherElements", [table, first], {"axis": 3})
    plane = b.const((np.arange(n * c, dtype=np.int64) * size).reshape(n, c, 1, 1))
    return reshape(b, b.op("Add", [index, plane]), y.shape)


@handler("MaxPool", 1, 8, 10, 11, 12, 22)
def _maxpool(imp, node, xs, at):
    return _pool(imp, node, xs, at, "MaxPool")


@handler("AveragePool", 1, 7, 10, 11, 19, 22)
def _avgpool(imp, node, xs, at):
    return _pool(imp, node, xs, at, "AveragePool")


@handler("GlobalAveragePool", 1, 22)
def _gap(imp, node, xs, at):
    x = xs[0]
    return [imp.b.op("Reduce", [x], {"mode": "mean", "axes": tuple(range(2, x.rank)), "keepdims": 1})]


@handler("GlobalMaxPool", 1, 22)
def _gmp(imp, node, xs, at):
    x = xs[0]
    return [imp.b.op("Reduce", [x], {"mode": "max", "axes": tuple(range(2, x.rank)), "keepdims": 1})]


@handler("BatchNormalization", 1, 6, 7, 9, 14, 15)
def _batchnorm(imp, node, xs, at):
    # op-set < 9 had `spatial`; < 7 `is_test`; 14 added training_mode. Inference form here; training elsewhere.
    x, scale, bias, mean, var = xs[:5]
    if at.get("spatial", 1) == 0:
        raise ModelError("BatchNormalization with spatial=0 is not supported")
    stats_out = len(node.output) > 1 and any(node.output[1:])
    if (at.get("training_mode", 0) or stats_out) and not getattr(imp, "training", False):
        if imp.opset < 14:  # before 14 the extra outputs were saved statistics of a layout nobody agreed on
            raise ModelError("BatchNormalization's statistics outputs before op-set 14 are not supported")
        return _batchnorm_batch_stats(imp, x, scale, bias, mean, var, at.get("epsilon", 1e-5),
                                      at.get("momentum", 0.9))[:len(node.output)]
    if not getattr(imp, "training", False) and any(v.const is None for v in (scale, bias, mean, var)):
        return [_batchnorm_composed(imp.b, x, scale, bias, mean, var, at.get("epsilon", 1e-5))]
    if getattr(imp, "training", False):
        from ..graph.ops.grad_nn import batchnorm_training
        y = batchnorm_training(imp.b, x, scale, bias, mean, var, at.get("epsilon", 1e-5), at.get("momentum", 0.9),
                               imp.state_updates)
        return [y] + [None] * (len([o for o in node.output if o]) - 1)
    return [imp.b.op("BatchNormalization", [x, scale, bias, mean, var], {"epsilon": at.get("epsilon", 1e-5),
                                                                      "momentum": at.get("momentum", 0.9)})]


def _batchnorm_composed(b, x, scale, bias, mean, var, eps):
    """y = (x - mean) * scale / sqrt(var + eps) + B of primitives, for statistics known only at run time."""
    channel = (1, x.shape[1]) + (1,) * (x.rank - 2)
    scale, bias, mean, var = (reshape(b, v, channel) for v in (scale, bias, mean, var))
    inv = b.op("Div", [scale, b.op("Sqrt", [b.op("Add", [var, b.const(np.asarray(eps, x.dtype))])])])
    return b.op("Add", [b.op("Mul", [b.op("Sub", [x, mean]), inv]), bias])


def _batchnorm_batch_stats(imp, x, scale, bias, mean, var, eps, momentum):
    """training_mode=1 in an inference graph (op-set 14+): normalise by the batch's mean and (biased) variance;
    the outputs are y, mean * momentum + batch_mean * (1 - momentum), and the same for var."""
    b = imp.b
    axes = (0,) + tuple(range(2, x.rank))
    batch_mean = b.op("Reduce", [x], {"mode": "mean", "axes": axes, "keepdims": 1})
    centred = b.op("Sub", [x, batch_mean])
    batch_var = b.op("Reduce", [b.op("Mul", [centred, centred])], {"mode": "mean", "axes": axes, "keepdims": 1})
    y = _batchnorm_composed(b, x, scale, bias, batch_mean, batch_var, eps)
    keep = b.const(np.asarray(momentum, x.dtype))
    take = b.const(np.asarray(1 - momentum, x.dtype))
    running = [b.op("Add", [b.op("Mul", [reshape(b, old, (x.shape[1],)), keep]),
                            b.op("Mul", [reshape(b, new, (x.shape[1],)), take])])
               for old, new in ((mean, batch_mean), (var, batch_var))]
    return [y] + running


@handler("RoiAlign", 10, 16, 22)  # 16 adds coordinate_transformation_mode, default half_pixel (10 behaves as
def _roi_align(imp, node, xs, at):  # output_half_pixel); 22 adds types
    x, rois, batch = xs
    default = "half_pixel" if imp.opset >= 16 else "output_half_pixel"
    mode, coords = at.get("mode", "avg"), at.get("coordinate_transformation_mode", default)
    if mode not in ("avg", "max") or coords not in ("half_pixel", "output_half_pixel"):
        raise ModelError(f"RoiAlign's mode is {mode!r} and coordinate_transformation_mode {coords!r}; expected avg or "
                         "max, and half_pixel or output_half_pixel")
    if rois.dtype != x.dtype:
        rois = imp.b.op("Cast", [rois], {"to": x.dtype})
    if batch.dtype != "int64":
        batch = imp.b.op("Cast", [batch], {"to": "int64"})
    attrs = {"mode": mode, "output_height": at.get("output_height", 1), "output_width": at.get("output_width", 1),
             "sampling_ratio": at.get("sampling_ratio", 0), "spatial_scale": at.get("spatial_scale", 1.0),
             "half_pixel": int(coords == "half_pixel")}
    return [imp.b.op("RoiAlign", [x, rois, batch], attrs)]


@handler("LRN", 1, 13)
def _lrn(imp, node, xs, at):
    return [imp.b.op("LRN", [xs[0]], {"size": at["size"], "alpha": at.get("alpha", 1e-4),
                                      "beta": at.get("beta", 0.75), "bias": at.get("bias", 1.0)})]


# ---------------------------------------------------------------- ConvTranspose, composed -------------------------
@handler("ConvTranspose", 1, 11, 22)
@widen_float16
def _conv_transpose(imp, node, xs, at):
    """y = Conv(zero-insert(x, strides) padded by (k-1)*d - pads, flip(w) with in/out channels swapped per group).

    output_shape (when given) decides the total padding; SAME_UPPER puts the odd cell at the end, SAME_LOWER and
    NOTSET at the start (as the reference evaluator splits it). Constant weights fold to their flipped form at load.
    """
    b = imp.b
    x, w = xs[0], xs[1]
    bias = xs[2] if len(xs) > 2 and xs[2] is not None else None
    nsp = x.rank - 2
    group = at.get("group", 1)
    kernel = list(w.shape[2:])
    strides, pads, dil = spatial_attrs(at, nsp)
    out_pad = list(at.get("output_padding") or [0] * nsp)
    auto = at.get("auto_pad", "NOTSET")
    out_shape = at.get("output_shape")
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        if out_shape is not None:
            out_shape = list(out_shape)[-nsp:]
        else:
            out_shape = [d * s for d, s in zip(x.shape[2:], strides, strict=False)]
        for i in range(nsp):
            total = strides[i] * (x.shape[2 + i] - 1) + out_pad[i] + (kernel[i] - 1) * dil[i] + 1 - out_shape[i]
            small, big = total // 2, total - total // 2
            pads[i], pads[i + nsp] = (small, big) if auto == "SAME_UPPER" else (big, small)
    elif auto == "VALID":
        pads = [0] * 2 * nsp
    # zero insertion: [N, C, H, 1, W, 1] padded to [N, C, H, s, W, s], then the trailing s-1 zeros cut
    if any(s > 1 for s in strides):
        inter = list(x.shape[:2]) + [d for dim in x.shape[2:] for d in (dim, 1)]
        zpads = [0] * len(inter) * 2
        for i, s in enumerate(strides):
            zpads[len(inter) + 3 + 2 * i] = s - 1
        z = pad(imp, reshape(b, x, inter), zpads, "constant", 0.0)
        z = reshape(b, z, list(x.shape[:2]) + [d * s for d, s in zip(x.shape[2:], strides, strict=False)])
        x = slice_axes(imp, z, [0] * nsp, [(d - 1) * s + 1 for d, s in zip(x.shape[2:], strides, strict=False)],
                   list(range(2, 2 + nsp)), None)
    edge = [(k - 1) * d for k, d in zip(kernel, dil, strict=False)]
    begins = [e - p for e, p in zip(edge, pads[:nsp], strict=False)]
    ends = [e - p + o for e, p, o in zip(edge, pads[nsp:], out_pad, strict=False)]
    x = pad(imp, x, [0, 0] + begins + [0, 0] + ends, "constant", 0.0)
    cin, cout_g = w.shape[0], w.shape[1]
    wg = reshape(b, w, [group, cin // group, cout_g] + kernel)
    wg = b.op("Transpose", [wg], {"perm": (0, 2, 1) + tuple(range(3, 3 + nsp))})
    wg = slice_axes(imp, wg, [-1] * nsp, [-2**62] * nsp, list(range(3, 3 + nsp)), [-1] * nsp)
    wf = reshape(b, wg, [group * cout_g, cin // group] + kernel)
    inputs = [x, wf] + ([bias] if bias is not None else [])
    return [b.op("Conv", inputs, {"strides": (1,) * nsp, "pads": (0,) * 2 * nsp, "dilations": tuple(dil),
                                  "group": group})]


# ---------------------------------------------------------------- MeanVarianceNormalization, composed -------------
@handler("MeanVarianceNormalization", 9, 13)
def _mvn(imp, node, xs, at):  # y = (x - mean) / (sqrt(mean(x^2) - mean^2) + 1e-9), as the ONNX function
    b, x = imp.b, xs[0]
    axes = tuple(sorted(norm_axis(a, x.rank) for a in at.get("axes", [0, 2, 3])))
    mean = b.op("Reduce", [x], {"mode": "mean", "axes": axes, "keepdims": 1})
    sq_mean = b.op("Reduce", [b.op("Mul", [x, x])], {"mode": "mean", "axes": axes, "keepdims": 1})
    std = b.op("Sqrt", [b.op("Sub", [sq_mean, b.op("Mul", [mean, mean])])])
    return [b.op("Div", [b.op("Sub", [x, mean]), b.op("Add", [std, b.const(np.asarray(1e-9, x.dtype))])])]
