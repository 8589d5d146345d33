"""Neural-network ops: Conv, pooling, BatchNormalization, LRN, Softmax/LogSoftmax."""
from dataclasses import dataclass

import numpy as np

from ...errors import ModelError
from .base import REQUIRED, Op, ones, register, zero_pads
from .roi import ROI_ATTRS, roialign_numpy

WINDOW_ATTRS = {"strides": ones, "pads": zero_pads, "dilations": ones}  # pads: begins, then ends
# Conv's pass attributes (fuse.py, winograd.py, layout.py): see Conv's docstring
CONV_PASS_ATTRS = {"act": None, "winograd": 0, "tap_major": 0, "prologue": None, "in_perm": None}


def conv_out(size, k, s, p0, p1, d, ceil_mode=False):
    span = (k - 1) * d + 1
    if ceil_mode:
        out = -(-(size + p0 + p1 - span) // s) + 1
        if (out - 1) * s >= size + p0:  # the last window may not start inside the right padding
            out -= 1
        return out
    return (size + p0 + p1 - span) // s + 1


@dataclass(frozen=True)
class ConvGeometry:
    """Where the windows of a convolution or a pool (or of their gradients) lie: per spatial axis, and as the 2-D
    view the kernels take (H, W, OH, OW, KH, KW and the *_2d tuples), a 1-D window being a 2-D one of height 1."""
    N: int  # images
    C: int  # input channels, all groups
    K: int  # output channels, all groups (a pool's: C)
    group: int  # (a pool's: C, every channel alone)
    in_size: tuple  # x's spatial dims
    kernel: tuple  # taps per spatial axis (whatever the weights' layout)
    out_size: tuple  # y's spatial dims
    strides: tuple
    pads: tuple  # begins, then ends
    dilations: tuple

    @classmethod
    def from_shapes(cls, x_shape, w_shape, attrs, y_shape=None, group=1, ceil_mode=0):
        """From x [N, C, ...], w [K, C / group, taps...] and the strides, pads and dilations in `attrs`; the output's
        spatial dims from y_shape where given, else computed (ceil_mode: a pool's)."""
        nsp = len(x_shape) - 2
        strides, pads, dil = tuple(attrs["strides"]), tuple(attrs["pads"]), tuple(attrs["dilations"])
        kernel = tuple(w_shape[2:])
        if y_shape is not None:
            out = tuple(y_shape[2:])
        else:
            out = tuple(conv_out(x_shape[2 + i], kernel[i], strides[i], pads[i], pads[i + nsp], dil[i], ceil_mode)
                        for i in range(nsp))
        return cls(x_shape[0], x_shape[1], w_shape[0], group, tuple(x_shape[2:]), kernel, out, strides, pads, dil)

    @property
    def nsp(self):
        return len(self.in_size)

    @property
    def one_d(self):
        return self.nsp == 1

    @property
    def begin_pads(self):
        return self.pads[:self.nsp]

    @property
    def symmetric(self):
        return self.pads[:self.nsp] == self.pads[self.nsp:]

    def _plane(self, values, fill):
        if self.nsp == 1:
            return (fill,) + tuple(values)
        if self.nsp == 2:
            return tuple(values)
        raise ModelError(f"a {self.nsp}-D window has no 2-D view (1-D and 2-D windows do)")

    @property
    def H(self):
        return self._plane(self.in_size, 1)[0]

    @property
    def W(self):
        return self._plane(self.in_size, 1)[1]

    @property
    def OH(self):
        return self._plane(self.out_size, 1)[0]

    @property
    def OW(self):
        return self._plane(self.out_size, 1)[1]

    @property
    def KH(self):
        return self._plane(self.kernel, 1)[0]

    @property
    def KW(self):
        return self._plane(self.kernel, 1)[1]

    @property
    def strides_2d(self):
        return self._plane(self.strides, 1)

    @property
    def pads_2d(self):
        """The begin pads (the kernels take symmetric pads)."""
        return self._plane(self.begin_pads, 0)

    @property
    def dilations_2d(self):
        return self._plane(self.dilations, 1)


def conv_weight_dims(w_shape, attrs):
    """(K, C / group, kernel) of a Conv's weights in any of their layouts: [K, C, KH, KW], tap-major [K, KH, KW, C]
    (passes/layout.py) or Winograd's U [m + 2, m + 2, K, C] of a 3x3 filter (passes/winograd.py)."""
    if attrs.get("tap_major"):
        return w_shape[0], w_shape[-1], tuple(w_shape[1:-1])
    if attrs.get("winograd") == 1:
        return w_shape[2], w_shape[3], (3, 3)
    return w_shape[0], w_shape[1], tuple(w_shape[2:])


def conv_geometry(node):
    """The ConvGeometry of a Conv, MaxPool, AveragePool, ConvGradX, ConvGradW or PoolGrad node."""
    a = node.attrs
    if node.op == "Conv":
        x, w = node.inputs[0], node.inputs[1]
        k, cin, kernel = conv_weight_dims(w.shape, a)
        group = a["group"]
        if x.shape[1] != cin * group:
            raise ValueError(f"input has {x.shape[1]} channels, weights {list(w.shape)} with group={group} "
                             f"expect {cin * group}")
        return ConvGeometry.from_shapes(x.shape, (k, cin) + kernel, a, group=group)
    if node.op in ("MaxPool", "AveragePool"):
        x = node.inputs[0]
        return ConvGeometry.from_shapes(x.shape, (x.shape[1], 1) + tuple(a["kernel_shape"]), a, group=x.shape[1],
                                        ceil_mode=a["ceil_mode"])
    dy = node.inputs[0]
    if node.op == "ConvGradX":
        return ConvGeometry.from_shapes(a["x_shape"], node.inputs[1].shape, a, dy.shape, a["group"])
    if node.op == "ConvGradW":
        return ConvGeometry.from_shapes(node.inputs[1].shape, a["w_shape"], a, dy.shape, a["group"])
    if node.op == "PoolGrad":
        x = node.inputs[1]
        return ConvGeometry.from_shapes(x.shape, (x.shape[1], 1) + tuple(a["kernel_shape"]), a, dy.shape, x.shape[1])
    raise ValueError(f"node {node.name} ({node.op}) has no convolution geometry")


@register
class Conv(Op):
    """y = act(conv(x, w) + b + res);  dx = conv_transpose(dy, w), dw = conv(x, dy) (see autodiff)

    attrs: strides, pads (begins + ends, symmetric after the padding pass), dilations, group;
    fused epilogue: act (a unary pointwise node's (op, attrs)) and a residual input;
    winograd: 1: w holds U = G w G^T [4, 4, K, C] for Winograd F(2x2, 3x3), or [6, 6, K, C] for F(4x4, 3x3)
    (passes/winograd.py, GPU inference);
    2: U is made from w on the device every run (training);
    tap_major: w holds the weights as [K, KH, KW, C] (passes/layout.py, GPU inference): depth ordered tap by tap;
    prologue: the pointwise nodes (per-channel affine, then Relu) that make the layer's input from x (CPU inference,
    1x1 layers: passes/fuse.py's fuse_conv_prologues), applied as the input is read.
    """
    name = "Conv"
    dtypes = ("float32",)
    attrs = dict(WINDOW_ATTRS, group=1)
    pass_attrs = CONV_PASS_ATTRS

    def infer(self, node):
        g = conv_geometry(node)
        return [(node.inputs[0].dtype, (g.N, g.K, *g.out_size))]

    def writes_over(self, node, index):
        """Over its residual: every epilogue reads res at an output's own index just before writing it there."""
        return index == 3 and node.inputs.count(node.inputs[3]) == 1

    def lower(self, node, lw):
        lw.conv(node)

    def grad(self, b, node, dys):
        x, w = node.inputs[0], node.inputs[1]
        if node.attrs.get("act") or len(node.inputs) > 3 or node.attrs.get("winograd") or \
                node.attrs.get("tap_major"):
            return None  # a fused epilogue or weights in a device layout: autodiff runs before those passes
        dy = dys[0]
        grads = [b.op("ConvGradX", [dy, w], dict(node.attrs, x_shape=x.shape)),
                 b.op("ConvGradW", [dy, x], dict(node.attrs, w_shape=w.shape))]
        if len(node.inputs) > 2:
            grads.append(b.op("Reduce", [dy], {"mode": "sum", "axes": (0,) + tuple(range(2, dy.rank)),
                                               "keepdims": 0}))
        return grads


class Pool(Op):
    mode = None
    dtypes = ("float32",)
    attrs = dict(kernel_shape=REQUIRED, **WINDOW_ATTRS, ceil_mode=0)

    def infer(self, node):
        g = conv_geometry(node)
        return [(node.inputs[0].dtype, (g.N, g.C, *g.out_size))]

    def lower(self, node, lw):
        lw.pool(node, self.mode)

    def grad(self, b, node, dys):
        return [b.op("PoolGrad", [dys[0], node.inputs[0]], dict(node.attrs, mode=node.spec.mode))]


@register
class MaxPool(Pool):
    """y = max over each window (padding is -inf)"""
    name = "MaxPool"
    mode = "max"
    dtypes = ("float32", "float64", "int8", "uint8", "int16", "uint16", "int32", "int64")


@register
class AveragePool(Pool):
    """y = mean over each window (count_include_pad decides whether padding cells count)"""
    name = "AveragePool"
    mode = "avg"
    attrs = dict(Pool.attrs, count_include_pad=0)


@register
class BatchNormalization(Op):
    """y = (x - mean) / sqrt(var + eps) * scale + B   (inference form; passes fold it into Conv or Mul+Add);
    dx = dy scale / sqrt(var + eps), dscale = sum(dy xhat), dB = sum(dy), dmean = -dB scale / sqrt(var + eps),
    dvar = -sum(dy (x - mean)) scale / 2 (var + eps)^-3/2, sums over all axes but 1"""
    name = "BatchNormalization"
    attrs = {"epsilon": 1e-5}

    def infer(self, node):
        return [(node.inputs[0].dtype, node.inputs[0].shape)]

    def numpy(self, node, x, scale, b, mean, var):
        shape = (1, -1) + (1,) * (x.ndim - 2)
        inv = scale / np.sqrt(var + node.attrs["epsilon"])
        return [(x - mean.reshape(shape)) * inv.reshape(shape) + b.reshape(shape)]

    def grad(self, b, node, dys):
        x, scale, _, mean, var = node.inputs
        dy = dys[0]
        per_channel = (1, x.shape[1]) + (1,) * (x.rank - 2)

        def channels(v):
            return b.op("Reshape", [v], {"shape": per_channel})

        def total(v):
            return b.op("Reduce", [v], {"mode": "sum", "axes": (0,) + tuple(range(2, x.rank)), "keepdims": 0})

        inv = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [var, b.const(np.asarray(node.attrs["epsilon"],
                                                                                      var.dtype))])])])
        gain = b.op("Mul", [scale, inv])
        dbias = total(dy)
        dcentred = total(b.op("Mul", [dy, b.op("Sub", [x, channels(mean)])]))
        half_inv2 = b.op("Mul", [b.op("Mul", [inv, inv]), b.const(np.asarray(-0.5, var.dtype))])
        return [b.op("Mul", [dy, channels(gain)]), b.op("Mul", [dcentred, inv]), dbias,
                b.op("Neg", [b.op("Mul", [dbias, gain])]), b.op("Mul", [b.op("Mul", [dcentred, gain]), half_inv2])]


