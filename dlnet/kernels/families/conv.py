"""Convolutions on the GPU cores (implicit GEMM through window.cl + conv.cl) and depthwise ones everywhere; the
node's algorithm (schedule.py) says which of this family's entries, conv_cpu.py's or winograd.py's runs it."""
import numpy as np

from ...errors import ModelError
from ...graph.ops.nn import conv_geometry
from ..emitter import act_macro, core_source, defines
from ..half import half_defines, without_copies
from ..rules import DW_TILED_MAX_TAPS, b_vec_fits, dw_row_block, dw_rows, dw_tile, plane_phases, round_up
from ..runtime import kernel_source


def conv_dims(node):
    """The geometry of a Conv node (graph/ops/nn.py's conv_geometry) as the kernels take it: float32, 1-D or 2-D,
    symmetric pads (errors name the node otherwise)."""
    x = node.inputs[0]
    if x.dtype not in ("float32", "float16"):  # (float16: half storage, precision "fp16")
        raise ModelError(f"node {node.name} (Conv): float32 only, got {x.dtype}")
    if x.rank - 2 not in (1, 2):
        raise ModelError(f"node {node.name} (Conv): {x.rank - 2}-D convolution is not supported (1-D and 2-D are)")
    g = conv_geometry(node)
    if not g.symmetric:
        raise ModelError(f"node {node.name} (Conv): asymmetric pads reach the kernel (padding pass missing)")
    return g


def is_depthwise(node):
    w = node.inputs[1]
    group = node.attrs.get("group", 1)
    return group == node.inputs[0].shape[1] and w.shape[1] == 1 and group > 1 and not node.attrs.get("winograd")


