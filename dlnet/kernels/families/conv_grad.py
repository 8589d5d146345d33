"""Convolution gradients (ConvGradX, ConvGradW) on the device's matrix core: implicit GEMM over x's windows,
im2col / col2im where needed, flipped weights for stride-1 input gradients, direct kernels for depthwise layers,
Winograd where the training pass chose it."""
import numpy as np

from ...graph.ops.nn import conv_geometry
from ..device import TILED_CORES
from ..emitter import act_macro, compiled_geometry, core_source, defines
from ..half import NONE, HalfIO, copy_pipeline_io, half_defines, without_copies
from ..rules import round_up
from ..runtime import kernel_source


def _depthwise(group, cin, c):
    return group == cin and c == 1 and group > 1


def half_io(node, dev):
    """precision "fp16": the GEMM paths read dy (and dW's x) and write dX in half (dW, a weight's gradient, in
    float32); the depthwise (dwconv_grad.cl) and Winograd paths take float32; on the tensor cores the GEMM paths read
    float32 (half.copy_pipeline_io)."""
    out, other = node.outputs[0], node.inputs[1]
    x_shape, w_shape = (other.shape, out.shape) if node.op == "ConvGradW" else (out.shape, other.shape)
    group = node.attrs.get("group", 1)
    if node.attrs.get("winograd") or _depthwise(group, x_shape[1], w_shape[1]):
        return NONE
    return copy_pipeline_io(dev, HalfIO((0, 1)) if node.op == "ConvGradW" else HalfIO((0,), True))


