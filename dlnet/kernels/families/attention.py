"""The fused attention kernels: softmax(q k^T * scale + mask) v with an online softmax, never the Tq x Tk scores.
attention.cl (algo "flash"): K/V tiles through __local memory, a work-group per (block of query rows, batch * head);
attention_cpu.cl (algo "flash_cpu", CPUs): a work-item per few query rows, keys from global memory, no barriers;
attention_mma.cl (the "flash" algo's tensor-core form, NVIDIA in tf32 and fp16 modes): both products on mma.sync;
K and V by cp.async (in half, read by ldmatrix) where their rows are 16-byte aligned (the IR tile's "/cp").
attention_grad.cl (AttentionGrad, algo "flash_grad"): the gradient, a work-item per query row (dq) then per key row
(dk, dv); on CPUs attention_grad_lanes.cl's 8 rows in vector lanes. attention_grad_mma.cl (algo "flash_grad_mma",
NVIDIA in tf32 and fp16 modes): FlashAttention-2's backward on mma.sync, 16 rows a warp."""
from dataclasses import dataclass

import numpy as np

from ...errors import ModelError
from ...graph.ops.attention import LOGICAL, MAX_RANK, lead4, logical_shape
from ...graph.ops.transformer import element_strides
from ..emitter import defines
from ..half import half_defines, tf32_defines
from ..runtime import kernel_source


@dataclass(frozen=True)
class AttentionTile:
    """BQ query rows per work-group, BK keys per K/V tile, an NTR x NTC grid of work-items."""
    bq: int
    bk: int
    ntr: int
    ntc: int

    @property
    def label(self):
        return f"{self.bq}x{self.bk}/{self.ntr}x{self.ntc}"

    def local_bytes(self, d, dv):
        """attention.cl's __local arrays: q rows, K or V rows, the scores' rows and the rows' partial maxima."""
        dp = d + 4 if d % 4 == 0 else d + 1
        return 4 * (self.bq * dp + self.bk * max(dp, dv + 1) + self.bq * (self.bk + 4) + self.bq * self.ntc)


# CPUs (attention_cpu.cl): query rows per work-item (each key read once for them; fewer where Tq is smaller, as in
# decoding) and keys per block of scores. 2 cores (EPYC, PoCL), 8 heads of 512 x 64, best of 12: 2 rows 56 ms, 4 rows
# 43, 8 rows 51 (the unfused products and softmax 74); 4 heads of 256 x 128: 15, 9.5, 10.3 (11.3).
CPU_ROWS, CPU_KEYS = 4, 16
# attention_cpu_rows: 8 query rows a work-item, one per float8 lane (where Tq has 8 rows; decoding keeps the above)
CPU_LANE_ROWS = 8
# attention_grad.cl: query rows (dq) or key rows (dk, dv) per work-item, RB. 2 cores (EPYC, PoCL), a causal layer of
# 12 heads of 512 x 64, batch 2, dq / dk dv kernel ms: 1 row 55 / 44, 4 rows 54 / 40, 8 rows 45 / 36 (local size 1;
# PoCL's default one: 64 / 59 at 1 row); where there are 8 query (key) rows, 8 in vector lanes instead
# (attention_grad_lanes.cl, Options.attention_cpu_lanes): 56.8 / 47.3 -> 16.2 / 15.9
# (bench/probes/attention_grad_cpu.py)
GRAD_ROWS = 8

