"""Convolutions on CPU devices (conv_cpu.cl): register-blocked tiles over zero-padded planes, fused Winograd F(2x2,
3x3), im2col panels, or (small maps) pixel panels; planes.cl pads the planes they read."""
import numpy as np

from ...errors import ModelError
from ...graph.passes.fuse import affine_chain
from ...graph.passes.winograd import transform_weights
from ..emitter import defines
from ..rules import (
    CONV_CPU_PIXEL_COLS,
    direct_row_tiles,
    pick_conv_cpu_pixels,
    pick_conv_cpu_tiles,
    plane_phases,
    round_up,
)
from ..runtime import kernel_source
from .conv import conv_dims


def conv_cpu_algo(node, dev, options):
    """How a CPU device runs a (not depthwise) Conv: "cpu_winograd" (3x3 stride 1, constant weights, enough channels,
    rows of tiles that pad little, panels that fit local memory), "cpu_direct" (several taps: zero-padded planes),
    "cpu_local" (1x1 layers and large im2col matrices: panels packed in local memory) or "cpu_im2col"."""
    w = node.inputs[1]
    g = conv_dims(node)
    C, K = g.C // g.group, g.K // g.group
    KH, KW, (SH, SW), (PH, PW), (DH, DW) = g.KH, g.KW, g.strides_2d, g.pads_2d, g.dilations_2d
    pointwise = KH == KW == SH == SW == 1 and PH == PW == 0
    if node.attrs.get("in_perm") is not None and not (options.conv_cpu_direct and KH * KW > 1):
        raise ModelError(f"node {node.name} (Conv): a channel map needs the padded planes' path")
    if node.attrs.get("prologue") and not (pointwise and 4 * C * 16 <= dev.local_mem):
        raise ModelError(f"node {node.name} (Conv): a prologue needs a 1x1 stride-1 unpadded layer whose panel "
                         f"fits local memory")
    TH, TW = -(-g.OH // 2), -(-g.OW // 2)
    TWP = round_up(TW, 8)
    if options.conv_cpu_winograd and KH == KW == 3 and SH == SW == DH == DW == 1 and g.group == 1 and \
            w.const is not None and not w.param and min(C, K) >= options.conv_cpu_winograd_min_channels and \
            TWP <= options.conv_cpu_winograd_max_row * TW:
        tiles = pick_conv_cpu_tiles(TH * TWP)
        if 4 * 16 * (C + tiles["MR"]) * 8 * tiles["NV"] <= dev.local_mem:
            return "cpu_winograd"
    if w.const is not None and not w.param and node.attrs.get("in_perm") is None and not node.attrs.get("prologue") \
            and pick_conv_cpu_pixels(g.N * g.OH * g.OW, K, C * KH * KW, pointwise, options.conv_cpu_pixels_max,
                                 dev.local_mem):
        return "cpu_pixels"
    if options.conv_cpu_direct and KH * KW > 1:  # (a 1x1 stride 2 ran at 130 GF/s direct, 155 through im2col)
        return "cpu_direct"
    NN = g.N * g.OH * g.OW
    tiles = pick_conv_cpu_tiles(NN)
    NR = 8 * tiles["NV"]
    col_bytes = 4 * g.group * -(-NN // NR) * NR * C * KH * KW
    if (pointwise or col_bytes >= options.conv_cpu_local_min_bytes) and 4 * C * KH * KW * NR <= dev.local_mem:
        return "cpu_local"
    return "cpu_im2col"


class ConvCpuFamily:
    def conv_cpu(self, node, algo, head, bargs, rargs, group, C, K, geo, y_nstride):
        """A convolution on a CPU device, in conv_cpu.cl's register-blocked tiles, by `algo` (conv_cpu_algo): fused
        Winograd, zero-padded (phase) planes, im2col panels packed per panel in __local memory, or a whole im2col
        matrix first; constant weights are packed here, once."""
        x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
        H, W, OH, OW, KH, KW, SH, SW, PH, PW, DH, DW = (int(v) for v in geo)
        N, Cin, KK, OHW = x.shape[0], x.shape[1], C * KH * KW, OH * OW
        NN = N * OHW
        pointwise = KH == KW == SH == SW == 1 and PH == PW == 0
        direct = algo == "cpu_direct"
        # the direct path's planes: the padded extent the outputs read, split into SHP x SWP phases of Hq x Wq
        Hq, Wq = -(-((OH - 1) * SH + DH * (KH - 1) + 1) // SH), -(-((OW - 1) * SW + DW * (KW - 1) + 1) // SW)
        tiles = pick_conv_cpu_tiles(OH * Wq if direct else NN)
        MR, NR = tiles["MR"], 8 * tiles["NV"]
        MB, NB = -(-K // MR), -(-NN // NR)
        defs, label = dict(tiles), f"{node.name} Conv"
        self.record_tile(f"{MR}x{NR}")
        if algo == "cpu_winograd":
            self._conv_cpu_winograd(node, head, bargs, rargs, C, K, PH, PW, y_nstride, label)
            return
        if algo == "cpu_pixels":
            self._conv_cpu_pixels(node, head, bargs, rargs, group, C, K, geo, y_nstride, label)
            return
        wargs = self.conv_cpu_weights(w, group, K, KK, MR, defs)
        if direct:
            self._conv_cpu_direct(node, head, wargs, bargs, rargs, group, C, K, geo, (Hq, Wq), y_nstride, defs, label)
            return
        col_bytes = 4 * group * NB * NR * KK
        local = algo == "cpu_local"
        if local:  # each work-item packs its own panel: split the row blocks until 8 work-items per core
            # every such kernel declares the whole local memory: PoCL reallocates its threads' local areas when a
            # kernel asks for another size than the last one's, about 0.12 ms between kernels (densenet121 with
            # panels of their own sizes: 16.3 ms of gaps between its 345 kernels, against 3.4 at one size)
            defs["B_LOCAL"] = self.dev.local_mem // 4
            if pointwise:
                defs["PACK_1X1"] = 1
            npw, NBW, MBS = self.cpu_shares(NB, MB, group, KK, NR, defs["B_LOCAL"])
        else:
            args = self.args(x) + [self.dummy()[0], np.int32(C)] + geo + [np.int64(Cin * H * W), np.int32(NN)]
            self.emit(defines(defs) + head + kernel_source("conv_cpu"), "im2col_pack", args, (KK, group), (1, 1),
                      label + " im2col")
            self.use_scratch(self.launches[-1].kernel, 2, col_bytes, "work")
        if local:
            args = self.args(x) + wargs + bargs + rargs + self.args(y) + [
                np.int32(C), np.int32(K), np.int32(KK), np.int32(OHW), np.int32(NN), np.int64(y_nstride),
                np.int64(y_nstride), np.int32(H), np.int32(W), np.int32(OW), np.int32(KH), np.int32(KW), np.int32(SH),
                np.int32(SW), np.int32(PH), np.int32(PW), np.int32(DH), np.int32(DW), np.int64(Cin * H * W),
                np.int32(MBS), np.int32(npw)]
            if node.attrs.get("prologue"):  # fuse_conv_prologues: relu?(x * scale + shift) as each panel is packed
                _, scale, shift, relu = affine_chain(node.attrs["prologue"], x.shape)
                defs.update(PROLOGUE=1, **({"PRO_RELU": 1} if relu else {}))
                args += [self.meta(np.concatenate([scale, shift]).astype(np.float32), np.float32), np.uint64(0)]
            self.emit(defines(defs) + head + kernel_source("conv_cpu"), "conv2d_cpu_local", args,
                      (NBW, -(-MB // MBS), group), (1, 1, 1), label)
            return
        args = self.args(x) + wargs + bargs + rargs + self.args(y) + [
            self.dummy()[0], np.int32(C), np.int32(K), np.int32(KK), np.int32(OHW), np.int32(NN),
            np.int64(y_nstride), np.int64(y_nstride)]
        self.emit(defines(defs) + head + kernel_source("conv_cpu"), "conv2d_cpu", args, (MB, NB, group), (1, 1, 1),
                  label)
        self.use_scratch(self.launches[-1].kernel, 10, 0, "work")

    def _conv_cpu_direct(self, node, head, wargs, bargs, rargs, group, C, K, geo, planes, y_nstride, defs, label):
        """conv_cpu.cl's conv2d_cpu_direct: the layer's taps read from zero-padded (phase) planes of Hq x Wq
        (planes), which pad_planes writes into the work scratch first; panels of positions along the planes' rows,
        or inside output rows (ROW_TILES)."""
        x, y = node.inputs[0], node.outputs[0]
        H, W, OH, OW, KH, KW, SH, SW, PH, PW, DH, DW = (int(v) for v in geo)
        (Hq, Wq), N, KK = planes, x.shape[0], C * KH * KW
        MR, NR = defs["MR"], 8 * defs["NV"]
        MB = -(-K // MR)
        NBI = -(-(OH * Wq) // NR)
        tail = NBI * NR - OH * Wq + Wq - OW  # past the last plane: what the last panel's dropped columns read
        row_tiles = direct_row_tiles(OW, Wq, NR) if self.options.conv_cpu_direct_row_tiles else 0
        if row_tiles:  # panels inside output rows (ROW_TILES)
            defs["ROW_TILES"], NBI, tail = row_tiles, OH * row_tiles, Wq  # (the last row: kx past Wq)
        taps = {"KHC": KH, "KWC": KW, "SHC": SH, "SWC": SW, "DHC": DH, "DWC": DW}
        xp_nstride = self.pad_planes(x, H, W, taps, Hq, Wq, PH, PW, tail, label, node.attrs.get("in_perm"))
        defs.update(taps)
        if self.options.conv_cpu_direct_pack and 4 * KK * NR <= self.dev.local_mem:
            defs["B_LOCAL"] = self.dev.local_mem // 4
        src = defines(defs) + head + kernel_source("planes") + kernel_source("conv_cpu")
        npw, NBW, MBS = self.cpu_shares(N * NBI, MB, group, KK, NR, defs.get("B_LOCAL"))
        self.emit(src, "conv2d_cpu_direct", [self.dummy()[0], np.uint64(0)] + wargs + bargs + rargs + self.args(y) + [
            np.int32(v) for v in (C, K, Hq, Wq, OH, OW, NBI)] + [np.int64(xp_nstride), np.int64(y_nstride),
                                                                 np.int64(y_nstride)] + [
            np.int32(v) for v in (MBS, npw, N * NBI)], (NBW, -(-MB // MBS), group), (1, 1, 1), label)
        self.use_scratch(self.launches[-1].kernel, 0, 4 * N * xp_nstride, "work")

    def _conv_cpu_winograd(self, node, head, bargs, rargs, C, K, PH, PW, y_nstride, label):
        """conv_cpu.cl's conv2d_cpu_wino: fused Winograd F(2x2, 3x3) over padded planes, weights transformed here."""
        x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
        N, H, W = x.shape[0], x.shape[2], x.shape[3]
        OH, OW = y.shape[2], y.shape[3]
        TH, TW = -(-OH // 2), -(-OW // 2)  # Winograd's 2x2 output tiles, in rows of TWP
        TWP = round_up(TW, 8)
        tiles = pick_conv_cpu_tiles(TH * TWP)
        MR, NR = tiles["MR"], 8 * tiles["NV"]
        MB, NBI = -(-K // MR), -(-(TH * TWP) // NR)
        self.record_tile(f"{MR}x{NR}")
        Hq, Wq = 2 * TH + 2, 2 * TWP + 2
        geo3 = {"KHC": 3, "KWC": 3, "SHC": 1, "SWC": 1, "DHC": 1, "DWC": 1}
        xp_nstride = self.pad_planes(x, H, W, geo3, Hq, Wq, PH, PW, 0, label, node.attrs.get("in_perm"))
        defs = dict(tiles, **geo3, WINO_CPU=1, A_PACKED=1, B_LOCAL=self.dev.local_mem // 4)
        src = defines(defs) + head + kernel_source("planes") + kernel_source("conv_cpu")
        u = np.zeros((16, MB * MR, C), np.float32)
        u[:, :K] = transform_weights(w.const, 2).reshape(16, K, C)
        u = u.reshape(16, MB, MR, C).transpose(0, 1, 3, 2)
        splits = min(MB, -(-self.cpu_items() // (N * NBI)))
        MBS = -(-MB // splits)
        self.emit(src, "conv2d_cpu_wino", [self.dummy()[0], np.uint64(0), self.meta(u.ravel(), np.float32),
                                           np.uint64(0)] + bargs + rargs + self.args(y) + [
            np.int32(v) for v in (C, K, Wq, OH, OW, TH, TW, TWP, NBI)] + [
            np.int64(xp_nstride), np.int64(y_nstride), np.int64(y_nstride), np.int32(MBS)],
            (N * NBI, -(-MB // MBS)), (1, 1), f"{node.name} Conv winograd")
        self.use_scratch(self.launches[-1].kernel, 0, 4 * N * xp_nstride, "work")

    def cpu_shares(self, NB, MB, group, KK, NR, local_floats=None):
        """How conv2d_cpu_local and _direct share out NB panels (per group, KK x NR floats each) by MB row blocks:
        (panels per work-item, work-items along the panels, row blocks per work-item). Consecutive panels per
        work-item, as many as Options.conv_cpu_panel_bytes holds while there are cpu_items() work-items (and, where
        they are packed into __local memory, as many as its local_floats hold); each row block of outputs then runs
        over them in turn; then the row blocks split until cpu_items(). More than one panel is recorded on the node's
        tile as /p<panels>."""
        fit = self.options.conv_cpu_panel_bytes // (4 * KK * NR)
        if local_floats is not None:
            fit = min(fit, local_floats // (KK * NR))
        npw = max(1, min(fit, NB * group // self.cpu_items()))
        if npw > 1:  # (printed in the IR: tile=6x16/p4)
            self.record_tile(f"{self.node.schedule['tile']}/p{npw}")
        NBW = -(-NB // npw)
        return npw, NBW, -(-MB // min(MB, -(-self.cpu_items() // (NBW * group))))

    def cpu_items(self):
        """Work-items a CPU convolution's tiles are shared out into: Options.conv_cpu_items_per_core per core."""
        return self.options.conv_cpu_items_per_core * self.dev.compute_units

    def _conv_cpu_pixels(self, node, head, bargs, rargs, group, C, K, geo, y_nstride, label):
        """conv_cpu.cl's conv2d_cpu_pixels: MR output pixels as rows, 16 output channels as columns, the weights packed
        here as wq[g][nb][k][16]. With Options.conv_cpu_pixels_packed, every pixel panel packed once (pixels_pack,
        into the plan's work scratch) and the weights stationary; else each work-item packs its own pixel panel."""
        x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
        H, W, OH, OW, KH, KW, SH, SW, PH, PW, DH, DW = (int(v) for v in geo)
        N, Cin = x.shape[0], x.shape[1]
        KK, OHW, NR = C * KH * KW, OH * OW, CONV_CPU_PIXEL_COLS
        NN = N * OHW
        pointwise = KH == KW == SH == SW == 1 and PH == PW == 0
        MR = pick_conv_cpu_pixels(NN, K, KK, pointwise, self.options.conv_cpu_pixels_max, self.dev.local_mem)
        MB, NB = -(-NN // MR), -(-K // NR)
        self.record_tile(f"{MR}x{NR}")
        a = np.zeros((group, NB * NR, KK), np.float32)
        a[:, :K] = np.asarray(w.const, np.float32).reshape(group, K, KK)
        a = a.reshape(group, NB, NR, KK).transpose(0, 1, 3, 2)
        items = self.cpu_items()
        xgeo = [np.int32(v) for v in (H, W, OW, KH, KW, SH, SW, PH, PW, DH, DW)] + [np.int64(Cin * H * W)]
        wargs = [self.meta(a.ravel(), np.float32), np.uint64(0)]
        if self.options.conv_cpu_pixels_packed:
            defs = dict(MR=MR, NV=NR // 8, PIXEL_ROWS=1, PIXELS_PACKED=1)
            src = defines(defs) + head + kernel_source("conv_cpu")
            self.emit(src, "pixels_pack", self.args(x) + [self.dummy()[0]] + [
                np.int32(v) for v in (C, KK, OHW, NN)] + xgeo, (MB, group), (1, 1), label + " pack")
            self.use_scratch(self.launches[-1].kernel, 2, 4 * group * MB * KK * MR, "work")
            shares = min(NB, -(-items // group))  # channel panels shared out first, then the pixel blocks
            NBS = -(-NB // shares)
            MBS = -(-MB // min(MB, -(-items // (shares * group))))
            self.emit(src, "conv2d_cpu_pixels", [self.dummy()[0], np.uint64(0)] + wargs + bargs + rargs +
                      self.args(y) + [np.int32(v) for v in (K, KK, OHW, NN)] + [
                          np.int64(y_nstride), np.int64(y_nstride), np.int32(NBS), np.int32(MBS)],
                      (-(-NB // NBS), -(-MB // MBS), group), (1, 1, 1), label)
            self.use_scratch(self.launches[-1].kernel, 0, 0, "work")
            return
        splits = min(NB, -(-items // (MB * group)))
        NBS = -(-NB // splits)
        defs = dict(MR=MR, NV=NR // 8, PIXEL_ROWS=1, B_LOCAL=self.dev.local_mem // 4)
        args = self.args(x) + wargs + bargs + rargs + self.args(y) + [
            np.int32(v) for v in (C, K, KK, OHW, NN)] + [np.int64(y_nstride), np.int64(y_nstride)] + xgeo + [
            np.int32(NBS)]
        self.emit(defines(defs) + head + kernel_source("conv_cpu"), "conv2d_cpu_pixels", args,
                  (MB, -(-NB // NBS), group), (1, 1, 1), label)

    def pad_planes(self, x, H, W, geo, Hq, Wq, PH, PW, tail, label, cmap=None):
        """Launch planes.cl's pad_planes: x [N, C, H, W] (1-D: H = 1) into the plan's "work" scratch as zero-padded
        planes of Hq x Wq per channel and phase of geo's strides (KHC, KWC, SHC, SWC, DHC, DWC), then `tail` zeros
        per image; cmap: plane c copies channel cmap[c]. Returns the floats from one image's planes to the next's."""
        N, C = x.shape[:2]
        phases = plane_phases(geo)
        xp_nstride = round_up(C * phases * Hq * Wq + tail, 16)
        o = self.options  # planes per work-item:
        per = max(1, min(o.pad_min_floats // (Hq * Wq), C * phases * N // o.pad_min_items))
        extra, defs = [], dict(geo)
        if cmap is not None:
            extra, defs["CHANNEL_MAP"] = [self.meta(np.asarray(cmap, np.int32), np.int32), np.uint64(0)], 1
        self.emit(defines(defs) + kernel_source("planes"), "pad_planes", self.args(x) + [self.dummy()[0]] + [
            np.int32(v) for v in (H, W, Hq, Wq, PH, PW)] + [np.int64(C * H * W), np.int64(xp_nstride)] + [
            np.int32(v) for v in (tail, C * phases, per)] + extra, (-(-C * phases // per), N), (1, 1),
            label + " pad")
        self.use_scratch(self.launches[-1].kernel, 2, 4 * N * xp_nstride, "work")
        return xp_nstride

    def conv_cpu_weights(self, w, group, K, KK, MR, defs):
        """conv_cpu.cl's weight arguments: a constant w packed here, once, as wp[g][mb][k][MR] (A_PACKED, rows past K
        zero); a trainable weight changes in place, so it is read as it is."""
        if w.const is None or w.param:
            return self.args(w)
        defs["A_PACKED"] = 1
        MB = -(-K // MR)
        a = np.zeros((group, MB * MR, KK), np.float32)
        a[:, :K] = np.asarray(w.const, np.float32).reshape(group, K, KK)
        a = a.reshape(group, MB, MR, KK).transpose(0, 1, 3, 2)
        return [self.meta(a.ravel(), np.float32), np.uint64(0)]