class ConvGradFamily:
    HALF_IO = {"ConvGradW": half_io, "ConvGradX": half_io}  # ((node, dev) -> HalfIO: it depends on the path)

    def conv_grad(self, node, which):
        """dW (which="dw") or dX ("dx") of a 1-D/2-D convolution as a GEMM on the device's core."""
        dy, other = node.inputs
        out = node.outputs[0]
        x_shape = other.shape if which == "dw" else out.shape
        w_shape = out.shape if which == "dw" else other.shape
        g = conv_geometry(node)
        H, W, OH, OW, KH, KW = g.H, g.W, g.OH, g.OW, g.KH, g.KW
        s, p, d = list(g.strides_2d), list(g.pads_2d), list(g.dilations_2d)
        N, Cin = x_shape[0], x_shape[1]
        group = node.attrs.get("group", 1)
        K, C = w_shape[0] // group, Cin // group
        CKK, NPIX = C * KH * KW, N * OH * OW
        geo = [np.int32(v) for v in (Cin, H, W, OH, OW, KH, KW, s[0], s[1], p[0], p[1], d[0], d[1])]
        label = f"{node.name} {node.op}"
        if _depthwise(group, Cin, C):  # depthwise: direct kernels (a GEMM per channel wastes its tiles)
            self._dwconv_grad(node, which, N, geo, K, label)
            return
        work = 4 * group * CKK * NPIX
        M, NN, KK = (K, CKK, NPIX) if which == "dw" else (CKK, NPIX, K)
        pick = self.pick(M, NN, KK, group, False, f"{which}{KH}x{KW}s{s[0]}x{s[1]}")
        core, tiles, lsize, (g0, g1) = pick
        halves = half_defines(DY=dy, X=other if which == "dw" else None, DX=out if which == "dx" else None)
        tiles = without_copies(tiles, halves, ("DY", "X"))
        if which == "dw" and node.attrs.get("winograd"):
            self.winograd_dw(dy, other, out, p, label)
            return
        if which == "dx" and node.attrs.get("winograd"):  # dx = conv(dy, w flipped and transposed), Winograd
            self.winograd(dy, None, self.dummy(), self.dummy(), out, act_macro(None), [2 - p[0], 2 - p[1]], label,
                          w=other, flip=True)
            return
        if not self.dev.tiled and self.options.conv_grad_cpu_panels:
            self._conv_grad_cpu(node, which, g, N, Cin, K, C, group, geo, halves, label)
            return
        if which == "dx" and core in TILED_CORES and list(s) == [1, 1] and KH * KW > 1 and \
                p[0] <= d[0] * (KH - 1) and p[1] <= d[1] * (KW - 1):
            self._dx_flipped(node, g, N, Cin, K, C, group, label)
            return
        implicit = which == "dw" and core in TILED_CORES  # the GPU cores read dw's windows straight from x
        direct = which == "dx" and KH == KW == 1 and list(s) == [1, 1] and list(p) == [0, 0]
        if which == "dw" and not implicit:  # col = im2col(x)
            total = group * CKK * NPIX
            col_x = "#define COL_X_HALF 1\n" if "X_HALF" in halves else ""
            self.emit(col_x + kernel_source("im2col"), "im2col", self.args(other) + [self.dummy()[0]] + geo +
                      [np.int64(Cin * H * W), np.int32(NPIX), np.int64(total)], (total,), None, label + " im2col")
            self.use_scratch(self.launches[-1].kernel, 2, work, "work")
        along = {"B_ALONG_K": 1} if which == "dw" else {"A_ALONG_M": 1}  # col rows / w columns run along k / m
        along["IDX"] = self.index_type(dy.size, other.size, out.size, group * CKK * NPIX)
        if implicit:
            along["IMPLICIT_COL"] = 1
        if direct:
            along["DX_DIRECT"] = 1
        src = defines(dict(tiles, **along, **halves, **{"CONV_DW" if which == "dw" else "CONV_DX": 1})) + \
            kernel_source("window") + kernel_source("conv_grad_gemm") + core_source(core, tiles)
        w_args = self.dummy() if which == "dw" else self.args(other)
        y_args = self.args(out) if which == "dw" or direct else self.dummy()
        x_args = self.args(other) if implicit else self.dummy()
        args = self.args(dy) + w_args + y_args + [self.dummy()[0], np.int32(K), np.int32(CKK), np.int32(OH * OW),
                                                  np.int32(NPIX), np.int64(group * K * OH * OW)] + x_args + [
            self.window_table(C, H, W, KH, KW, d) if implicit else self.dummy()[0]] + [
            np.int32(v) for v in (H, W, OW, s[0], s[1], p[0], p[1])] + [np.int64(Cin * H * W), np.int64(C * H * W)]
        n_launch = len(self.launches)
        self._matrix(src, f"conv_{which}", args, pick, tiles, (g0, g1, group), M, NN, KK, label)
        if not implicit and not direct:
            for launch in self.launches[n_launch:]:
                self.use_scratch(launch.kernel, 6, work, "work")  # argument 6: col
        if which == "dx" and not direct:  # dx = col2im(colgrad)
            col_args = [self.dummy()[0]] + self.args(out) + geo + [np.int32(NPIX), np.int64(out.size)]
            col_dx = "#define COL_DX_HALF 1\n" if "DX_HALF" in halves else ""
            self.emit(col_dx + kernel_source("im2col"), "col2im", col_args, (max(out.size, 1),), None,
                      label + " col2im")
            self.use_scratch(self.launches[-1].kernel, 0, work, "work")

    def _conv_grad_cpu(self, node, which, g, N, Cin, K, C, group, geo, halves, label):
        """CPUs: the gradient as gemm_cpu.cl products (B in panels), per group: dy gathered once into rows of
        channels over every image's pixels (dyr [group K, NPIX]), then dW = dyr col^T with col = im2col(x), or
        colgrad = w^T dyr, which col2im adds into dX."""
        dy, other = node.inputs
        out = node.outputs[0]
        OHW = g.OH * g.OW
        NPIX, CKK = N * OHW, C * g.KH * g.KW
        rows = group * K * NPIX
        im2col = defines({"CC": Cin, "NNC": NPIX}) + compiled_geometry(geo[1:]) + kernel_source("im2col")
        dy_half = "#define COL_X_HALF 1\n" if "DY_HALF" in halves else ""
        self.emit(dy_half + im2col, "rows_of_images", self.args(dy) + [self.dummy()[0]] + [np.int32(group * K)],
                  (N, group * K), (1, 1), label + " rows")
        self.use_scratch(self.launches[-1].kernel, 2, 4 * rows, "dyrows")
        work = 4 * group * CKK * NPIX
        if which == "dw":  # col = im2col(x)
            col_x = "#define COL_X_HALF 1\n" if "X_HALF" in halves else ""
            self.emit(col_x + im2col, "im2col_planes", self.args(other) + [self.dummy()[0]] +
                      [np.int64(Cin * g.H * g.W)], (N, group * CKK), (1, 1), label + " im2col")
            self.use_scratch(self.launches[-1].kernel, 2, work, "work")
        dyr = ("dyrows", 4 * rows)
        (buf, off), scratch = self.args(out if which == "dw" else other), self.dummy()[0]
        for gi in range(group):
            at = np.uint64(gi * K * NPIX)  # (group gi's rows of dyr)
            col = np.uint64(gi * CKK * NPIX)  # (its rows of col or colgrad in the work buffer)
            weights = [buf, np.uint64(int(off) + gi * K * CKK)]  # (its block of dw or w)
            if which == "dw":  # dw[k, j] = sum_p dyr[k, p] col[j, p]
                self.cpu_product([scratch, at], [scratch, col], None, weights, K, CKK, NPIX, (NPIX, 1, 1, NPIX, 0, 0),
                                 half_defines(Y=out), label, pools={"a": dyr, "b": ("work", work)})
            else:  # colgrad[j, p] = sum_k w[k, j] dyr[k, p]
                self.cpu_product(weights, [scratch, at], None, [scratch, col], CKK, NPIX, K, (1, CKK, NPIX, 1, 0, 0),
                                 half_defines(A=other), label, pools={"b": dyr, "y": ("work", work)})
        if which == "dx":  # dx = col2im(colgrad): scattered into float planes, gathered into half ones
            col_dx = "#define COL_DX_HALF 1\n" if "DX_HALF" in halves else ""
            self.emit(col_dx + im2col, "col2im_planes" if col_dx else "col2im_scatter", [self.dummy()[0]] +
                      self.args(out), (N, Cin), (1, 1), label + " col2im")
            self.use_scratch(self.launches[-1].kernel, 0, work, "work")

    def _dx_flipped(self, node, g, N, Cin, K, C, group, label):
        """Stride 1: dx = conv(dy, w flipped and transposed per group), pads d * (k - 1) - p: no col buffer."""
        (dy, w), dx = node.inputs, node.outputs[0]
        KH, KW, p, d = g.KH, g.KW, list(g.pads_2d), list(g.dilations_2d)
        self.emit(kernel_source("im2col"), "flip_weights", self.args(w) + [self.dummy()[0]] + [
            np.int32(v) for v in (group, K, C, KH * KW)] + [np.int64(w.size)], (w.size,), None, label + " flip")
        self.use_scratch(self.launches[-1].kernel, 2, 4 * w.size, "wflip")
        n_launch = len(self.launches)
        idx = self.index_type(dy.size, w.size, dx.size)
        x_half = half_defines(X=dy, Y=dx)  # (precision "fp16": dy is this convolution's x, dx its y)
        self._conv_gemm(self.args(dy), self.dummy(), self.dummy(), self.dummy(), self.args(dx),
                        act_macro(None) + defines(x_half), idx, N, group * K, g.OH, g.OW, Cin, g.H, g.W, KH, KW,
                        [1, 1], [d[0] * (KH - 1) - p[0], d[1] * (KW - 1) - p[1]], d, group, label, halves=x_half)
        for launch in self.launches[n_launch:]:
            self.use_scratch(launch.kernel, 2, 4 * w.size, "wflip")

    def _dwconv_grad(self, node, which, N, geo, mult, label):
        dy, other = node.inputs
        out = node.outputs[0]
        Cin, H, W, OH, OW, KH, KW = (int(v) for v in geo[:7])
        src = defines({"TAPS": KH * KW, "MC": mult}) + compiled_geometry(geo[1:13]) + kernel_source("dwconv_grad")
        if which == "dx":
            self.emit(src, "dw_dx", self.args(dy) + self.args(other) + self.args(out) + geo + [np.int32(mult)],
                      (round_up(W, 16), round_up(H, 4), N * Cin), (16, 4, 1), label)
            return
        CO, count = Cin * mult, N * OH * OW
        wg = 64 if self.dev.is_cpu else 256
        G = max(1, min(-(-8 * self.dev.compute_units // CO), -(-count // (4 * wg))))
        src = f"#define WG {wg}\n" + src
        args = self.args(dy) + self.args(other) + [np.int32(N)] + geo + [np.int32(mult), np.int32(G),
                                                                           self.dummy()[0]]
        self.emit(src, "dw_partial", args, (G * wg, CO), (wg, 1), label + " partial")
        self.use_scratch(self.launches[-1].kernel, len(args) - 1, 4 * CO * G * KH * KW, "splitk")
        args = self.args(out) + [np.int32(CO), np.int32(G), self.dummy()[0]]
        self.emit(src, "dw_finish", args, (CO * KH * KW,), None, label)
        self.use_scratch(self.launches[-1].kernel, len(args) - 1, 4 * CO * G * KH * KW, "splitk")