@register
class RoiAlign(Op):
    """y[r, c] = pool over each output bin's grid of bilinear samples of x[batch[r], c] inside roi r (avg or max);
    dx = RoiAlignGrad (dy spread back by the samples' bilinear weights; max: to the largest term's corner, the
    first of equal ones), no gradient for the rois (torchvision's neither)"""
    name = "RoiAlign"
    dtypes = ("float32",)
    attrs = ROI_ATTRS
    numpy = staticmethod(roialign_numpy)

    def lower(self, node, lw):
        lw.roialign(node)

    def grad(self, b, node, dys):
        x, rois, batch = node.inputs
        return [b.op("RoiAlignGrad", [dys[0], x, rois, batch], dict(node.attrs)), None, None]

    def infer(self, node):
        x, rois, batch = node.inputs
        if x.rank != 4 or rois.rank != 2 or rois.shape[1] != 4 or batch.shape != rois.shape[:1]:
            raise ValueError(f"RoiAlign takes x [N, C, H, W], rois [R, 4] and batch_indices [R], got "
                             f"{list(x.shape)}, {list(rois.shape)} and {list(batch.shape)}")
        a = node.attrs
        return [(x.dtype, (rois.shape[0], x.shape[1], a["output_height"], a["output_width"]))]


def lrn_band(channels, size, scale, dtype):
    """W [C, C]: W[c, i] = scale where channel i is in c's window, c - floor((size - 1) / 2) <= i <= c +
    ceil((size - 1) / 2) (ONNX), else 0: W @ x^2 sums each window at once, W^T @ g spreads g back over them."""
    c = np.arange(channels)
    offset = c[None, :] - c[:, None]
    below = (size - 1) // 2
    return np.where((offset >= -below) & (offset <= size - 1 - below), scale, 0).astype(dtype)


