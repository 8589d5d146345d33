"""The fused attention kernel (attention.cl): softmax(q k^T * scale + mask) v with an online softmax over K/V tiles
in __local memory, never the Tq x Tk scores."""
from dataclasses import dataclass

import numpy as np

from ...errors import ModelError
from ...graph.ops.attention import MAX_RANK, lead4
from ..emitter import defines
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
        return 4 * (self.bq * (d + 1) + self.bk * (max(d, dv) + 1) + self.bq * (self.bk + 1))


# The tile per device kind: GPUs take 64 work-items of 4 x 4 scores each and (a head dim of 128) 4 x 16 outputs in
# registers; CPUs (PoCL runs a work-group's work-items as loops between barriers) the same grid. Halved along the
# larger of BQ and BK while the tiles overflow __local memory (head dims past 128 on a 48 KiB GPU).
ATTENTION_TILES = {"gpu": AttentionTile(32, 32, 8, 8), "cpu": AttentionTile(32, 32, 8, 8)}
MIN_TILE = 8


def attention_tile(dev, d, dv, tiles=ATTENTION_TILES):
    """The tile of a head dim d (q, k) and dv (v) on `dev` (kernels/device.Device), shrunk to its __local memory."""
    t = tiles[dev.kind]
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


class AttentionFamily:
    def attention(self, node):
        q, k, v = node.inputs[:3]
        mask = node.inputs[3] if len(node.inputs) > 3 else None
        y, a = node.outputs[0], node.attrs
        if q.dtype != "float32":
            raise ModelError(f"node {node.name} (Attention): float32 only, got {q.dtype}")
        (B, Hq), (_, Hk) = lead4(q.shape), lead4(k.shape)
        Tq, D, Tk, DV = q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
        tile = attention_tile(self.dev, D, DV)
        defs = {"D": D, "DV": DV, "BQ": tile.bq, "BK": tile.bk, "NTR": tile.ntr, "NTC": tile.ntc,
                "CAUSAL": int(bool(a["causal"])), "SOFTCAP": int(a["softcap"] > 0)}
        strides = [0, 0, 0, 0]
        if mask is not None:
            defs["MASK"] = 2 if mask.dtype == "bool" else 1
            strides = mask_strides(mask, (B, Hq, Tq, Tk))
        args = self.args(q) + self.args(k) + self.args(v) + (self.args(mask) if mask is not None else self.dummy()) \
            + self.args(y) + [np.int32(Tq), np.int32(Tk), np.int32(Hq), np.int32(Hk), np.float32(a["scale"]),
                              np.float32(a["softcap"]), np.int32(a["causal_offset"])] + [np.int64(s) for s in strides]
        blocks = -(-Tq // tile.bq)
        nt = tile.ntr * tile.ntc
        self.record_tile(tile.label)
        self.emit(defines(defs) + kernel_source("attention"), "attention", args, (max(blocks, 1) * nt, B * Hq),
                  (nt, 1), f"{node.name} Attention")
