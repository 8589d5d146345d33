"""Training kernels: pooling gradients, Dropout, and BatchNormalization's batch statistics and gradients (bn.cl:
per-channel partial sums over slices, then the statistics and the normalisation)."""
import numpy as np

from ...errors import ModelError
from ...graph.ops.nn import conv_geometry
from ..emitter import compiled_geometry
from ..half import HalfIO, half_defines
from ..runtime import kernel_source


def _ints(values):
    return [np.int32(v) for v in values]


def _bn_view(x):
    """x as [N, C, S]"""
    return x.shape[0], x.shape[1], int(np.prod(x.shape[2:], dtype=np.int64))


def _bn_vector(lw, S, values, halves):
    """bn.cl's V: 4 (float4 loads and stores) where S and each value's offset are multiples of 4 and nothing is
    stored in half, else 1."""
    return 4 if not halves and S % 4 == 0 and all(int(lw.args(v)[1]) % 4 == 0 for v in values) else 1


def _bn_fused(lw, node):
    """Does the normalisation launch add the per-channel partial sums itself (bn.cl's STATS_IN_APPLY)? Not where
    sync_bn exchanges the statistics between the two (attr exchanged)."""
    return lw.options.bn_stats_in_apply and not node.attrs.get("exchanged")


def _bn_partial_launch(lw, node, x, dy, mean, grad, halves, vec):
    """bn_partial over every channel: returns the number of slices G per channel (its sums sit in scratch).
    halves: the operands stored in half (precision "fp16": their -D X_HALF-style defines, for every bn.cl launch);
    vec: bn.cl's V (_bn_vector)."""
    N, C, S = _bn_view(x)
    wg = 64 if lw.dev.is_cpu else 256
    count = N * S // vec
    G = max(1, min(-(-8 * lw.dev.compute_units // C), -(-count // (4 * wg))))
    src = f"#define WG {wg}\n#define V {vec}\n" + ("#define GRAD 1\n" if grad else "") + \
        ("#define STATS_IN_APPLY 1\n" if _bn_fused(lw, node) else "") + \
        "".join(f"#define {name} 1\n" for name in sorted(halves)) + kernel_source("bn")
    args = lw.args(x) + (lw.args(dy) if grad else lw.dummy()) + (lw.args(mean) if grad else lw.dummy()) + \
        _ints([N, C, S, G]) + [lw.dummy()[0]]
    lw.emit(src, "bn_partial", args, (G * wg, C), (wg, 1), f"{node.name} {node.op}/partial")
    lw.use_scratch(lw.launches[-1].kernel, len(args) - 1, 8 * C * G, "bnstat")
    return src, G



class TrainingFamily:
    # precision "fp16": bn.cl reads x (and dy) and writes y (and dx) in half; statistics and scale stay float
    HALF_IO = {"BatchNormTrain": HalfIO((0,), (0,)), "BatchNormTrainGrad": HalfIO((0, 1), (0,)),
               "PoolGrad": HalfIO((0, 1), True)}  # (pool_grad.cl: dy, x and dx)

    def pool_grad(self, node):
        dy, x = node.inputs
        dx = node.outputs[0]
        a = node.attrs
        if a.get("ceil_mode", 0) and a["mode"] == "avg":
            raise ModelError(f"node {node.name} (AveragePool): ceil_mode gradients are not supported")
        g = conv_geometry(node)
        H, W, OH, OW, KH, KW = g.H, g.W, g.OH, g.OW, g.KH, g.KW
        s, p, d = list(g.strides_2d), list(g.pads_2d), list(g.dilations_2d)
        halves = "".join(f"#define {name} 1\n" for name in sorted(half_defines(DY=dy, X=x, DX=dx)))
        geometry = [H, W, OH, OW, KH, KW, s[0], s[1], p[0], p[1], d[0], d[1]]
        src = f"#define POOL_{a['mode'].upper()} 1\n" + halves + compiled_geometry(geometry) + \
            kernel_source("pool_grad")
        if [KH, KW] == list(s) and list(p) == [0, 0] and list(d) == [1, 1] and x.rank == 4 and \
                list(x.shape[2:]) == [OH * KH, OW * KW] and not any(a.get("pads") or [0]):
            args = self.args(dy) + self.args(x) + self.args(dx) + _ints([OH, OW, KH, KW]) + [np.int64(dy.size)]
            self.emit(src, "pool_grad_tiled", args, (max(dy.size, 1),), None, f"{node.name} PoolGrad")
            return
        args = self.args(dy) + self.args(x) + self.args(dx) + _ints(geometry + [a.get("count_include_pad", 0)]) + \
            [np.int64(dx.size)]
        if a["mode"] != "max":
            self.emit(src, "pool_grad", args, (max(dx.size, 1),), None, f"{node.name} PoolGrad")
            return
        # max: each window's maximum found once (pool_argmax, into scratch), not by every element under it
        windows = max(dy.size, 1)
        self.emit(src, "pool_argmax", self.args(x) + self.dummy()[:1] + _ints(geometry) + [np.int64(dy.size)],
                  (windows,), None, f"{node.name} PoolGrad/argmax")
        self.use_scratch(self.launches[-1].kernel, 2, 4 * windows, "poolargmax")
        self.emit(src, "pool_grad", args + self.dummy()[:1], (max(dx.size, 1),), None, f"{node.name} PoolGrad")
        self.use_scratch(self.launches[-1].kernel, len(args), 4 * windows, "poolargmax")



    def dropout(self, node):
        x, seed = node.inputs
        y = node.outputs[0]
        args = self.args(x) + self.args(seed) + self.args(y) + [np.uint32(node.attrs["salt"]),
                                                          np.float32(node.attrs["ratio"]), np.int64(y.size)]
        self.emit(kernel_source("dropout"), "dropout", args, (max(y.size, 1),), None, f"{node.name} Dropout")


    def _bn_rows(self, src, name, args, N, C, S, G, vec, label):
        """An elementwise bn.cl kernel over work-items (vector s of a plane, row n * C + c), its last argument the
        partial sums (G per channel); none for no elements."""
        if N * C * S == 0:
            return
        SV = S // vec
        local = min(256, -(-SV // 32) * 32)
        self.emit(src, name, args, (-(-SV // local) * local, N * C), (local, 1), label)
        self.use_scratch(self.launches[-1].kernel, len(args) - 1, 8 * C * G, "bnstat")

    def batchnorm_train(self, node):
        x, scale, bias = node.inputs
        y, mean, var = node.outputs
        N, C, S = _bn_view(x)
        halves = half_defines(X=x, Y=y)
        vec = _bn_vector(self, S, (x, y), halves)
        src, G = _bn_partial_launch(self, node, x, None, None, False, halves, vec)
        if not _bn_fused(self, node):
            args = self.args(x) + self.args(mean) + self.args(var) + _ints([N, C, S, G]) + [self.dummy()[0]]
            self.emit(src, "bn_stats", args, (C,), None, f"{node.name} BatchNormTrain/stats")
            self.use_scratch(self.launches[-1].kernel, len(args) - 1, 8 * C * G, "bnstat")
        args = self.args(x) + self.args(mean) + self.args(var) + self.args(scale) + self.args(bias) + self.args(y) + \
            _ints([C, S]) + [np.float32(node.attrs["epsilon"])] + _ints([N, G]) + [self.dummy()[0]]
        self._bn_rows(src, "bn_apply", args, N, C, S, G, vec, f"{node.name} BatchNormTrain")


    def batchnorm_train_grad(self, node):
        dy, x, scale, mean, var = node.inputs
        dx, dscale, dbias = node.outputs
        N, C, S = _bn_view(x)
        eps = np.float32(node.attrs["epsilon"])
        halves = half_defines(X=x, DY=dy, DX=dx)
        vec = _bn_vector(self, S, (dy, x, dx), halves)
        src, G = _bn_partial_launch(self, node, x, dy, mean, True, halves, vec)
        if not _bn_fused(self, node):
            args = self.args(var) + self.args(dscale) + self.args(dbias) + _ints([C, G]) + [eps, self.dummy()[0]]
            self.emit(src, "bn_grad_stats", args, (C,), None, f"{node.name} BatchNormTrainGrad/stats")
            self.use_scratch(self.launches[-1].kernel, len(args) - 1, 8 * C * G, "bnstat")
        args = self.args(dy) + self.args(x) + self.args(mean) + self.args(var) + self.args(scale) + \
            self.args(dscale) + self.args(dbias) + self.args(dx) + _ints([C, S]) + [eps, np.float32(1.0 / (N * S))] + \
            _ints([G]) + [self.dummy()[0]]
        self._bn_rows(src, "bn_grad_apply", args, N, C, S, G, vec, f"{node.name} BatchNormTrainGrad")


