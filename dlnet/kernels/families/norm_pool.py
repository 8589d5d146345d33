"""Pooling, LRN, Softmax / LogSoftmax and LayerNorm kernels (pool.cl / pool_cpu.cl, lrn*.cl, softmax.cl,
layernorm.cl)."""
import numpy as np

from ...errors import ModelError
from .. import half
from ..emitter import defines
from ..runtime import DTYPE_TO_C, kernel_source

# LayerNorm on GPUs: a work-group per row (layernorm_wg) of the largest power of two <= D / 8 work-items, within these
# bounds. H100, 3152 rows: D = 768 in 11 us against 470 us at a work-item per row, D = 32 in 7 us against 22 us;
# 256 rows of 4096 in 10 us (256 work-items) against 2.6 ms. CPUs (PoCL) keep a work-item per row: 3152 x 32 in
# 157 us against 870 us in groups of 32.
LAYERNORM_GROUP = (32, 256)
# ... and where there are at most this many rows (decoding's one token a step), the largest power of two <= D / 2
# within them: a lone row's work-group is the whole launch, so its time is each work-item's chain of loads and sums
LAYERNORM_FEW_ROWS = 16
# AddLayerNorm on NVIDIA (add_layernorm_warp): a warp per row, this many rows a work-group, for D a multiple of 8 up
# to 8 x 32 x WARP_NCH_MAX (the row's chunks of 8 stay in each lane's registers)
WARP_ROWS = 4
WARP_NCH_MAX = 8


# LayerNormAxis on GPUs (layernorm_axis.cl): a work-group of TP = 32 consecutive rows (pixels: x's loads coalesce) by
# TD = 8 work-items along each row, so that ConvNeXt's 7 x 7 stage (49 rows of 768 per image) keeps 8 work-items per
# row. CPUs: layernorm_axis_rows8, 8 rows per work-item in float8 registers (bench/convnext_layout.py, convnext_small
# b1 on 2 shared cores, fastest of 5 runs: its 42 LayerNormAxis 8.9 ms, against 8.3 ms for the LayerNorms and 4.9 ms
# for the 80 Transposes they replace).
LAYERNORM_AXIS_GROUP = (32, 8)