# The tile per device kind: 4 x 4 scores a work-item and (a head dim of 128) 4 x 16 outputs in registers; CPUs
# (PoCL runs a work-group's work-items as loops between barriers) a grid of 64 work-items. Halved along the
# larger of BQ and BK while the tiles overflow __local memory (head dims past 128 on a 48 KiB GPU).
# GPUs: 64 query rows by 128 work-items (4 rows each). H200, kernel ms against PyTorch's fp32 SDPA in the same run
# (`python3 bench/probes/attention_tiles.py`), 32x32/8x8 -> 64x32/16x8: 16 x 12 x 197 x 64 0.170 -> 0.144 (PyTorch
# 0.117), 16 x 12 x 256 x 64 0.233 -> 0.184 (0.128), causal 0.206 -> 0.154 (0.107), 1 x 12 x 197 x 64 0.062 -> 0.048
# (0.048); 64x32/8x8 (8 rows each) spills: 0.204 at 197.
ATTENTION_TILES = {"gpu": AttentionTile(64, 32, 16, 8), "cpu": AttentionTile(32, 32, 8, 8)}
MIN_TILE = 8
# Decoding (at most DECODE_ROWS query rows, the power of two at least Tq): one row of 64 work-items over 64 keys,
# each scoring its key for every row and owning an output column; the 8 x 8 grid left 7 of its 8 rows idle. H100, a
# GPT-2-small step (12 heads, 136 keys, d 64): 0.049 ms a layer with the 32-row tile.
DECODE_ROWS, DECODE_KEYS = 8, 64
# NVIDIA in tf32 mode (attention_mma.cl): up to Options.attention_mma_warps warps of 16 query rows each per
# work-group (no more than the rows need), BK keys a tile (32 for head
# dims past 64, which keeps K and V^T in 48 KiB), for head dims that are multiples of 8 up to MMA_MAX_D
MMA_KEYS, MMA_MAX_D = 64, 128
# ... K and V by cp.async (KV_ASYNC) in tf32: 32 keys a tile (two stages of 32 hold what one of 64 did). H200, kernel
# ms (bench/probes/attention_mma.py, 4 warps), 64 -> 32 keys: 16 x 12 x 256 x 64 causal 0.0511 -> 0.0439, 16 x 12 x
# 197 x 64 0.0525 -> 0.0457 (through registers, 8 warps and 64 keys: 0.0742 and 0.0794). Head dims past 64 (32 keys
# already) keep 8 warps: 4 x 16 x 512 x 128 causal 0.1100 with 8, 0.1396 with 4 (fp16: 0.0535, 0.0531).
ASYNC_TF32_KEYS = 32
# attention_grad_mma.cl (AttentionGrad on NVIDIA's tensor cores in tf32 and fp16): up to GRAD_MMA_WARPS warps of 16
# rows a work-group, and the other side's rows BT a tile, the largest of GRAD_MMA_TILES whose __local tiles fit
GRAD_MMA_WARPS, GRAD_MMA_TILES = 4, (64, 32, 16)


def head_dims(node):
    """(D, DV) of an Attention or AttentionGrad node: q's (and k's) head dim and v's."""
    layout = node.attrs["layout"]
    return logical_shape(node.inputs[0].shape, layout[0])[-1], logical_shape(node.inputs[2].shape, layout[2])[-1]


def fused_grads(dev, options):
    """pipeline.training_import's attention_grads on dev: every Attention's gradient fused where
    Options.fused_attention_grad names the device's kind, else those that run on the tensor cores
    (attention_grad_mma.cl)."""
    if dev.kind in options.fused_attention_grad:
        return True
    return lambda node: grad_mma_tile(dev, options, *head_dims(node)) is not None


def grad_mma_tile(dev, options, d, dv):
    """BT of attention_grad_mma.cl for head dims d (q, k) and dv (v) on dev (fp16: f16 products, else tf32), or None
    where it does not run (Options.mma_emulate: on any device, its PTX emulated)."""
    f16 = dev.half_storage
    nvidia = dev.is_nvidia and not dev.is_cpu and (dev.tensor_cores or f16)
    if not options.attention_grad_mma or not (nvidia or options.mma_emulate):
        return None
    step, size = (16, 2) if f16 else (8, 4)
    if d % step or dv % step or max(d, dv) > MMA_MAX_D:
        return None
    pad = lambda n: n if n // 8 % 2 else n + 8  # noqa: E731 (attention_grad_mma.cl's PAD)
    for bt in GRAD_MMA_TILES:  # (the dk dv kernel's tiles: q and dy by rows and transposed, two floats a row)
        if bt % step == 0 and size * (bt * (pad(d) + pad(dv)) + (d + dv) * pad(bt)) + 8 * bt <= dev.local_mem:
            return bt
    return None


def ptx_source(options):
    """The tensor-core attention kernels' helpers: mma_tf32.cl, then ptx_lanes.cl (or, Options.mma_emulate, mma_emu.cl's
    emulation of its PTX for tests)."""
    return kernel_source("mma_tf32") + kernel_source("mma_emu" if options.mma_emulate else "ptx_lanes")