class ConvFamily:
    WINDOW_PAD_ROWS = 128  # >= any tile's TK and TN: fetches run that far past the end (B_SAFE in gemm_fetch.cl)

    def conv(self, node):
        """A Conv node by the algorithm its schedule names."""
        x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        res = node.inputs[3] if len(node.inputs) > 3 else None
        g = conv_dims(node)
        halves = half_defines(X=x, W=w, BIAS=bias, RES=res, Y=y)  # (precision "fp16": the algorithm's half_io)
        head = defines({**({"HAS_BIAS": 1} if bias is not None else {}), **({"HAS_RES": 1} if res is not None else {}),
                        **halves})
        head += act_macro(node.attrs.get("act"))
        bargs = self.args(bias) if bias is not None else self.dummy()
        rargs = self.args(res) if res is not None else self.dummy()
        label = f"{node.name} Conv"
        algo = node.schedule["algo"]  # (schedule.py; Lowerer.lower makes sure there is one)
        if algo.startswith("winograd"):  # 1: w holds U (passes/winograd.py); 2: U from w on the device, every run
            u = w if node.attrs["winograd"] == 1 else None
            self.winograd(x, u, bargs, rargs, y, head, list(g.pads_2d), label, w=w)
        elif algo.startswith("depthwise"):
            self.depthwise(node, algo, g, head, bargs, rargs, label)
        elif algo.startswith("cpu_"):
            geo = [np.int32(v) for v in (g.H, g.W, g.OH, g.OW, g.KH, g.KW, *g.strides_2d, *g.pads_2d, *g.dilations_2d)]
            self.conv_cpu(node, algo, head, bargs, rargs, g.group, g.C // g.group, g.K // g.group, geo,
                          g.K * g.OH * g.OW)
        else:
            idx = self.index_type(x.size, w.size, y.size, res.size if res is not None else 0)
            self._conv_gemm(self.args(x), self.args(w), bargs, rargs, self.args(y), head, idx, g.N,
                            g.C, g.H, g.W, g.K, g.OH, g.OW, g.KH, g.KW, list(g.strides_2d), list(g.pads_2d),
                            list(g.dilations_2d), g.group, label,
                            node.attrs.get("tap_major", 0), halves)

    def depthwise(self, node, algo, g, head, bargs, rargs, label):
        """Depthwise convolutions: dwconv.cl on GPUs; on CPUs dwconv_cpu.cl over zero-padded planes (each work-item
        padding its own rows where they fit: PAD_IN) or over the input with its borders tested."""
        x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
        N, Cin, H, W, Cout, OH, OW, KH, KW = g.N, g.C, g.H, g.W, g.K, g.OH, g.OW, g.KH, g.KW
        strides, pads, dil = list(g.strides_2d), list(g.pads_2d), list(g.dilations_2d)
        mult, y_nstride = Cout // Cin, Cout * OH * OW
        args = self.args(x) + self.args(w) + bargs + rargs + self.args(y) + [
            np.int32(v) for v in (Cin, H, W, OH, OW, KH, KW, *strides, *pads, *dil, mult)] + [
            np.int64(y_nstride), np.int64(y_nstride)]
        if algo == "depthwise_planes_cpu":
            self._dw_planes_cpu(node, g, head, bargs, rargs, label)
        elif algo == "depthwise_cpu":  # ROWS output rows per work-item, stride along W compiled in
            args = args[:-8] + args[-7:]
            rows = dw_rows(OH, OW, N * Cout, self.options)
            self.record_tile(f"{rows}x{OW}")
            self.emit(defines({"SW": strides[1], "ROWS": rows, "KHC": KH, "KWC": KW}) + head +
                      kernel_source("dwconv_cpu"), "dwconv2d_cpu", args, (-(-OH // rows), N * Cout), (1, 1), label)
        elif strides == [1, 1] and dil == [1, 1] and mult == 1 and KH * KW <= DW_TILED_MAX_TAPS:
            tx, ty, px = dw_tile(OW, OH)
            self.record_tile(f"tiled-{ty}x{tx * px}")
            args = args[:-11] + [np.int32(v) for v in pads] + args[-2:]  # (no KH..DW, strides, dilations, M)
            self.emit(defines({"TX": tx, "TY": ty, "PX": px, "KHC": KH, "KWC": KW}) + head +
                      kernel_source("conv_half") + kernel_source("dwconv"),
                      "dwconv2d_tiled", args, (-(-OW // (tx * px)) * tx, -(-OH // ty) * ty, N * Cout), (tx, ty, 1),
                      label)
        else:
            lx, ly = (16 if OW >= 16 else 8), 4
            self.record_tile(f"{ly}x{lx}")
            self.emit(head + kernel_source("conv_half") + kernel_source("dwconv"), "dwconv2d", args,
                      (round_up(OW, lx), round_up(OH, ly), N * Cout), (lx, ly, 1), label)

    def _dw_planes_cpu(self, node, g, head, bargs, rargs, label):
        """dwconv_cpu.cl's dwconv2d_cpu_planes: ROWS output rows per work-item over zero-padded planes."""
        x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
        N, Cin, H, W, Cout, OH, OW, KH, KW = g.N, g.C, g.H, g.W, g.K, g.OH, g.OW, g.KH, g.KW
        strides, pads, dil = list(g.strides_2d), list(g.pads_2d), list(g.dilations_2d)
        o = self.options
        mult, y_nstride = Cout // Cin, Cout * OH * OW
        geo = {"KHC": KH, "KWC": KW, "SHC": strides[0], "SWC": strides[1], "DHC": dil[0], "DWC": dil[1]}
        Hq = -(-((OH - 1) * strides[0] + dil[0] * (KH - 1) + 1) // strides[0])
        Wq = -(-((OW - 1) * strides[1] + dil[1] * (KW - 1) + 1) // strides[1])
        rows = dw_rows(OH, OW, N * Cout, o)
        per = max(1, min(o.dw_min_outputs // (OH * OW), N * Cout // o.dw_min_items)) if rows == OH else 1
        defs = dict(geo, SW=strides[1], ROWS=rows)
        self.record_tile(f"{rows}x{OW}")
        vc, rb = dw_row_block(OW, o.dw_cpu_row_accs) if o.dw_cpu_row_accs else (0, 1)
        pad_in = o.dw_cpu_pad_in and \
            plane_phases(geo) * (round_up(rows, rb) + dil[0] * (KH - 1) // strides[0]) * Wq + 8 <= o.dw_pad_in_floats
        if pad_in:  # each work-item pads the rows it reads itself (dwconv_cpu.cl's PAD_IN)
            xargs, xp_nstride, extra = self.args(x), Cin * H * W, [np.int32(v) for v in (H, W, pads[0], pads[1])]
            defs.update(PAD_IN=1, WQ=Wq)
            if vc:  # blocks of rb rows by vc vectors
                defs.update(OWC=OW, VC=vc, RB=rb)
            if node.attrs.get("in_perm") is not None:
                defs["CHANNEL_MAP"] = 1
                extra += [self.meta(np.asarray(node.attrs["in_perm"], np.int32), np.int32), np.uint64(0)]
        else:
            xp_nstride = self.pad_planes(x, H, W, geo, Hq, Wq, pads[0], pads[1], 8 + Wq, label,
                                         node.attrs.get("in_perm"))
            xargs, extra = [self.dummy()[0], np.uint64(0)], []
        self.emit(defines(defs) + head + kernel_source("planes") + kernel_source("dwconv_cpu"),
                  "dwconv2d_cpu_planes", xargs + self.args(w) + bargs + rargs + self.args(y) + [
                      np.int32(v) for v in (Cin, Hq, Wq, OH, OW, mult)] + [
                      np.int64(xp_nstride), np.int64(y_nstride), np.int64(y_nstride), np.int32(N * Cout),
                      np.int32(per)] + extra, (-(-OH // rows), -(-N * Cout // per)), (1, 1), label)
        if not pad_in:
            self.use_scratch(self.launches[-1].kernel, 0, 4 * N * xp_nstride, "work")

    def _conv_gemm(self, xa, wa, ba, ra, ya, head, idx, N, Cin, H, W, Cout, OH, OW, KH, KW, strides, pads, dil, group,
                   label, tap_major=0, halves=None):
        """Convolution as implicit GEMM on a GPU core (CPUs: conv_cpu); xa..ya: (buffer, offset) arguments of x,
        w, bias, residual, y; head: the epilogue's defines; tap_major: w is [K, KH, KW, C] (passes/layout.py); halves:
        the operands stored in half (half.half_defines, already in head)."""
        y_nstride = Cout * OH * OW
        C, K = Cin // group, Cout // group
        M, NN = K, N * OH * OW
        pick = self.pick(M, NN, C * KH * KW, group, KH * KW == 1 or (tap_major and C % 32 == 0),
                         f"conv{KH}x{KW}s{strides[0]}x{strides[1]}{'t' if tap_major else ''}")
        core, tiles, lsize, (g0, g1) = pick
        tiles = without_copies(tiles, halves, ("X", "W"))
        if KH == 1 and KW == 1 and strides == [1, 1] and pads == [0, 0]:
            tiles = dict(tiles, IS_1X1=1)
            if "STAGES" in tiles and OH * OW % 4 == 0 and xa[1] % 4 == 0 and b_vec_fits(core, tiles):
                tiles["B_CVEC"] = 1  # x's pixels as 16-byte copies (gemm_fetch.cl)
        if tap_major:
            tiles = dict(tiles, TAP_MAJOR=1)
        if core == "gemm_mma" and (C * KH * KW) % 4 == 0 and wa[1] % 4 == 0:
            tiles = dict(tiles, A_VEC=1)  # weight rows as 16-byte copies (gemm_fetch.cl)
        src = defines(dict(tiles, IDX=idx)) + head + kernel_source("window") + kernel_source("conv_half") + \
            kernel_source("conv") + core_source(core, tiles)
        args = xa + wa + ba + ra + ya + [self.window_table(C, H, W, KH, KW, dil, tap_major)] + [
            np.int32(v) for v in (C, H, W, K, OH, OW, KH, KW, *strides, *pads, *dil, group, N)] + [
            np.int64(y_nstride), np.int64(y_nstride)]
        self._matrix(src, "conv2d", args, pick, tiles, (g0, g1, group), M, NN, C * KH * KW, label)

    def window_table(self, C, H, W, KH, KW, dil, tap_major=False):
        """The int4 table of window.cl for (c, ky, kx) of C channels (tap_major: for (ky, kx, c)), then rows wholly
        in the padding: a buffer."""
        ky, kx = np.meshgrid(np.arange(KH) * dil[0], np.arange(KW) * dil[1], indexing="ij")
        taps = np.stack([ky * W + kx, ky, kx, np.zeros_like(ky)], -1).reshape(1, KH * KW, 4)
        ktab = taps + (np.arange(C) * H * W).reshape(C, 1, 1) * np.array([1, 0, 0, 0])
        if tap_major:
            ktab = ktab.transpose(1, 0, 2)
        outside = np.tile(np.array([0, -0x40000000, 0, 0]), (self.WINDOW_PAD_ROWS, 1))
        return self.meta(np.concatenate([ktab.reshape(-1, 4), outside]).ravel(), np.int32)