@register
class LRN(Op):
    """y = x s^-beta, s = bias + alpha/size * sum_{channel window} x^2;
    dx = dy s^-beta - 2 beta x W^T (dy x s^(-beta - 1)) with W the window sums scaled by alpha/size (lrn_band)"""
    name = "LRN"
    dtypes = ("float32",)
    attrs = {"size": REQUIRED, "alpha": 1e-4, "beta": 0.75, "bias": 1.0}

    def infer(self, node):
        return [(node.inputs[0].dtype, node.inputs[0].shape)]

    def numpy(self, node, x):
        a = node.attrs
        rows = x.reshape(x.shape[0], x.shape[1], -1).astype(np.float64)
        s = a["bias"] + lrn_band(x.shape[1], a["size"], a["alpha"] / a["size"], np.float64) @ (rows * rows)
        return [(rows * s ** -a["beta"]).reshape(x.shape).astype(x.dtype)]

    def lower(self, node, lw):
        lw.lrn(node)

    def grad(self, b, node, dys):
        x, a = node.inputs[0], node.attrs
        rows = (x.shape[0], x.shape[1], x.size // max(1, x.shape[0] * x.shape[1]))  # [N, C, pixels]
        xr = b.op("Reshape", [x], {"shape": rows})
        dy = b.op("Reshape", [dys[0]], {"shape": rows})
        band = b.const(lrn_band(x.shape[1], a["size"], a["alpha"] / a["size"], x.dtype))

        def k(v):
            return b.const(np.asarray(v, x.dtype))

        s = b.op("Add", [b.op("Gemm", [band, b.op("Mul", [xr, xr])]), k(a["bias"])])
        gain = b.op("Pow", [s, k(-a["beta"])])
        spread = b.op("Gemm", [band, b.op("Div", [b.op("Mul", [b.op("Mul", [dy, xr]), gain]), s])], {"transA": 1})
        dx = b.op("Sub", [b.op("Mul", [dy, gain]), b.op("Mul", [b.op("Mul", [xr, spread]), k(2 * a["beta"])])])
        return [b.op("Reshape", [dx], {"shape": x.shape})]


class SoftmaxBase(Op):
    log = False
    dtypes = ("float32",)
    attrs = {"axis": REQUIRED}

    def infer(self, node):
        return [(node.inputs[0].dtype, node.inputs[0].shape)]

    def numpy(self, node, x):
        axis = node.attrs["axis"]
        m = x - x.max(axis=axis, keepdims=True)
        if self.log:
            return [m - np.log(np.exp(m).sum(axis=axis, keepdims=True))]
        e = np.exp(m)
        return [e / e.sum(axis=axis, keepdims=True)]

    def lower(self, node, lw):
        lw.softmax(node, self.log)


@register
class Softmax(SoftmaxBase):
    """y = exp(x) / sum(exp(x), axis)  (op-set 13 semantics: one axis);  dx = y * (dy - sum(dy * y, axis))"""
    name = "Softmax"

    def grad(self, b, node, dys):
        y = node.outputs[0]
        dy = dys[0]
        s = b.op("Reduce", [b.op("Mul", [dy, y])], {"mode": "sum", "axes": (node.attrs["axis"] % y.rank,),
                                                   "keepdims": 1})
        return [b.op("Mul", [y, b.op("Sub", [dy, s])])]


@register
class LogSoftmax(SoftmaxBase):
    """y = x - log(sum(exp(x), axis));  dx = dy - exp(y) * sum(dy, axis)"""
    name = "LogSoftmax"
    log = True

    def grad(self, b, node, dys):
        y = node.outputs[0]
        dy = dys[0]
        s = b.op("Reduce", [dy], {"mode": "sum", "axes": (node.attrs["axis"] % y.rank,), "keepdims": 1})
        return [b.op("Sub", [dy, b.op("Mul", [b.op("Exp", [y]), s])])]


@register
class LayerNorm(Op):
    """y = (x - mean) / sqrt(var + eps) * scale + bias over the last axis;
    dx = (g - mean(g) - xhat * mean(g * xhat)) / sqrt(var + eps) with g = dy * scale, dscale = dy * xhat, dbias = dy

    Inputs x, scale [D], bias [D]. The normalize pass builds it from PyTorch's op-set 13 decomposition.
    """
    name = "LayerNorm"
    dtypes = ("float32",)
    attrs = {"epsilon": REQUIRED}

    def infer(self, node):
        x, scale, bias = node.inputs
        if scale.shape != (x.shape[-1],) or bias.shape != (x.shape[-1],):
            raise ValueError(f"scale {list(scale.shape)} and bias {list(bias.shape)} must be [{x.shape[-1]}]")
        return [(x.dtype, x.shape)]

    def numpy(self, node, x, scale, bias):
        d = x - x.mean(axis=-1, keepdims=True)
        var = (d * d).mean(axis=-1, keepdims=True)
        return [(d / np.sqrt(var + node.attrs["epsilon"]) * scale + bias).astype(x.dtype)]

    def lower(self, node, lw):
        lw.layernorm(node)

    def grad(self, b, node, dys):
        x, scale = node.inputs[0], node.inputs[1]
        dy = dys[0]
        last = (x.rank - 1,)

        def mean(v):
            return b.op("Reduce", [v], {"mode": "mean", "axes": last, "keepdims": 1})

        d = b.op("Sub", [x, mean(x)])
        eps = b.const(np.asarray(node.attrs["epsilon"], x.dtype))
        inv = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [mean(b.op("Mul", [d, d])), eps])])])
        xhat = b.op("Mul", [d, inv])
        g = b.op("Mul", [dy, scale])
        dx = b.op("Mul", [b.op("Sub", [b.op("Sub", [g, mean(g)]), b.op("Mul", [xhat, mean(b.op("Mul", [g, xhat]))])]),
                          inv])
        return [dx, b.op("Mul", [dy, xhat]), dy]