def mma_tile(dev, options, d, dv, tq, f16=False):
    """(warps, keys a tile) of attention_mma.cl for these head dims and query rows (f16: q, k, v in half, precision
    "fp16"; else float in "tf32" or "fp16"), or None where it does not run."""
    if not ((dev.tensor_cores or (dev.is_nvidia and dev.half_storage) or dev.mma and options.mma_emulate)
            and options.attention_mma
            and d % (16 if f16 else 8) == 0 and dv % 8 == 0 and max(d, dv) <= MMA_MAX_D and tq > DECODE_ROWS):
        return None
    return min(options.attention_mma_warps, -(-tq // 16)), MMA_KEYS if max(d, dv) <= 64 else MMA_KEYS // 2


def attention_tile(dev, d, dv, tiles=ATTENTION_TILES, tq=None):
    """The tile of a head dim d (q, k) and dv (v) on `dev` (kernels/device.Device) for tq query rows (None: many),
    shrunk to its __local memory."""
    t = tiles[dev.kind]
    if tq is not None and tq <= DECODE_ROWS:
        decode = AttentionTile(1 << max(tq - 1, 0).bit_length(), DECODE_KEYS, 1, DECODE_KEYS)
        if decode.local_bytes(d, dv) <= dev.local_mem:
            return decode
    bq, bk = t.bq, t.bk
    while AttentionTile(bq, bk, t.ntr, t.ntc).local_bytes(d, dv) > dev.local_mem:
        if bk >= bq and bk > max(MIN_TILE, t.ntc):
            bk //= 2
        elif bq > max(MIN_TILE, t.ntr):
            bq //= 2
        else:
            raise ModelError(f"attention with head dims {d} / {dv}: its smallest tile needs "
                             f"{AttentionTile(bq, bk, t.ntr, t.ntc).local_bytes(d, dv)} bytes of __local memory, "
                             f"the device has {dev.local_mem}")
    return AttentionTile(bq, bk, t.ntr, t.ntc)


def mask_strides(mask, scores):
    """Element strides of `mask` over the scores [B, Hq, Tq, Tk] it broadcasts to (0 along broadcast dims)."""
    shape = (1,) * (MAX_RANK - mask.rank) + tuple(mask.shape)
    strides, step = [0] * MAX_RANK, 1
    for a in reversed(range(MAX_RANK)):
        strides[a] = step if shape[a] == scores[a] and shape[a] > 1 else 0
        step *= shape[a]
    return strides


def operand_strides(shape, layout, stored=None):
    """Element strides of the b, h and t axes of an operand of this stored shape and layout (kernels/cl/attention.cl's
    qsb, qsh, qst), its last axis contiguous. stored: its element strides where they are not contiguous (a column
    block of the Q, K, V projections' one product: graph/ops/transformer.py element_strides)."""
    shape = (1,) * (MAX_RANK - len(shape)) + tuple(shape)
    strides, step = [0] * MAX_RANK, 1
    for a in reversed(range(MAX_RANK)):
        strides[a], step = step, step * shape[a]
    if stored is not None:
        strides = strides[:MAX_RANK - len(stored)] + list(stored)
    return [strides[layout.index(c)] for c in LOGICAL[:3]]


def attention_geometry(node, q, k, v, mask):
    """(B, Hq, Hk, Tq, Tk, D, DV, defines, mask strides) that attention.cl's and attention_grad.cl's kernels share."""
    a = node.attrs
    qs, ks, vs = (logical_shape(x.shape, s) for x, s in zip((q, k, v), a["layout"], strict=False))
    (B, Hq), (_, Hk) = lead4(qs), lead4(ks)
    Tq, D, Tk, DV = qs[-2], qs[-1], ks[-2], vs[-1]
    # (MASK: 0 none, 1 float added, 2 bool; SOFTCAP: the forward's tanh cap, never in AttentionGrad)
    defs, strides = {"D": D, "DV": DV, "CAUSAL": int(bool(a["causal"])), "MASK": 0, "MASK_T": "float",
                     "SOFTCAP": int(a.get("softcap", 0.0) > 0)}, [0, 0, 0, 0]
    if mask is not None:
        defs.update({"MASK": 2, "MASK_T": "uchar"} if mask.dtype == "bool" else {"MASK": 1})
        strides = mask_strides(mask, (B, Hq, Tq, Tk))
    return B, Hq, Hk, Tq, Tk, D, DV, defs, strides


class AttentionFamily:
    def attention(self, node):
        """Attention by its scheduled algorithm: flash_cpu (attention_cpu.cl) or flash (attention.cl)."""
        q, k, v = node.inputs[:3]
        mask = node.inputs[3] if len(node.inputs) > 3 else None
        y, a = node.outputs[0], node.attrs
        if q.dtype not in ("float32", "float16"):  # (float16: half storage, precision "fp16")
            raise ModelError(f"node {node.name} (Attention): float32 only, got {q.dtype}")
        layout = a["layout"]
        B, Hq, Hk, Tq, Tk, D, DV, defs, strides = attention_geometry(node, q, k, v, mask)
        defs.update(**half_defines(Q=q, K=k, V=v, Y=y), **tf32_defines(node))
        steps = [operand_strides(x.shape, lay, element_strides(x)) for x, lay in zip((q, k, v, y), layout, strict=True)]
        args = self.args(q) + self.args(k) + self.args(v) + (self.args(mask) if mask is not None else self.dummy()) \
            + self.args(y) + [np.int32(Tq), np.int32(Tk), np.int32(Hq), np.int32(Hk), np.float32(a["scale"]),
                              np.float32(a["softcap"]), np.int32(a["causal_offset"])] + [np.int64(s) for s in strides] \
            + [np.int64(s) for st in steps for s in st]
        label = f"{node.name} Attention"
        if node.schedule["algo"] == "flash_cpu":  # (schedule.py; Lowerer.lower makes sure there is one)
            rows = max(1, min(CPU_ROWS, Tq))
            defs.update(RQ=rows, BK=CPU_KEYS)
            lanes = Tq >= CPU_LANE_ROWS and self.options.attention_cpu_lanes
            self.record_tile(f"{CPU_LANE_ROWS}x{CPU_KEYS}/lanes" if lanes else f"{rows}x{CPU_KEYS}")
            src = "".join(kernel_source(f) for f in ("cpu_math", "attention_rows", "attention_cpu"))
            self.emit(defines(defs) + src, "attention_cpu_rows" if lanes else "attention_cpu", args,
                      (max(-(-Tq // (CPU_LANE_ROWS if lanes else rows)), 1), B * Hq), (1, 1), label)
            return
        halves = [x.dtype == "float16" for x in (q, k, v)]
        mma = mma_tile(self.dev, self.options, D, DV, Tq, all(halves)) if all(halves) or not any(halves) else None
        if mma is not None:
            warps, bk = mma
            e = 8 if all(halves) else 4  # (elements in 16 bytes: K's and V's rows by cp.async; y's half pairs)
            k_ok, v_ok, y_ok = (all(int(n) % m == 0 for n in [self.args(x)[1]] + st)
                                for x, st, m in zip((k, v, y), steps[1:], (e, e, 2), strict=True))
            copies = (DV % 16 == 0 or not all(halves)) and k_ok and v_ok and self.options.attention_async
            if copies and max(D, DV) <= 64:  # (past 64, 32 keys a tile and 8 warps: ASYNC_TF32_KEYS)
                warps = min(warps, self.options.attention_async_warps)
                bk = bk if all(halves) else min(bk, ASYNC_TF32_KEYS)
            defs.update(WARPS=warps, BK=bk, **({"F16": 1} if all(halves) else {}))
            defs.update({"KV_ASYNC": 1} if copies else {}, **({"Y_PAIRS": 1} if "Y_HALF" in defs and y_ok else {}))
            self.record_tile(f"mma{16 * warps}x{bk}" + ("/cp" if copies else ""))
            self.emit(defines(defs) + ptx_source(self.options) + kernel_source("tf32_store") +
                      kernel_source("attention_mma"), "attention_mma", args,
                      (max(-(-Tq // (16 * warps)), 1) * 32 * warps, B * Hq), (32 * warps, 1), label)
            return
        tile = attention_tile(self.dev, D, DV, tq=Tq)
        defs.update(BQ=tile.bq, BK=tile.bk, NTR=tile.ntr, NTC=tile.ntc)
        nt = tile.ntr * tile.ntc
        blocks = max(-(-Tq // tile.bq), 1)
        tiles = -(-Tk // tile.bk)
        splits = min(tiles, self.options.attention_decode_splits) if Tq <= DECODE_ROWS and tile.ntr == 1 else 1
        if splits > 1:  # decoding: the key tiles shared out in runs of `per`, their partials merged by the last run
            per = -(-tiles // splits)
            splits = -(-tiles // per)
            defs["SPLITS"] = splits
            self.record_tile(f"{tile.label}/s{splits}")
            self.emit(defines(defs) + kernel_source("tf32_store") + kernel_source("attention"), "attention", args + [
                self.dummy()[0], np.int32(per * tile.bk), self.state(B * Hq * blocks)],
                (blocks * splits * nt, B * Hq), (nt, 1), label)
            self.use_scratch(self.launches[-1].kernel, len(args), 4 * B * Hq * Tq * splits * (DV + 2), "work")
            return
        self.record_tile(tile.label)
        self.emit(defines(defs) + kernel_source("tf32_store") + kernel_source("attention"), "attention", args,
                  (blocks * nt, B * Hq), (nt, 1), label)

    def attention_grad(self, node):
        """AttentionGrad: two kernels, dq (and each query row's statistics) then dk and dv: attention_grad_mma.cl's
        on the tensor cores (algo flash_grad_mma), else attention_grad.cl's."""
        q, k, v, y, dy = node.inputs[:5]
        mask = node.inputs[5] if len(node.inputs) > 5 else None
        dq, dk, dv, stats = node.outputs
        a = node.attrs
        layout = a["layout"]
        B, Hq, Hk, Tq, Tk, D, DV, defs, strides = attention_geometry(node, q, k, v, mask)
        bt = grad_mma_tile(self.dev, self.options, D, DV) if node.schedule.get("algo") == "flash_grad_mma" else None
        of = {x.id: [np.int64(s) for s in operand_strides(x.shape, lay, element_strides(x))]
              for x, lay in zip((q, k, v, y, dy, dq, dk, dv), layout + layout[3:] + layout[:3], strict=True)}
        if bt is not None:
            warps = min(GRAD_MMA_WARPS, max(-(-max(Tq, Tk) // 16), 1))
            defs.update(WARPS=warps, BT=bt, **({"F16": 1} if self.dev.half_storage else {}))
            defs.update({f"{tag}_H": int(x.dtype == "float16") for tag, x in
                         zip(("Q", "K", "V", "Y", "G", "GQ", "GK", "GV"), (q, k, v, y, dy, dq, dk, dv), strict=True)})
            # f16 tiles by cp.async where q, k, v and dy are half, their rows 16-byte aligned
            copies = self.dev.half_storage and self.options.attention_async and all(
                x.dtype == "float16" and all(int(n) % 8 == 0 for n in [self.args(x)[1]] + of[x.id])
                for x in (q, k, v, dy))
            defs.update({"GA": 1} if copies else {})
            src = defines(defs) + ptx_source(self.options) + kernel_source("attention_grad_mma")
            self.record_tile(f"mma{16 * warps}x{bt}" + "/cp" * copies)
            local = (32 * warps, 1)  # (a work-group per 16 warps rows of each side)
            sizes = [max(-(-t // (16 * warps)), 1) * 32 * warps for t in (Tq, Tk)]
            names = ("attention_grad_mma_q", "attention_grad_mma_kv")
        else:
            rows = GRAD_ROWS if self.dev.is_cpu else 1  # (GPUs: one row's chunks a work-item, in registers)
            # CPUs: 8 rows in vector lanes where there are 8 query (key) rows (attention_grad_lanes.cl)
            lanes_q, lanes_kv = (self.dev.is_cpu and self.options.attention_cpu_lanes and t >= CPU_LANE_ROWS
                                 for t in (Tq, Tk))
            defs["RB"] = rows
            self.record_tile("/".join(("lanes" if f else f"{rows}") for f in (lanes_q, lanes_kv)))
            src = defines(defs) + "".join(kernel_source(f) for f in ("cpu_math", "attention_rows", "attention_grad") +
                                          (("attention_grad_lanes",) if lanes_q or lanes_kv else ()))
            local = (1, 1) if self.dev.is_cpu else None  # (PoCL: no work-item loops around the rows' private arrays)
            sizes = [max(-(-t // (CPU_LANE_ROWS if f else rows)), 1) for t, f in ((Tq, lanes_q), (Tk, lanes_kv))]
            names = ("attention_grad_q" + "_lanes" * lanes_q, "attention_grad_kv" + "_lanes" * lanes_kv)
        head = [np.int32(Tq), np.int32(Tk), np.int32(Hq), np.int32(Hk), np.float32(a["scale"]),
                np.int32(a["causal_offset"])] + [np.int64(s) for s in strides]
        m = self.args(mask) if mask is not None else self.dummy()
        label = f"{node.name} AttentionGrad"
        self.emit(src, names[0], self.args(q) + self.args(k) + self.args(v) +
                  self.args(y) + self.args(dy) + m + self.args(dq) + self.args(stats) + head +
                  [s for x in (q, k, v, y, dy, dq) for s in of[x.id]], (sizes[0], B * Hq), local, label + " dq")
        self.emit(src, names[1], self.args(q) + self.args(k) + self.args(v) +
                  self.args(dy) + m + self.args(stats) + self.args(dk) + self.args(dv) + head +
                  [s for x in (q, k, v, dy, dk, dv) for s in of[x.id]], (sizes[1], B * Hk), local, label + " dk dv")