def layernorm_group(D, rows):
    lo, hi = LAYERNORM_GROUP
    per = 2 if rows <= LAYERNORM_FEW_ROWS else 8
    return max(lo, min(hi, 1 << max(0, (D // per).bit_length() - 1)))


class NormPoolFamily:
    # precision "fp16" (kernels/half.py): softmax and normalisation read half and compute in float32 (autocast's fp32
    # list); LayerNorm, LayerNormStats (training's) and RMSNorm may store y in half, as the product after them would
    # cast it (their statistics outputs stay float: in training the products of y and their gradients then run on
    # the f16 cores)
    HALF_IO = {"Softmax": half.HalfIO((0,)), "LogSoftmax": half.HalfIO((0,)), "LayerNorm": half.HalfIO((0,), True),
               "LayerNormStats": half.HalfIO((0,), (0,)), "RMSNorm": half.HalfIO((0,), True),
               "MaxPool": half.EVERY, "AveragePool": half.EVERY,  # (pool.cl, pool_cpu.cl: float sums)
               "AddLayerNorm": half.HalfIO((0, 1), True),  # (a, b; y and s: add_layernorm.cl)
               "LayerNormAxis": half.HalfIO((0,), True)}  # (layernorm_axis.cl)

    def pool(self, node, mode):
        x, y = node.inputs[0], node.outputs[0]
        nsp = x.rank - 2
        if nsp > 3 or nsp < 1:
            raise ModelError(f"node {node.name} ({node.op}): {nsp}-D pooling is not supported")
        a = node.attrs
        k = list(a["kernel_shape"])
        strides = list(a.get("strides") or [1] * nsp)
        pads = list(a.get("pads") or [0] * 2 * nsp)
        dil = list(a.get("dilations") or [1] * nsp)
        pad3 = lambda v, fill: [fill] * (3 - nsp) + list(v)  # noqa: E731
        ins, outs = pad3(x.shape[2:], 1), pad3(y.shape[2:], 1)
        # precision "fp16": half x / y loaded and stored as float (pool.cl's X_HALF / Y_HALF)
        T = "float" if x.dtype == "float16" else DTYPE_TO_C[x.dtype]
        if x.dtype in ("float32", "float64", "float16"):
            lowest = "-INFINITY"
        else:  # INT64_MIN has no literal of its own in C
            lowest = "(-9223372036854775807L - 1)" if x.dtype == "int64" else str(np.iinfo(x.dtype).min)
        head = (("#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" if x.dtype == "float64" else "") +
                defines({"POOL_MAX" if mode == "max" else "POOL_AVG": 1, "T": T, "LOWEST": lowest,
                         **half.half_defines(X=x, Y=y)}))
        if self.dev.is_cpu and nsp <= 2:  # one work-item per output row; (H, W) are the last two of the padded dims
            window = {name: v[d] for name, v in (("K", pad3(k, 1)), ("S", pad3(strides, 1)), ("D", pad3(dil, 1)))
                      for d, name in ((1, name + "H"), (2, name + "W"))}
            kernel = "pool_cpu"
            if x.dtype == y.dtype == "float32":
                window["VEC"] = 1
                if self.options.pool_cpu_separable and mode == "max" and max(pads) < 3 and \
                        [window[n] for n in ("KH", "KW", "SH", "SW", "DH", "DW")] == [3, 3, 2, 2, 1, 1]:
                    kernel = "pool_cpu_sep"  # (every window meets the image: its taps outside read one inside)
                    del window["VEC"]
                    window["SEPARABLE"] = 1
            args = self.args(x) + self.args(y) + [np.int32(v[d]) for v in (ins, outs, pad3(pads[:nsp], 0))
                                                  for d in (1, 2)] + [np.int32(a.get("count_include_pad", 0))]
            planes = int(np.prod(y.shape[:2], dtype=np.int64))
            # rows per work-item: PoCL's cost per work-group outweighed a short row's (192 x 56 rows of 56: 1.2 ms)
            window["ROWS"] = R = max(1, min(outs[1], self.options.pool_cpu_rows * 8 // max(outs[2], 8)))
            self.emit(head + defines(window) + kernel_source("pool_cpu"), kernel, args,
                      (-(-outs[1] // R), planes), (1, 1), f"{node.name} {node.op}")
            return
        src = head + kernel_source("pool")
        args = self.args(x) + self.args(y) + [np.int32(v) for v in ins + outs + pad3(k, 1) + pad3(strides, 1) +
                                              pad3(pads[:nsp], 0) + pad3(dil, 1)]
        args += [np.int32(a.get("count_include_pad", 0)), np.int64(y.size)]
        self.emit(src, "pool", args, (y.size,), None, f"{node.name} {node.op}")

    def lrn(self, node):
        x, y = node.inputs[0], node.outputs[0]
        a = node.attrs
        hw = int(np.prod(x.shape[2:], dtype=np.int64))
        if self.dev.is_cpu:
            args = self.args(x) + self.args(y) + [np.int32(x.shape[1]), np.int32(hw), np.int32(a["size"]),
                                                  np.float32(a.get("alpha", 1e-4)), np.float32(a.get("beta", 0.75)),
                                                  np.float32(a.get("bias", 1.0))]
            self.emit(kernel_source("lrn_cpu"), "lrn_cpu", args, (-(-hw // 8), x.shape[0]), (1, 1), f"{node.name} LRN")
            return
        args = self.args(x) + self.args(y) + [np.int32(x.shape[1]), np.int64(hw), np.int32(a["size"]),
                                              np.float32(a.get("alpha", 1e-4)), np.float32(a.get("beta", 0.75)),
                                              np.float32(a.get("bias", 1.0)), np.int64(y.size)]
        self.emit(kernel_source("lrn"), "lrn", args, (y.size,), None, f"{node.name} LRN")

    def softmax(self, node, log):
        x, y = node.inputs[0], node.outputs[0]
        if x.dtype not in ("float32", "float16"):  # (float16: half storage, precision "fp16")
            raise ModelError(f"node {node.name} ({node.op}): float32 only, got {x.dtype}")
        axis = node.attrs["axis"] % x.rank
        outer = int(np.prod(x.shape[:axis], dtype=np.int64))
        inner = int(np.prod(x.shape[axis + 1:], dtype=np.int64))
        defs = {"LOG_SOFTMAX" if log else "SOFTMAX": 1, **half.half_defines(X=x)}
        if inner == 1 and self.dev.tiled and x.shape[axis] >= 64 and outer > 0:  # a work-group a row
            wg = min(256, 1 << (x.shape[axis] - 1).bit_length())
            src = defines(dict(defs, WG=wg)) + kernel_source("softmax")
            self.emit(src, "softmax_rows", self.args(x) + self.args(y) + [np.int32(x.shape[axis])],
                      (outer * wg,), (wg,), f"{node.name} {node.op}")
            return
        src = defines(defs) + kernel_source("softmax")
        args = self.args(x) + self.args(y) + [np.int32(outer), np.int32(x.shape[axis]), np.int32(inner)]
        self.emit(src, "softmax", args, (max(outer * inner, 1),), None, f"{node.name} {node.op}")

    def layernorm(self, node):
        """LayerNorm / LayerNormStats (the row's mean and 1 / sqrt(var + eps) too) / RMSNorm (no mean, no bias): a
        work-item per row on CPUs, a work-group per row on GPUs (layernorm_group)."""
        x, scale = node.inputs[:2]
        y = node.outputs[0]
        D = x.shape[-1]
        rows = x.size // max(D, 1)
        defs = {"RMS": 1} if node.op == "RMSNorm" else {}
        bias = [] if defs else self.args(node.inputs[2])
        defs.update(half.half_defines(X=x, Y=y), **half.tf32_defines(node))
        args = self.args(x) + self.args(scale) + bias + self.args(y) + [
            np.int64(rows), np.int32(D), np.float32(node.attrs["epsilon"])]
        if len(node.outputs) > 1:
            defs["STATS"] = 1
            args += self.args(node.outputs[1]) + self.args(node.outputs[2])
        wg = 0 if self.dev.is_cpu else layernorm_group(D, rows)
        label = f"{node.name} {node.op}"
        defs.update({"WG": wg} if wg else {})
        src = defines(defs) + kernel_source("tf32_store") + kernel_source("layernorm")
        if wg:
            self.emit(src, "layernorm_wg", args, (max(rows, 1) * wg,), (wg,), label)
        else:
            self.emit(src, "layernorm", args, (max(rows, 1),), None, label)

    def add_layernorm(self, node):
        """AddLayerNorm (graph/ops/transformer.py): s = a + b and LayerNorm / RMSNorm of it in one pass over each row
        (add_layernorm.cl), writing s too where it is kept; a warp per row on NVIDIA (warp_rows), else work-items and
        groups as layernorm's."""
        a, b, scale = node.inputs[:3]
        y = node.outputs[0]
        D = a.shape[-1]
        rows = a.size // max(D, 1)
        defs = {"RMS": 1} if node.attrs["rms"] else {}
        defs.update(half.half_defines(A=a, B=b, Y=y, S=node.outputs[1] if len(node.outputs) > 1 else None),
                    **half.tf32_defines(node))
        args = self.args(a) + self.args(b) + [np.int64(max(b.size // max(D, 1), 1))] + self.args(scale) + \
            (self.args(node.inputs[3]) if not node.attrs["rms"] else []) + self.args(y) + \
            [np.int64(rows), np.int32(D), np.float32(node.attrs["epsilon"])]
        if len(node.outputs) > 1:
            defs["KEEP_SUM"] = 1
            args += self.args(node.outputs[1])
        label = f"{node.name} AddLayerNorm"
        if self.warp_rows(D, node.inputs + node.outputs):
            defs.update(WARP_ROWS=WARP_ROWS, NCH=-(-D // 256))
            self.record_tile(f"warp/{WARP_ROWS}")
            src = defines(defs) + kernel_source("tf32_store") + kernel_source("ptx_lanes") + \
                kernel_source("add_layernorm")
            self.emit(src, "add_layernorm_warp", args, (-(-rows // WARP_ROWS) * 32 * WARP_ROWS,), (32 * WARP_ROWS,),
                      label)
            return
        wg = 0 if self.dev.is_cpu else layernorm_group(D, rows)
        defs.update({"WG": wg} if wg else {})
        src = defines(defs) + kernel_source("tf32_store") + kernel_source("add_layernorm")
        if wg:
            self.emit(src, "add_layernorm_wg", args, (max(rows, 1) * wg,), (wg,), label)
        else:
            self.emit(src, "add_layernorm", args, (max(rows, 1),), None, label)

    def warp_rows(self, D, values):
        """Do rows of D elements of these operands take a warp each (add_layernorm_warp: NVIDIA, Options.norm_warps,
        D a multiple of 8 whose chunks fit the registers, every operand 16-byte aligned)?"""
        return self.dev.is_nvidia and self.options.norm_warps and D % 8 == 0 and D <= 256 * WARP_NCH_MAX and all(
            self.loc(v)[1] * np.dtype(v.dtype).itemsize % 16 == 0 for v in values)

    def layernorm_axis(self, node):
        """LayerNormAxis (layernorm_axis.cl): x viewed as [outer, D, inner], rows (o, i) read D elements inner apart,
        written as x is laid out or channels-last; TP rows by TD work-items per work-group (LAYERNORM_AXIS_GROUP)."""
        x, scale, bias = node.inputs
        y, axis = node.outputs[0], node.attrs["axis"]
        outer, D = int(np.prod(x.shape[:axis], dtype=np.int64)), x.shape[axis]
        inner = int(np.prod(x.shape[axis + 1:], dtype=np.int64))
        ys = (D * inner, D, 1) if node.attrs["perm"] else (D * inner, 1, inner)  # (o, i, d) in y
        args = self.args(x) + self.args(scale) + self.args(bias) + self.args(y) + [
            np.int32(inner), np.int32(D), np.int64(D * inner), np.int64(inner)] + [np.int64(s) for s in ys] + [
            np.float32(node.attrs["epsilon"])]
        label = f"{node.name} {node.op}"
        if not self.dev.tiled:  # (the GPU form on PoCL too where the GPU cores run there: matrix_core="portable")
            src = defines({"TP": 1, "TD": 1, **half.half_defines(X=x, Y=y)}) + kernel_source("layernorm_axis")
            self.emit(src, "layernorm_axis_rows8", args, (max(-(-inner // 8), 1), max(outer, 1)), None, label)
            return
        tp, td = LAYERNORM_AXIS_GROUP
        tp = min(tp, 1 << max(0, (inner - 1).bit_length()))
        defs = {"TP": tp, "TD": td, **({"CL_OUT": 1} if node.attrs["perm"] else {}), **half.half_defines(X=x, Y=y)}
        self.emit(defines(defs) + kernel_source("layernorm_axis"), "layernorm_axis", args,
                  (-(-inner // tp) * tp, td, max(outer, 1)), (tp, td, 1), label)

    def roialign(self, node):
        x, rois, batch = node.inputs
        y, a = node.outputs[0], node.attrs
        src = f"#define ROI_{a['mode'].upper()} 1\n" + kernel_source("roialign")
        args = self.args(x) + self.args(rois) + self.args(batch) + self.args(y) + [
            np.int32(x.shape[1]), np.int32(x.shape[2]), np.int32(x.shape[3]), np.int32(a["output_height"]),
            np.int32(a["output_width"]), np.float32(a["spatial_scale"]), np.int32(a["sampling_ratio"]),
            np.int32(a["half_pixel"]), np.int64(y.size)]
        self.emit(src, "roialign", args, (max(y.size, 1),), None, f"{node.name} RoiAlign")

    def roialign_grad(self, node):
        dy, x, rois, batch = node.inputs
        dx, a = node.outputs[0], node.attrs
        self.fill(dx, 0)
        src = f"#define ROI_{a['mode'].upper()} 1\n" + kernel_source("roialign")
        args = self.args(dy) + self.args(x) + self.args(rois) + self.args(batch) + self.args(dx) + [
            np.int32(x.shape[1]), np.int32(x.shape[2]), np.int32(x.shape[3]), np.int32(a["output_height"]),
            np.int32(a["output_width"]), np.float32(a["spatial_scale"]), np.int32(a["sampling_ratio"]),
            np.int32(a["half_pixel"]), np.int64(dy.size)]
        self.emit(src, "roialign_grad", args, (max(dy.size, 1),), None, f"{node.name} RoiAlignGrad")

    def det(self, node):
        x, y = node.inputs[0], node.outputs[0]
        src = f"#define N {x.shape[-1]}\n" + kernel_source("det")
        self.emit(src, "det", self.args(x) + self.args(y) + [np.int64(y.size)], (max(y.size, 1),), None,
                f"{node.name} Det")
