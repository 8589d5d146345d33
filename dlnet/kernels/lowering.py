"""Lowering: each node of a planned graph becomes kernel launches with arguments bound once."""
import os
from dataclasses import dataclass

import numpy as np

from . import codegen
from .runtime import DTYPE_TO_C, Deferred, Launch, PendingKernel, cl, kernel_source
from ..errors import ModelError
from ..graph.ir import BatchSlice, Node

# How matrix-shaped kernels (conv as implicit GEMM, gemm) are blocked, per device class. GPUs use the tiled core
# (__local tiles, WM x WN outputs per work-item); CPUs the register-blocked core (RM x CN outputs per work-item,
# no barriers), which PoCL ran 10-25x faster than the tiled one on 2 Xeon cores (3.8 against 0.05-0.3 GFLOP/s).
# "tf32" is the tensor-core core for NVIDIA devices in precision="tf32" (inline PTX mma.sync); small or narrow
# problems stay on the fp32 core.
GEMM_TILES = {
    # measured on an H100 (bench/RESULTS.md, `bench/gpu.py --tiles`, `bench/gpu_kernels.py --tiles`): 128x128 with
    # 8x8 per work-item 34 TFLOP/s at TK=8 against 27 at TK=16 (fewer prefetch registers); 64x64 with 8x4 per
    # work-item (128 work-items) beats 4x4 (256) on long K, 4x4 wins on short K (GPU_TILE_MODEL picks per layer)
    "gpu": {"core": "gemm_core", "huge": dict(TM=128, TN=128, TK=8, WM=8, WN=8),
            "wide": dict(TM=64, TN=128, TK=8, WM=8, WN=8),
            "mid": dict(TM=64, TN=64, TK=8, WM=8, WN=4), "big": dict(TM=64, TN=64, TK=8, WM=4, WN=4),
            "narrow_m": dict(TM=16, TN=64, TK=16, WM=2, WN=4), "narrow_n": dict(TM=64, TN=16, TK=16, WM=4, WN=2)},
    "tf32": {"core": "gemm_mma", "huge": dict(TM=128, TN=128, TK=16, WARPS_M=2, WARPS_N=2),
             "big": dict(TM=64, TN=64, TK=16, WARPS_M=2, WARPS_N=2),
             # products of at most 64 rows, many columns and K >= 256 (64-channel convolutions): warps of 64 x 32,
             # not the big tile's 32 x 32, so fewer fragment reads per mma (H200, vgg16 b16 features.2: 0.925 ->
             # 0.874 ms; features.0, K = 27, lost: 0.27 -> 0.34)
             "wide": dict(TM=64, TN=128, TK=16, WARPS_M=1, WARPS_N=4),
             # the big tile's place for products of at least 128 rows and depth 512 whose slices of 32 are whole
             # (plain products, 1x1 convolutions, tap-major ones of 32k channels): twice the depth per barrier and per
             # window-table entry, twice the rows per fetched B column. H100 batch 16, kernel ms against 64x64x16
             # (`bench/probes/tf32_tiles.py`): alexnet features.6 0.083 -> 0.060, resnet50's 3x3 stride-2 layers
             # 0.072 / 0.121 / 0.114 -> 0.058 / 0.083 / 0.088, its 1x1 layers on 7x7 0.045 / 0.038 -> 0.042 / 0.033;
             # 256 -> 512 1x1 at 14x14 (depth 256) lost, 0.020 -> 0.028. Three stages: four would hold one per SM.
             "tall": dict(TM=128, TN=64, TK=32, WARPS_M=2, WARPS_N=2, STAGES=3),
             # the huge tile's place where 96 rows pad M less than 128 do: alexnet features.3 (192 output channels,
             # two tiles of 128 rows = 256) 0.134 -> 0.112 ms
             "huge96": dict(TM=96, TN=128, TK=16, WARPS_M=2, WARPS_N=2)},
    "cpu": {"core": "gemm_vec", "huge": dict(RM=8), "big": dict(RM=8), "narrow_m": dict(RM=1), "narrow_n": dict(RM=8)},
}
# experiments: a tf32 tile as 'TM,TN,TK,WARPS_M,WARPS_N', DLNET_TF32_TILE_HUGE / _BIG / _WIDE (DLNET_TF32_TILES: huge)
for _shape in GEMM_TILES["tf32"]:
    _spec = os.environ.get(f"DLNET_TF32_TILE_{_shape.upper()}") or \
        (os.environ.get("DLNET_TF32_TILES") if _shape == "huge" else None)
    if _spec:
        GEMM_TILES["tf32"][_shape] = dict(zip(["TM", "TN", "TK", "WARPS_M", "WARPS_N"], map(int, _spec.split(","))))
# tf32 programs' build options: DLNET_TF32_MAXREG=N caps registers per work-item (NVIDIA -cl-nv-maxrregcount)
TF32_OPTIONS = (f"-cl-nv-maxrregcount={os.environ['DLNET_TF32_MAXREG']}",) if os.environ.get("DLNET_TF32_MAXREG") \
    else ()
# tf32: slices of K in the cp.async pipeline (gemm_mma.cl), at least 2; DLNET_TF32_STAGES sets every tile's
TF32_STAGES = max(2, int(os.environ.get("DLNET_TF32_STAGES", "4")))
for _t in GEMM_TILES["tf32"].values():
    if isinstance(_t, dict) and ("STAGES" not in _t or "DLNET_TF32_STAGES" in os.environ):
        _t["STAGES"] = TF32_STAGES
# tf32: the tall and huge96 tiles (DLNET_TF32_TALL=0: big and huge instead, as before); the tall one only where its
# grid is under this many waves of one work-group per compute unit (DLNET_TF32_TALL_WAVES)
TF32_TALL = os.environ.get("DLNET_TF32_TALL", "1") != "0"
TF32_TALL_WAVES = float(os.environ.get("DLNET_TF32_TALL_WAVES", "1e9"))
TF32_WIDE = os.environ.get("DLNET_TF32_WIDE", "1") != "0"
# tf32: products shallower than this stay on the fp32 core (experiments; vgg16's first layer, K = 27, took 0.27 ms
# either way on an H200)
TF32_MIN_K = int(os.environ.get("DLNET_TF32_MIN_K", "0"))
# ... and products of a depth in [lo, hi) too (DLNET_TF32_FP32_K=lo,hi): shallow and memory-bound, they ran faster on
# the fp32 core's smaller tiles (H100, resnet50 tf32 b16 kernel time, its 1x1 convolutions of K = 64 and 128: 3.80 ms
# all on the tf32 core, 3.54 with K in [32, 200) on the fp32 one; from K = 300 up 3.91; vgg16's first layer, K = 27,
# lost 0.17 ms on it)
TF32_FP32_K = tuple(int(v) for v in os.environ.get("DLNET_TF32_FP32_K", "32,200").split(","))
# fp32 core on NVIDIA: slices of K in a cp.async pipeline (gemm_core.cl's STAGES; 0: fetched through registers, the
# portable path every other device takes). H100, 128x128x8 tiles, GEMM n = 2048/4096/8192 (bench/probes/
# fp32_stages.py): through registers 29.4/31.8/32.6 TFLOP/s; 3 stages 37.9/41.1/42.2, against cuBLAS 47.7/51.2/51.4;
# 2 and 4 stages within 2% of 3; TK=16 no better (37.0/39.4/41.6 at 3 stages)
FP32_STAGES = int(os.environ.get("DLNET_FP32_STAGES", "3"))
FP32_TK = int(os.environ.get("DLNET_FP32_TK", "0"))  # experiments: TK of every fp32 GPU tile
# How the fp32 GPU tiles run, for picking one per layer: work-groups resident per compute unit, the device's rate in
# TFLOP/s with every unit full, and a fixed cost per tile in units of K (prologue, epilogue). These are the H100's
# entry in the tuner's database (tuner.DATABASE): fitted by least squares to every convolution of vgg16 and resnet50
# at batch 16 on an H100 (`bench/gpu_kernels.py --tiles ...`, median error of the fit 7-16%). Other GPUs are measured
# on first use (tuner.tile_model, cached in DLNET_CACHE/tune); with DLNET_TUNE=0 they take these values too. A layer
# takes the tile with the least estimated time: whole waves of work-groups, each wave costing per_cu tiles of
# TM x TN x (K + k0) at `rate` (a grid short of one wave costs one: split-K fills it).
GPU_TILE_MODEL = {"huge": dict(per_cu=2, rate=31.0, k0=26), "mid": dict(per_cu=4, rate=24.4, k0=35),
                  "big": dict(per_cu=4, rate=21.7, k0=18)}
# 64 x 128 with 8 x 8 per work-item (128 work-items): the huge tile's inner loop for layers of 64 or 192 output
# channels, which fill half or three quarters of a 128-row tile (DLNET_WIDE_TILE=0: not used)
if os.environ.get("DLNET_WIDE_TILE", "1") != "0":
    GPU_TILE_MODEL["wide"] = dict(per_cu=4, rate=29.0, k0=26)


def tile_estimate(shape, M, N, K, batches, compute_units, tile_model):
    """Relative time of an M x N x K product (`batches` of them) on GEMM_TILES["gpu"][shape], by a tile model
    (GPU_TILE_MODEL's form: tuner.tile_model)."""
    t, model = GEMM_TILES["gpu"][shape], tile_model[shape]
    groups = -(-M // t["TM"]) * -(-N // t["TN"]) * batches
    waves = -(-groups // (model["per_cu"] * compute_units))  # a grid short of one wave is split along K later
    if TILE_PER_SM and waves == 1:  # one wave: the busiest compute unit's share of it
        waves = -(-groups // compute_units) / model["per_cu"]
    return waves * model["per_cu"] * t["TM"] * t["TN"] * (K + model["k0"]) / model["rate"]


TILE_PER_SM = os.environ.get("DLNET_TILE_PER_SM", "0") != "0"


GPU_CORES = ("gemm_core", "gemm_mma")

# Products of at most this many rows (fully connected layers at small batches) run as gemv.cl where B's columns are
# contiguous along k: bound by reading B. H100 (probe of 6 configs, kernel time): 1 x 4096 x 25088 0.143 ms (2.9
# TB/s) against the GEMM core's 0.518 and cuBLAS's 0.159; 4 x 4096 x 9216 0.059 against 0.200 and 0.095; at 16 rows
# it lost (0.98 against the core's 0.63: every row of A is re-read per column group). Its work-groups: LK
# work-items along k times LN column groups of NC columns. Products of GEMV_REG_ROWS < M <= GEMV_MAX_ROWS rows run as
# gemv_rows.cl instead (A's rows from __local memory, split-K); device_passes keeps B as it comes (transB=1) for all
# of them. DLNET_GEMV_MAX_ROWS=8: the GEMM core (B pretransposed) above 8 rows, as before gemv_rows.cl.
GEMV_MAX_ROWS = int(os.environ.get("DLNET_GEMV_MAX_ROWS", "32"))
GEMV_REG_ROWS = 8
GEMV_TILES = tuple(int(v) for v in os.environ.get("DLNET_GEMV", "64,2,2").split(","))
# gemv_rows.cl per largest row count: LK lanes along k x LN column groups of NC columns per work-group, chunks of KC
# floats of K (A's rows for a chunk in __local memory: MR x KC floats), work-groups resident per compute unit for
# the split-K choice (registers: about MR x NC accumulators + 4 NC per work-item), and pf: the next chunk of A read
# ahead into registers (PREFETCH_A, where the chunk is whole float4s per work-item); DLNET_GEMV_ROWS=
# 'LK,LN,NC,KC,per_cu[,pf]' sets one config for every row count. H100 (`python3 bench/gpu_gemv.py --rows
# [--prefetch]`, kernel time with B out of L2, ms; cuBLAS in brackets): 16 rows, 8,16,4,512,2 with pf against the
# earlier 8,16,4,256,3 without: x 4096 x 25088 0.179 / 0.196 (0.231), x 9216 0.080 / 0.085 (0.106), x 4096 0.044
# / 0.050 (0.061), 1000 x 4096 0.021 / 0.021 (0.049); 32 rows, 16,16,4,256,2 with pf: 0.272 / 0.360 (0.242), 0.115
# / 0.144 (0.102), 0.063 / 0.082 (0.056), 0.028 / 0.024 (0.028); 12 rows x 9216: 8,16,4,128,3 with pf 0.080 / 0.085,
# the 16-row config 0.098
GEMV_ROWS_TILES = {12: dict(LK=8, LN=16, NC=4, KC=128, per_cu=3, pf=1),
                   16: dict(LK=8, LN=16, NC=4, KC=512, per_cu=2, pf=1),
                   32: dict(LK=16, LN=16, NC=4, KC=256, per_cu=2, pf=1)}
if os.environ.get("DLNET_GEMV_ROWS"):
    GEMV_ROWS_TILES = {GEMV_MAX_ROWS: dict(zip(["LK", "LN", "NC", "KC", "per_cu", "pf"],
                                               (int(v) for v in os.environ["DLNET_GEMV_ROWS"].split(","))))}
# tf32 mode on NVIDIA: gemv_mma.cl in place of gemv_rows.cl, WARPS warps of NBW blocks of 8 columns per work-group,
# chunks of KC floats of K, per_cu work-groups resident per compute unit for the split-K choice; DLNET_GEMV_MMA=
# 'WARPS,NBW,KC,per_cu' sets it, 0 turns it off. H100 (`python3 bench/gpu_gemv.py --rows --mma`, kernel ms, B out of
# memory; gemv_rows.cl's fp32 table in brackets): 16 x 4096 x 25088 0.158 (0.180), x 9216 0.070 (0.079), x 4096
# 0.040 (0.044), 16 x 1000 x 4096 0.017 (0.021); 32 rows 0.165 / 0.073 / 0.041 / 0.018 (0.271 / 0.116 / 0.063 /
# 0.028). Eight configs came within 3% at 16 rows; at 32 rows this one led by 5-12%. B streams at about 3 TB/s:
# the times fit 18 us + bytes / 3.0 TB/s (the 18 us: the flush's dirty lines leaving L2, cuBLAS's too).
GEMV_MMA = {"WARPS": 8, "NBW": 1, "KC": 64, "per_cu": 2}
if os.environ.get("DLNET_GEMV_MMA"):
    GEMV_MMA = None if os.environ["DLNET_GEMV_MMA"] == "0" else dict(
        zip(["WARPS", "NBW", "KC", "per_cu"], (int(v) for v in os.environ["DLNET_GEMV_MMA"].split(","))))
# gemv_rows.cl's slices of K: 0 picks them (whole waves of resident work-groups), else this many (at most one per
# chunk); DLNET_GEMV_ROWS_SPLITS
GEMV_ROWS_SPLITS = int(os.environ.get("DLNET_GEMV_ROWS_SPLITS", "0"))

# Winograd F(2x2, 3x3) for 3x3 stride-1 convolutions with at least this many channels in and out (0: never). On an
# H100 at batch 16 (bench/gpu_kernels.py) 64 beat 128 and 256 on vgg16, resnet18 and resnet50: the transforms' memory
# traffic (V and M are 4x the input and output) costs less than the 2.25x fewer products save.
WINOGRAD_MIN_CHANNELS = int(os.environ.get("DLNET_WINOGRAD_MIN_CHANNELS", 64))
# ... and at least this many in tf32 on NVIDIA, where the products run 3x faster and the transforms' traffic weighs
# more: vgg16 tf32 batch 16 on an H100 (kernel ms, direct against Winograd's products alone): 64 channels at 224x224
# 0.98 against 8 chunks of 0.19; 512 at 28x28 0.81 against 0.28. Whole net, ratio to PyTorch TF32: Winograd from 64
# channels 0.60, from 256 0.74, never 0.63
WINOGRAD_MIN_CHANNELS_TF32 = int(os.environ.get("DLNET_WINOGRAD_MIN_CHANNELS_TF32", 256))
# F(4x4, 3x3) (36 products per 4x4 outputs, 4x fewer multiplications than the direct product, against F(2x2, 3x3)'s
# 2.25x) in tf32 inference where it does at most 0.8 of F(2x2)'s products (passes/winograd.py f4_pays) on at least
# WINOGRAD_F4_MIN_TILES 4x4 tiles: its U takes 36/9 of the weights' memory (F(2x2) 16/9), which smaller layers do not
# repay (resnet18 tf32 b16 planned 216 MiB against PyTorch's 194 with F(4x4) everywhere, no faster). Its error per
# layer with tf32 products is 2.0e-3 against 4.9e-4 for F(2x2). DLNET_WINOGRAD_M / _M_TF32: 2 or 4, per mode.
WINOGRAD_M = int(os.environ.get("DLNET_WINOGRAD_M", 2))
WINOGRAD_M_TF32 = int(os.environ.get("DLNET_WINOGRAD_M_TF32", 4))
WINOGRAD_F4_MIN_TILES = int(os.environ.get("DLNET_WINOGRAD_F4_MIN_TILES", 512))
# Its transformed tiles (V: 16 C, M: 16 K floats per 2x2 output tile) live in the activation arena, in whatever
# free block the planner finds there at that layer (Conv.workspace); where none holds them all, the layer runs in
# chunks of tiles (three launches each), each at least this many tiles and an eighth of the layer's (the arena grows
# where no free block holds that much).
WINOGRAD_MIN_TILES = 1024
# ... in training too (DLNET_WINOGRAD_TRAINING=0: not), for convolutions and their input gradients ...
WINOGRAD_TRAINING = os.environ.get("DLNET_WINOGRAD_TRAINING", "1") != "0"
# ... weight gradients included (DLNET_WINOGRAD_DW=0: they keep the implicit GEMM) ...
WINOGRAD_DW = os.environ.get("DLNET_WINOGRAD_DW", "1") != "0"
# ... and for layers of at least this many 2x2 output tiles (the N of its products): smaller ones gain little (vgg16
# at batch 1 on an H100, kernel time: 14x14 layers, 49 tiles, 0.052 against 0.075 ms direct) and U takes 16/9 of
# the weights' memory (vgg16's batch-1 plan came to 609 MiB against PyTorch's 586 with Winograd everywhere).
WINOGRAD_MIN_LAYER_TILES = int(os.environ.get("DLNET_WINOGRAD_MIN_LAYER_TILES", 256))


# CPU pooling (pool_cpu.cl): a work-item takes rows of about this many outputs (at least one row)
POOL_CPU_ROWS = int(os.environ.get("DLNET_POOL_CPU_ROWS", 64))
# Long reductions (Reduce): on GPUs a work-group of this many work-items per output (0: one work-item), and where
# that leaves the device short of work, several work-groups per output, enough for this many per compute unit
REDUCE_GROUP = {"cpu": 0, "gpu": 256}
# CPUs: accumulators per output of a reduction, each over every REDUCE_LANES-th element (codegen.reduce_source)
REDUCE_LANES = 4
REDUCE_GROUPS_PER_CU = 8


# GPU inference: where a graph input of at least INPUT_CHUNK_MIN_BYTES is read by one node alone, that node and the
# chain of nodes after it (chunked_prefix) run over INPUT_CHUNKS slices of the batch, slice after slice, each slice's
# launches awaiting only its slice's upload (Plan.run uploads such an input in chunks on a second queue): the upload
# overlaps the first layers. H100 (`bench/probes/overlap.py`): 9.6 MB from pinned memory 0.20 ms, then 4 kernels
# 0.13 ms: 0.333 ms one after the other, 0.224 in 4 overlapped chunks. DLNET_INPUT_CHUNKS=1: one upload, one launch.
INPUT_CHUNKS = int(os.environ.get("DLNET_INPUT_CHUNKS", 4))
INPUT_CHUNK_MIN_BYTES = 1 << 20
# The chain goes on through convolutions while those before it did fewer multiply-adds (x2) than this many per byte
# of the input (what the device computes while the input goes up: about 30 GB/s against 30-90 TFLOP/s on an H100)
# and the convolution's slice keeps at least CHUNK_MIN_PIXELS outputs per channel (a GEMM of that many columns).
# H100, batch 16 from pinned memory, alexnet's 5x5 layer (2916 columns a slice) in the chain: fp32 1.44 -> 1.31 ms,
# tf32 0.81 -> 0.89-0.96 (its tensor-core tiles idle on a quarter of the batch). Not only a chain but every node
# after the input that can run on a slice (resnet50 tf32: its first two blocks) lost more than it hid, from pinned
# memory: resnet50 tf32 3.69-3.76 -> 4.02-4.04 ms, resnet18 1.30-1.35 -> 1.63-1.65, mobilenet_v2 fp32 2.15-2.18 ->
# 2.52 (a slice of a 64-row product fills 98 of 132 SMs); from pageable memory it gained (resnet50 tf32 4.54 -> 4.16).
CHUNK_FLOPS_PER_BYTE = {"fp32": 1000, "tf32": 2000}
if os.environ.get("DLNET_CHUNK_FLOPS_PER_BYTE"):
    CHUNK_FLOPS_PER_BYTE = dict.fromkeys(CHUNK_FLOPS_PER_BYTE, float(os.environ["DLNET_CHUNK_FLOPS_PER_BYTE"]))
CHUNK_MIN_PIXELS = {"fp32": 2048, "tf32": 8192}
CHUNK_OPS = ("Conv", "MaxPool", "AveragePool", "LRN")


@dataclass
class Prefix:
    """nodes[start:stop] run slice after slice of the batch of graph input `input`: chunks [(first image, images)]."""
    input: int
    start: int
    stop: int
    chunks: list


def _data_inputs(node):
    """The inputs of a node that hold images (sliced with its outputs), or None where the node cannot run on a
    slice of the batch."""
    if node.op == "Conv":
        if any(v is not None and v.const is None for v in node.inputs[1:3]):
            return None  # weights computed at run time
        return [v for v in node.inputs[:1] + node.inputs[3:4] if v is not None]
    if node.op in CHUNK_OPS:
        return node.inputs[:1]
    if node.spec.kind == "pointwise" and len(node.outputs) == 1:
        y = node.outputs[0]
        if all(v.const is not None and (v.rank < y.rank or v.shape[0] == 1) for v in node.inputs
               if v is not None and v.const is not None):
            data = [v for v in node.inputs if v is not None and v.const is None]
            if all(v.shape == y.shape for v in data):
                return data
    return None


def _conv_flops(node):
    """2 x the multiply-adds of a convolution's direct form (w: [K, C, KH, KW] or tap-major [K, KH, KW, C]; a
    Winograd layer's U [T, T, K, C] stands for a 3x3 window)."""
    x, y, w = node.inputs[0], node.outputs[0], node.inputs[1]
    depth = 9 * x.shape[1] if node.attrs.get("winograd") else int(np.prod(w.shape[1:], dtype=np.int64))
    return 2 * y.size * depth


def chunked_prefix(ctx, graph):
    """The nodes that run over slices of the batch while the input goes up (INPUT_CHUNKS): a chain from the one
    node reading a large graph input, each node the only reader of the one before it, consecutive in the graph's
    order; or None. GPU cores only: CPU devices share the host's memory and cores with the copy."""
    if INPUT_CHUNKS < 2 or (ctx.is_cpu and GEMM_TILES["cpu"]["core"] not in GPU_CORES):
        return None
    nodes, outputs = graph.nodes, {v.id for v in graph.outputs}
    readers = {}
    for i, n in enumerate(nodes):
        for v in n.inputs:
            if v is not None:
                readers.setdefault(v.id, []).append(i)
    for xi, x in enumerate(graph.inputs):
        N = x.shape[0] if x.rank else 1
        if N < 2 or x.nbytes < INPUT_CHUNK_MIN_BYTES or x.id in outputs or len(readers.get(x.id, [])) != 1:
            continue
        start = readers[x.id][0]

        def fits(node, made):
            data = _data_inputs(node)
            return (data is not None and all(v.rank and v.shape[0] == N for v in data + node.outputs)
                    and not any(v.id in made for v in node.inputs[1:] if v is not None))
        if not fits(nodes[start], ()):
            continue
        nb = N // min(INPUT_CHUNKS, N)  # the smallest slice
        budget = x.nbytes * CHUNK_FLOPS_PER_BYTE.get(ctx.precision, 1000)
        flops = _conv_flops(nodes[start]) if nodes[start].op == "Conv" else 0
        stop, made = start + 1, set()
        while stop < len(nodes):
            prev, node = nodes[stop - 1], nodes[stop]
            y = prev.outputs[0]
            made |= {v.id for v in prev.outputs}
            if len(prev.outputs) != 1 or y.id in outputs or readers.get(y.id) != [stop] or \
                    node.inputs[:1] != [y] or not fits(node, made - {y.id}):
                break
            if node.op == "Conv":
                pixels = int(np.prod(node.outputs[0].shape[2:], dtype=np.int64))
                if flops >= budget or nb * pixels < CHUNK_MIN_PIXELS.get(ctx.precision, 2048):
                    break
                flops += _conv_flops(node)
            stop += 1
        bounds = [N * c // min(INPUT_CHUNKS, N) for c in range(min(INPUT_CHUNKS, N) + 1)]
        return Prefix(xi, start, stop, [(b0, b1 - b0) for b0, b1 in zip(bounds, bounds[1:])])
    return None


# GPU convolutions with constant weights of several taps and channels a multiple of this (every GPU tile's TK
# divides it) take their depth tap by tap (passes/layout.py): one window-table entry and one padding test per slice
# of depth per work-item, not one per element. DLNET_TAP_MAJOR=0: channel by channel, as before.
TAP_MAJOR = os.environ.get("DLNET_TAP_MAJOR", "1") != "0"
TAP_MAJOR_MULTIPLE = 16


def _wino_chunk(T, nbytes, C, K, nx=16):
    """Tiles per chunk of a Winograd layer of T tiles (nx transformed values each) whose V and M (or dW's V and E)
    get nbytes: all of them, else a multiple of 256 and at least WINOGRAD_MIN_TILES."""
    TC = min(T, nbytes // (4 * nx * (C + K)))
    return TC if TC == T else max(TC // 256 * 256, min(T, WINOGRAD_MIN_TILES))


def device_passes(graph, ctx, training=False):
    """The weight layouts this device's kernels read best, after the graph passes: Gemm weights pretransposed
    (except where gemv.cl reads them as they are) and 3x3 weights transformed for Winograd where convolutions run
    on the GPU core. Training (weights change every step): Winograd with the transform on the device, for the
    convolutions and their input and weight gradients."""
    from ..graph.passes.layout import pretranspose_weights, tap_major_weights
    from ..graph.passes.winograd import winograd_on_device, winograd_weights
    core = GEMM_TILES["cpu" if ctx.is_cpu else "gpu"]["core"]
    min_channels, wino_m = WINOGRAD_MIN_CHANNELS, WINOGRAD_M
    if ctx.precision == "tf32" and ctx.is_nvidia:
        min_channels, wino_m = max(min_channels, WINOGRAD_MIN_CHANNELS_TF32), WINOGRAD_M_TF32
    if training:
        if core == "gemm_core" and WINOGRAD_TRAINING:
            winograd_on_device(graph, min_channels, WINOGRAD_MIN_LAYER_TILES, WINOGRAD_DW)
        return graph
    if core == "gemm_vec":  # CPU convolutions: per-channel affine + Relu producers of 1x1 layers as prologues,
        from ..graph.passes.fuse import fold_channel_shuffles, fuse_conv_prologues  # channel shuffles in their planes
        fuse_conv_prologues(graph, ctx.info.device.local_mem_size // (4 * 16))
        if CONV_CPU_DIRECT and DW_CPU_PLANES:
            fold_channel_shuffles(graph)
    pretranspose_weights(graph, GEMV_MAX_ROWS if core in GPU_CORES else 0)
    if core == "gemm_core":
        winograd_weights(graph, min_channels, WINOGRAD_MIN_LAYER_TILES, wino_m, WINOGRAD_F4_MIN_TILES)
        if TAP_MAJOR:
            tap_major_weights(graph, TAP_MAJOR_MULTIPLE)
    return graph


# CPU convolutions (conv_cpu.cl): MR x 8*NV outputs per work-item held in MR*NV float8 accumulators (AVX2 has 16
# registers). On 2 EPYC (znver3) cores through PoCL 3.0, 6x16 ran resnet50's GEMM shapes at 120-145 GFLOP/s with
# packed weights; 12x8 pads fewer columns where a layer's pixel count is small (7x7 = 49: 56 columns against 64).
CONV_CPU_TILES = {"wide": dict(MR=6, NV=2), "narrow": dict(MR=12, NV=1)}


# CPU Gemm with a constant B (gemm_cpu.cl): rows of A per tile up to 6 (a batch-1 fully connected layer is M = 1,
# so MR = M there: no duplicated rows), 16 packed columns per panel.
GEMM_CPU_TILES = {"rows": 6, "NV": 2}


# A 1x1 stride-1 unpadded CPU convolution, and any above this im2col size, packs each panel into __local memory right
# before its tiles use it (conv2d_cpu_local) instead of writing the whole im2col matrix first. 1x1 panels are float8
# copies (PACK_1X1); against a separate im2col pass (or B read in place where pixels fill whole panels), best of 40
# interleaved on 2 EPYC cores: squeezenet's 55x55 128->16 0.166 -> 0.102 ms, 13x13 512->1000 1.06 -> 0.86, resnet50's
# 56x56 64->256 0.64 (in place) -> 0.56, 14x14 256->1024 0.55 -> 0.51. For other layers, best of 15 on 2 EPYC cores
# shared with other jobs: densenet's 56x56 128->32 layer (14 MB of im2col) 9.3 -> 4.1 ms; cache-resident layers (7x7 512->512, 1 MB;
# 14x14 256->256, 1.8 MB) 10-25% slower this way (redundant packing when few panels are shared out).
CONV_CPU_LOCAL_MIN_BYTES = 2 << 20
# A CPU convolution with more than one tap reads its input from zero-padded planes (split by phase where strided) in
# place of im2col (conv_cpu.cl's conv2d_cpu_direct; tests turn it off to keep the packed paths covered), and copies
# each panel's rows into __local memory first where they fit (CONV_CPU_DIRECT_PACK; a 3x3 stride-2 layer, 64 -> 128
# channels at 56x56: 157 GF/s against 137 reading the planes in place)
CONV_CPU_DIRECT = True
CONV_CPU_DIRECT_PACK = True
# CPU depthwise convolutions over zero-padded planes too (dwconv_cpu.cl's dwconv2d_cpu_planes; tests turn it off to
# keep the bordered kernel covered)
DW_CPU_PLANES = True
# ... and a 3x3 stride-1 one with constant weights and at least this many input and output channels runs as fused
# Winograd F(2x2, 3x3) (conv_cpu.cl's conv2d_cpu_wino)
CONV_CPU_WINOGRAD = True
CONV_CPU_WINOGRAD_MIN_CHANNELS = 16
# ... where its rows of tiles, rounded up to 8, grow by at most this factor (7x7 outputs: 4 tiles a row computed as 8)
CONV_CPU_WINOGRAD_MAX_ROW = 1.15
# Depthwise ones run with no pad_planes launch where each work-item's padded input rows (of every phase plane) fit a
# private buffer of DW_PAD_IN_FLOATS floats: it pads them itself (dwconv_cpu.cl's PAD_IN); DLNET_DW_CPU_PAD_IN=0
# turns it off
DW_CPU_PAD_IN = os.environ.get("DLNET_DW_CPU_PAD_IN", "1") != "0"
DW_PAD_IN_FLOATS = 8192


def pick_conv_cpu_tiles(NN):
    """The CONV_CPU_TILES entry for NN output columns: narrow where 16-column panels would pad more than 15%."""
    return CONV_CPU_TILES["narrow" if _round_up(NN, 16) > 1.15 * NN else "wide"]


# tf32: the 128 x 128 tiles only where their grid fills this many waves of compute units; otherwise 64 x 64 tiles
# (four times the work-groups) before split-K has to make up the difference (DLNET_TF32_HUGE_FILL)
HUGE_FILL = float(os.environ.get("DLNET_TF32_HUGE_FILL", 1.0))
# tf32 work-groups one compute unit is taken to hold at once when split-K fills the device (DLNET_TF32_RESIDENT)
TF32_RESIDENT = int(os.environ.get("DLNET_TF32_RESIDENT", 2))
# ... and of the tall tile (two fit, but split to fill both, resnet50's 128 x 12544 x 1152 layers at batch 16 took
# 0.071 ms in 4 slices against 0.063 on the big tile unsplit; DLNET_TF32_TALL_RESIDENT)
TF32_TALL_RESIDENT = int(os.environ.get("DLNET_TF32_TALL_RESIDENT", 1))
HUGE_TM, HUGE_TN_TF32 = GEMM_TILES["tf32"]["huge"]["TM"], GEMM_TILES["tf32"]["huge"]["TN"]


def resident_groups(tiles, tile_model):
    """Work-groups of these tiles one compute unit holds at once: the tile model's figure for the fp32 GPU tiles
    (a 1x1 convolution's variant too), else TF32_RESIDENT."""
    for shape, model in tile_model.items():
        if all(tiles.get(k) == v for k, v in GEMM_TILES["gpu"][shape].items()):
            return model["per_cu"]
    if all(tiles.get(k) == v for k, v in GEMM_TILES["tf32"]["tall"].items()):
        return TF32_TALL_RESIDENT
    return TF32_RESIDENT


# Split-K's partial sums go to a block of the activation arena free at their layer; a split whose partials need
# more than such a block has is taken only up to this many bytes, in a buffer of their own.
SPLITK_SCRATCH_MAX = 4 << 20


# Split-K: at most this many slices (a single tile of a first layer's weight gradient, 64 x 27 x 800k at batch 16,
# took 1.97 ms in 64 slices on an H100's 132 SMs)
SPLITK_MAX = 256


# CPU depthwise convolutions: output rows per work-item, so that each does at least this many outputs (PoCL's cost per
# work-group outweighed a 14-wide row: shufflenet's 272 x 14 x 14 layers) while the grid keeps DW_MIN_ITEMS
DW_MIN_OUTPUTS = int(os.environ.get("DLNET_DW_MIN_OUTPUTS", 256))
DW_MIN_ITEMS = 64
# planes.cl's pad_planes: planes per work-item up to this many floats, while the grid keeps PAD_MIN_ITEMS (544
# planes of 9 x 9, one per work-item: 0.04 ms, most of it PoCL's cost per work-group)
PAD_MIN_FLOATS = 2048
PAD_MIN_ITEMS = 16


def plane_phases(geo):
    """planes.cl's SHP * SWP: the phase planes stored per channel for geo's strides (KHC, KWC, SHC, SWC, DHC, DWC)."""
    return (geo["SHC"] if geo["KHC"] > 1 and geo["DHC"] % geo["SHC"] else 1) * \
        (geo["SWC"] if geo["KWC"] > 1 and geo["DWC"] % geo["SWC"] else 1)


def dw_rows(OH, OW, planes):
    """Rows per work-item of dwconv_cpu.cl for OH x OW outputs in each of `planes` (image, channel) planes."""
    rows = max(1, min(OH, -(-DW_MIN_OUTPUTS // OW)))
    while rows > 1 and planes * -(-OH // rows) < DW_MIN_ITEMS:
        rows //= 2
    return rows


def pick_splits(groups, target, K, k0=32, max_splits=SPLITK_MAX):
    """Slices of K for a grid of `groups` work-groups on `target` resident slots: the count with the least time in
    whole waves, waves(groups * s) * (K / s + k0) (k0: a tile's fixed cost, GPU_TILE_MODEL), where that beats one
    slice by 10% (the partial sums cost a reduction pass); at most SPLITK_MAX (and max_splits) slices of at least
    256. A
    count that spills into one more wave loses: alexnet's batch-16 fully connected layers had split 9 ways into
    576 work-groups on 528 slots (two waves) where 8 fill one."""
    if groups >= target or K < 512:
        return 1

    def cost(s):
        return -(-groups * s // target) * (K / s + k0)
    best = min(range(1, max(1, min(SPLITK_MAX, K // 256, max_splits)) + 1), key=lambda s: (cost(s), s))
    return best if cost(best) < 0.9 * cost(1) else 1


def _rule_shape(ctx, M, N, K, batches, deep):
    """(tf32 core or not, tile shape) by rule for an M x N x K product (`batches` of them)."""
    table = GEMM_TILES["cpu" if ctx.is_cpu else "gpu"]
    tf32 = ctx.precision == "tf32" and ctx.is_nvidia and min(M, N) >= 32 and K >= TF32_MIN_K and \
        not TF32_FP32_K[0] <= K < TF32_FP32_K[1]
    if M <= 4 and N > 16:
        shape = "narrow_m"
    elif N <= 4 and M > 16:
        shape = "narrow_n"
    elif table["core"] == "gemm_core" and not tf32:  # (the GPU table forced onto a CPU device in tests too)
        from .tuner import tile_model
        model = tile_model(ctx)
        shape = min(model, key=lambda s: tile_estimate(s, M, N, K, batches, ctx.info.compute_units, model))
    elif M >= 96 and N >= 2048 and (ctx.is_cpu or -(-M // HUGE_TM) * -(-N // (HUGE_TN_TF32 if tf32 else 128)) *
                                    batches >= HUGE_FILL * ctx.info.compute_units):
        shape = "huge"
    elif tf32 and TF32_WIDE and M <= 64 and N >= 2048 and K >= 256 and \
            -(-N // GEMM_TILES["tf32"]["wide"]["TN"]) * batches >= HUGE_FILL * ctx.info.compute_units:
        shape = "wide"
    else:
        shape = "big"
    if tf32 and TF32_TALL:
        tall = GEMM_TILES["tf32"]["tall"]
        if shape == "big" and deep and M >= 128 and K >= 512 and \
                -(-M // tall["TM"]) * -(-N // tall["TN"]) * batches < TF32_TALL_WAVES * ctx.info.compute_units:
            shape = "tall"
        elif shape == "huge" and -(-M // 96) * 96 < -(-M // HUGE_TM) * HUGE_TM:
            shape = "huge96"
    return tf32, shape


def pick_tiles(ctx, M, N, K, batches=1, deep=True, where="gemm", record=None):
    """(core file name, defines, local size, global size for `batches` M x N problems of depth K); deep: slices of
    32 along K are fine (a convolution's tap-major depth must hold whole slices of them). A tile measured best for
    this layer (tuner.layer_tile: `where` names the caller's kind of product) replaces the rule's; record: a list
    that gets (layer key, tile name, the names it could have taken) where the layer is tunable."""
    tf32, shape = _rule_shape(ctx, M, N, K, batches, deep)
    options = tile_options(ctx, M, N, deep) if shape not in ("narrow_m", "narrow_n") else ()
    if options:
        from .tuner import layer_tile
        key = f"{where} {M}x{N}x{K}x{batches}{' deep' if deep else ''}"
        name = layer_tile(ctx, key, f"{'tf32' if tf32 else 'gpu'}:{shape}", options)
        if record is not None:
            record.append((key, name, options))
        kind, shape = name.split(":")
        tf32 = kind == "tf32"
    table = GEMM_TILES["cpu" if ctx.is_cpu else "gpu"]
    if tf32 and shape in GEMM_TILES["tf32"]:
        table = GEMM_TILES["tf32"]
    tiles = core_tiles(ctx, table[shape]) if table["core"] == "gemm_core" else table[shape]
    if table["core"] == "gemm_vec":  # 8 columns per work-item as float8
        return table["core"], tiles, None, (-(-N // 8), -(-M // tiles["RM"]))
    if table["core"] == "gemm_mma":
        nthreads = 32 * tiles["WARPS_M"] * tiles["WARPS_N"]
    else:
        nthreads = core_threads(tiles)
    return table["core"], tiles, (nthreads, 1, 1), (-(-N // tiles["TN"]) * nthreads, -(-M // tiles["TM"]))


def tile_options(ctx, M, N, deep):
    """The tiles (as "gpu:shape" / "tf32:shape") a product may take where measured (tuner.tune_layers): the fp32
    GPU core's shapes, and on NVIDIA in tf32 mode the tensor-core ones (the tall tile only where slices of 32 along K
    are fine); none where the device runs no tiled core (CPUs' gemm_vec)."""
    if GEMM_TILES["cpu" if ctx.is_cpu else "gpu"]["core"] not in GPU_CORES:
        return ()
    options = tuple(f"gpu:{s}" for s in GPU_TILE_MODEL)
    if ctx.precision == "tf32" and ctx.is_nvidia and min(M, N) >= 32:
        options += tuple(f"tf32:{s}" for s in ("huge", "huge96", "big", "wide") + (("tall",) if deep else ()))
    return options


def core_tiles(ctx, tiles):
    """gemm_core.cl's tiles as ctx's device runs them: on NVIDIA through the cp.async pipeline (FP32_STAGES), with
    FP32_TK's depth where set."""
    if not ctx.is_nvidia or not (FP32_STAGES or FP32_TK):
        return tiles
    return dict(tiles, **({"STAGES": max(2, FP32_STAGES)} if FP32_STAGES else {}),
                **({"TK": FP32_TK} if FP32_TK else {}))


def core_threads(tiles):
    """Work-items per work-group of gemm_core.cl with these tiles (NTHREADS)."""
    return (tiles["TM"] // tiles["WM"]) * (tiles["TN"] // tiles["WN"])


def core_source(core):
    """The text of a GEMM core with what it needs before it."""
    if core == "gemm_mma":
        return kernel_source("gemm_fetch") + kernel_source("mma_tf32") + kernel_source(core)
    return kernel_source("gemm_fetch") + kernel_source(core) if core in GPU_CORES else kernel_source(core)


def _defines(d):
    return "".join(f"#define {k} {v}\n" for k, v in d.items())


def gemm_source(core, tiles, strides, idx, act=None, has_c=False, aligned=(True, True)):
    """gemm.cl's program on a GEMM core: the tiles; C or not; the operand layout, by which of the strides (sam, sak,
    sbk, sbn, ...) are 1; 16-byte copies of rows in the STAGES pipelines where rows are contiguous and every
    product's A / B offset is a multiple of 4 floats (aligned); IDX; a fused activation (act_macro)."""
    sam, sak, sbk, sbn = strides[:4]
    defs = dict(tiles)
    if has_c:
        defs["HAS_C"] = 1
    if sbn == 1:
        defs["B_ROWS"] = 1
    elif sbk == 1:
        defs["B_ALONG_K"] = 1
    if sam == 1 and sak != 1:
        defs["A_ALONG_M"] = 1
    if "STAGES" in tiles:  # (gemm_fetch.cl)
        if core == "gemm_mma" and sak == 1 and sam % 4 == 0 and aligned[0]:
            defs["A_VEC"] = 1  # (the fp32 core's A tile is k-major: 4-byte copies)
        if sbn == 1 and sbk % 4 == 0 and aligned[1] and \
                (core == "gemm_mma" or tiles["TK"] * tiles["TN"] // 4 % core_threads(tiles) == 0):
            defs["B_VEC"] = 1
    defs["IDX"] = idx
    return _defines(defs) + act_macro(act) + kernel_source("gemm") + core_source(core)


def gemm_args(aa, ba, ca, ya, boff, M, N, K, strides, idx, alpha=1.0, beta=0.0):
    """gemm.cl's arguments before the split-K workspace: (buffer, offset) lists aa..ya, the per-batch offset table
    `boff`, and element strides (sam, sak, sbk, sbn, scm, scn) as IDX; y is row-major with N columns."""
    I = np.int32 if idx == "int" else np.int64
    return aa + ba + ca + ya + [boff, np.int32(M), np.int32(N), np.int32(K)] + [I(v) for v in strides] + [
        I(N), I(1), np.float32(alpha), np.float32(beta)]


def act_macro(act, T="float"):
    """ACT(v) for a fused unary pointwise epilogue given as (op name, attrs) or None."""
    if not act:
        return "#define ACT(v) (v)\n"
    from ..graph.ir import Node
    from ..graph.ops import get_op
    op, attrs = act
    node = Node(op, [], [], dict(attrs))
    return f"#define ACT(v) {get_op(op).c(node.attrs, ['(v)'], T)}\n"


def _round_up(n, m):
    return (n + m - 1) // m * m


class Lowerer:
    def __init__(self, ctx, graph, plan, act_buf, const_buf):
        self.ctx = ctx
        self.graph = graph
        self.plan = plan
        self.act_buf = act_buf
        self.const_buf = const_buf
        self.launches = []
        self.keepalive = []  # small metadata buffers the launches read
        self.layer = ""  # the node being lowered, for per-layer profiles
        self.node = None  # ... and the node itself
        self.scratch = {}  # pool name -> buffer: "work" (im2col/colgrad), "splitk" (partial sums)
        self.scratch_users = []  # (kernel, argument index, pool)
        self.scratch_bytes = {}
        self.input_chunks = {}  # graph input index -> [(first, end) element of each chunk] (lower_in_chunks)
        self.tile = None  # the tunable product's (layer key, tile, options) pick() chose for the next _matrix

    # locations ---------------------------------------------------------------
    def loc(self, v):
        """(buffer, element offset) of a value (of its slice, for a BatchSlice)."""
        item = np.dtype(v.dtype).itemsize
        weight = self.plan.const_alias.get(v.id, v.id)  # a Reshape of a weight views the weight arena
        if v.const is not None or weight != v.id:
            return self.const_buf, self.plan.const_offsets[weight] // item
        rid, eoff = self.plan.alias_of.get(v.id, (v.id, 0))
        first = getattr(v, "first", 0)
        return self.act_buf, self.plan.act_offsets[rid] // item + eoff + (first * (v.size // v.shape[0]) if first else 0)

    def lower_in_chunks(self, nodes, prefix):
        """Lower nodes (a chunked_prefix) once per slice of the batch, slice after slice, each slice's launches
        awaiting that slice's upload ((input index, chunk), Plan.run)."""
        x = self.graph.inputs[prefix.input]
        per = x.size // x.shape[0]
        self.input_chunks[prefix.input] = [(b0 * per, (b0 + nb) * per) for b0, nb in prefix.chunks]
        for c, (b0, nb) in enumerate(prefix.chunks):
            for node in nodes:
                self.layer, self.node = f"{node.name} {node.op}".strip(), node
                data = {v.id for v in _data_inputs(node) + node.outputs}
                def part_of(v):  # (a value handed on within the chain has a block of one slice)
                    return BatchSlice(v, 0 if v.id in self.plan.per_slice else b0, nb)
                part = Node(node.op, [part_of(v) if v is not None and v.id in data else v for v in node.inputs],
                            [part_of(v) for v in node.outputs], node.attrs, node.name)
                start = len(self.launches)
                node.spec.lower(part, self)
                for launch in self.launches[start:]:
                    launch.wait = (prefix.input, c)
                    launch.label += f" images {b0}+{nb}"

    def args(self, v, image=0):
        """[buffer, element offset] of v (from its image `image` on: v.size / batch elements each)."""
        buf, off = self.loc(v)
        return [buf, np.uint64(off + image * (v.size // v.shape[0] if image else 0))]

    def dummy(self):
        return [self.const_buf, np.uint64(0)]

    @staticmethod
    def strides(v):
        return codegen.contiguous_strides(v.shape)

    @staticmethod
    def index_type(*sizes):
        """C type of generated index arithmetic: 32-bit while every operand's extent fits (offsets into the arena
        are separate 64-bit arguments; GPUs emulate 64-bit division), else 64-bit."""
        return "int" if max([1] + [int(s) for s in sizes]) < 2**31 - 1 else "long"

    def meta(self, values, dtype=np.int64):
        arr = np.asarray(values, dtype=dtype)
        if arr.size == 0:
            arr = np.zeros(1, dtype)
        buf = Deferred(lambda: cl.Buffer(self.ctx.cl, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR,
                                         hostbuf=arr))
        self.keepalive.append(buf)
        return buf

    def emit(self, source, name, args, gsize, lsize=None, label="", options=()):
        """Append a launch; its program is built in finish(), with every other program of the plan."""
        k = PendingKernel(source, name, options)
        k.set_args(*args)
        self.launches.append(Launch(k, tuple(int(g) for g in gsize), None if lsize is None else tuple(lsize), label,
                                    self.layer or label))

    def written_in_place(self, x, y):
        """x's producer already wrote it inside y (the planner placed x in y's block)."""
        rid, _ = self.plan.alias_of.get(x.id, (x.id, 0))
        return rid == self.plan.alias_of.get(y.id, (y.id, 0))[0] and rid != x.id

    # generated elementwise ----------------------------------------------------
    def _elementwise(self, y, y_off, y_strides, operands, body, label):
        """operands: [(value, element offset, strides over y's loop)]; body assigns r0 from x0v.."""
        shape = list(y.shape)
        dims, sets = codegen.collapse(shape, [list(y_strides)] + [list(s) for _, _, s in operands])
        rank = len(dims)
        I = self.index_type(*[v.size for v, _, _ in operands], y.size)
        ybuf, yo = self.loc(y)
        args = [ybuf, np.uint64(yo + y_off)]
        for v, off, _ in operands:
            buf, o = self.loc(v)
            args += [buf, np.uint64(o + off)]
        args.append(self.meta(dims + [s for st in sets for s in st], np.int32 if I == "int" else np.int64))
        self.emit_ew(dims, sets, [v.dtype for v, _, _ in operands], y.dtype, body, I, args, label)

    def emit_ew(self, dims, sets, in_dtypes, out_dtype, body, I, args, label):
        """The generated elementwise kernel over collapsed `dims` (sets: y's strides, then each operand's): on CPUs
        a work-item per chunk of a row (no division chain per element), elsewhere one per element."""
        total = int(np.prod(dims))
        if self.ctx.is_cpu:
            src = codegen.elementwise_rows_source(len(dims), in_dtypes, out_dtype, body, I, [st[-1] for st in sets])
            rows = total // dims[-1] if dims[-1] else 0
            self.emit(src, "ew_rows", args, (max(-(-dims[-1] // codegen.ROW_CHUNK), 1), max(rows, 1)), None, label)
            return
        src = codegen.elementwise_source(len(dims), in_dtypes, out_dtype, body, I)
        self.emit(src, "ew", args, (max(total, 1),), None, label)

    def pointwise(self, nodes):
        """A chain of pointwise nodes (last one's output is written) as one generated kernel."""
        out = nodes[-1].outputs[0]
        operands, lines = self._pointwise_body(nodes, out.shape)
        body = " ".join(lines) + f" r0 = t{len(nodes) - 1};"
        label = "+".join(n.op for n in nodes)
        self._elementwise(out, 0, self.strides(out), operands, body, f"{nodes[-1].name} {label}")

    @staticmethod
    def _pointwise_body(nodes, out_shape):
        """C statements t0.. of a chain of pointwise nodes over the operands x0v.. ([(value, 0, strides over
        out_shape)]); the last node's result is t{len(nodes) - 1}."""
        inside = {n.outputs[0].id: f"t{i}" for i, n in enumerate(nodes)}
        operands, names = [], {}
        lines = []
        for i, n in enumerate(nodes):
            args = []
            for v in n.inputs:
                if v.id in inside and inside[v.id] != f"t{i}":
                    args.append(inside[v.id])
                    continue
                if v.id not in names:
                    names[v.id] = f"x{len(operands)}v"
                    operands.append((v, 0, codegen.broadcast_strides(v.shape, out_shape)))
                args.append(names[v.id])
            tdt = n.outputs[0].dtype
            T = codegen._vtype(tdt)
            cT = codegen._vtype(n.inputs[0].dtype) if n.spec.bool_out else T
            lines.append(f"{T} t{i} = ({T})({n.spec.expr(n, args, cT)});")
        return operands, lines

    def pointwise_single(self, op, y, inputs):
        from ..graph.ir import Node
        node = Node(op, inputs, [y], {})
        self.pointwise([node])

    def copy(self, y, x, x_offset, x_strides):
        self._elementwise(y, 0, self.strides(y), [(x, x_offset, x_strides)], "r0 = x0v;", f"copy {y.id}")

    def copy_into(self, y, y_offset, y_strides, x):
        """Write x (contiguous) into a view of y at y_offset with y_strides (over x's shape)."""
        self._elementwise_view(x, y, y_offset, y_strides)

    def _elementwise_view(self, x, y, y_offset, y_strides):
        from ..graph.ir import Value
        shadow = Value(-1, "", y.dtype, x.shape)
        dims, sets = codegen.collapse(list(x.shape), [list(y_strides), self.strides(x)])
        I = self.index_type(y.size, x.size)
        ybuf, yo = self.loc(y)
        xbuf, xo = self.loc(x)
        args = [ybuf, np.uint64(yo + y_offset), xbuf, np.uint64(xo),
                self.meta(dims + sets[0] + sets[1], np.int32 if I == "int" else np.int64)]
        del shadow
        self.emit_ew(dims, sets, [x.dtype], y.dtype, "r0 = x0v;", I, args, f"copy into {y.id}")

    def fill(self, y, value):
        src = codegen.elementwise_source(1, [], y.dtype, f"r0 = ({codegen._vtype(y.dtype)}){float(value)!r};")
        buf, off = self.loc(y)
        self.emit(src, "ew", [buf, np.uint64(off), self.meta([y.size, 1])], (max(y.size, 1),), None, "fill")

    # hand-written families ------------------------------------------------------
    def conv(self, node):
        x, w = node.inputs[0], node.inputs[1]
        bias = node.inputs[2] if len(node.inputs) > 2 else None
        res = node.inputs[3] if len(node.inputs) > 3 else None
        y = node.outputs[0]
        if x.dtype != "float32":
            raise ModelError(f"node {node.name} (Conv): float32 only, got {x.dtype}")
        nsp = x.rank - 2
        if nsp not in (1, 2):
            raise ModelError(f"node {node.name} (Conv): {nsp}-D convolution is not supported (1-D and 2-D are)")
        a = node.attrs
        strides = list(a.get("strides") or [1] * nsp)
        pads = list(a.get("pads") or [0] * 2 * nsp)
        dil = list(a.get("dilations") or [1] * nsp)
        if any(pads[i] != pads[i + nsp] for i in range(nsp)):
            raise ModelError(f"node {node.name} (Conv): asymmetric pads reach the kernel (padding pass missing)")
        if nsp == 1:  # a 1-D convolution is a 2-D one of height 1
            strides, pads, dil = [1] + strides, [0] + pads[:1], [1] + dil
            H, W, KH, KW, OH, OW = 1, x.shape[2], 1, w.shape[2], 1, y.shape[2]
        else:
            KH, KW = w.shape[1:3] if a.get("tap_major") else w.shape[2:4]
            H, W, OH, OW = x.shape[2], x.shape[3], y.shape[2], y.shape[3]
            pads = pads[:2]
        N, Cin = x.shape[0], x.shape[1]
        group = a.get("group", 1)
        Cout = w.shape[0]
        defs = {}
        if bias is not None:
            defs["HAS_BIAS"] = 1
        if res is not None:
            defs["HAS_RES"] = 1
        head = _defines(defs) + act_macro(a.get("act"))
        bargs = self.args(bias) if bias is not None else self.dummy()
        rargs = self.args(res) if res is not None else self.dummy()
        label = f"{node.name} Conv"
        if a.get("winograd"):  # 1: w holds U (passes/winograd.py); 2: U from w on the device, every run
            self.winograd(x, w if a["winograd"] == 1 else None, bargs, rargs, y, head, pads, label, w=w)
            return
        y_nstride = Cout * OH * OW
        if group == Cin and w.shape[1] == 1 and group > 1:
            mult = Cout // Cin
            args = self.args(x) + self.args(w) + bargs + rargs + self.args(y) + [
                np.int32(Cin), np.int32(H), np.int32(W), np.int32(OH), np.int32(OW), np.int32(KH), np.int32(KW),
                np.int32(strides[0]), np.int32(strides[1]), np.int32(pads[0]), np.int32(pads[1]),
                np.int32(dil[0]), np.int32(dil[1]), np.int32(mult), np.int64(y_nstride), np.int64(y_nstride)]
            if self.ctx.is_cpu and DW_CPU_PLANES:  # over zero-padded planes, ROWS output rows per work-item
                geo = {"KHC": KH, "KWC": KW, "SHC": strides[0], "SWC": strides[1], "DHC": dil[0], "DWC": dil[1]}
                Hq = -(-((OH - 1) * strides[0] + dil[0] * (KH - 1) + 1) // strides[0])
                Wq = -(-((OW - 1) * strides[1] + dil[1] * (KW - 1) + 1) // strides[1])
                rows = dw_rows(OH, OW, N * Cout)
                per = max(1, min(DW_MIN_OUTPUTS // (OH * OW), N * Cout // DW_MIN_ITEMS)) if rows == OH else 1
                defs = dict(geo, SW=strides[1], ROWS=rows)
                pad_in = DW_CPU_PAD_IN and plane_phases(geo) * (rows + dil[0] * (KH - 1) // strides[0]) * Wq + 8 \
                    <= DW_PAD_IN_FLOATS
                if pad_in:  # each work-item pads the rows it reads itself (dwconv_cpu.cl's PAD_IN)
                    xargs, xp_nstride, extra = self.args(x), Cin * H * W, [
                        np.int32(v) for v in (H, W, pads[0], pads[1])]
                    defs.update(PAD_IN=1, WQ=Wq)
                    if a.get("in_perm") is not None:
                        defs["CHANNEL_MAP"] = 1
                        extra += [self.meta(np.asarray(a["in_perm"], np.int32), np.int32), np.uint64(0)]
                else:
                    xp_nstride = self.pad_planes(x, H, W, geo, Hq, Wq, pads[0], pads[1], 8 + Wq, label,
                                                 a.get("in_perm"))
                    xargs, extra = [self.dummy()[0], np.uint64(0)], []
                self.emit(_defines(defs) + head + kernel_source("planes") + kernel_source("dwconv_cpu"),
                          "dwconv2d_cpu_planes", xargs + self.args(w) + bargs + rargs + self.args(y) + [
                              np.int32(v) for v in (Cin, Hq, Wq, OH, OW, mult)] + [
                              np.int64(xp_nstride), np.int64(y_nstride), np.int64(y_nstride), np.int32(N * Cout),
                              np.int32(per)] + extra, (-(-OH // rows), -(-N * Cout // per)), (1, 1), label)
                if not pad_in:
                    self.use_scratch(self.launches[-1].kernel, 0, 4 * N * xp_nstride, "work")
                return
            if self.ctx.is_cpu:  # ROWS output rows per work-item, stride along W compiled in
                args = args[:-8] + args[-7:]
                rows = dw_rows(OH, OW, N * Cout)
                self.emit(f"#define SW {strides[1]}\n#define ROWS {rows}\n#define KHC {KH}\n#define KWC {KW}\n" + head +
                          kernel_source("dwconv_cpu"),
                          "dwconv2d_cpu", args, (-(-OH // rows), N * Cout), (1, 1), label)
                return
            lx = 16 if OW >= 16 else 8
            ly = 4
            self.emit(head + kernel_source("dwconv"), "dwconv2d", args,
                      (_round_up(OW, lx), _round_up(OH, ly), N * Cout), (lx, ly, 1), label)
            return
        if self.ctx.is_cpu and GEMM_TILES["cpu"]["core"] == "gemm_vec":  # (tests force the portable core on CPUs)
            geo = [np.int32(v) for v in (H, W, OH, OW, KH, KW, strides[0], strides[1], pads[0], pads[1], dil[0],
                                         dil[1])]
            self.conv_cpu(node, head, bargs, rargs, group, Cin // group, Cout // group, geo, y_nstride)
            return
        idx = self.index_type(x.size, w.size, y.size, res.size if res is not None else 0)
        self._conv_gemm(self.args(x), self.args(w), bargs, rargs, self.args(y), head, idx, N, Cin, H, W, Cout, OH, OW,
                        KH, KW, strides, pads, dil, group, label, a.get("tap_major", 0))

    def _conv_gemm(self, xa, wa, ba, ra, ya, head, idx, N, Cin, H, W, Cout, OH, OW, KH, KW, strides, pads, dil, group,
                   label, tap_major=0):
        """Convolution as implicit GEMM on a GPU core (CPUs: conv_cpu); xa..ya: (buffer, offset) arguments of x,
        w, bias, residual, y; head: the epilogue's defines; tap_major: w is [K, KH, KW, C] (passes/layout.py)."""
        y_nstride = Cout * OH * OW
        C, K = Cin // group, Cout // group
        M, NN = K, N * OH * OW
        core, tiles, lsize, (g0, g1) = self.pick(M, NN, C * KH * KW, group, KH * KW == 1 or (tap_major and C % 32 == 0),
                                                 f"conv{KH}x{KW}s{strides[0]}x{strides[1]}{'t' if tap_major else ''}")
        if KH == 1 and KW == 1 and strides == [1, 1] and pads == [0, 0]:
            tiles = dict(tiles, IS_1X1=1)
        if tap_major:
            tiles = dict(tiles, TAP_MAJOR=1)
        if core == "gemm_mma" and (C * KH * KW) % 4 == 0 and wa[1] % 4 == 0:
            tiles = dict(tiles, A_VEC=1)  # weight rows as 16-byte copies (gemm_fetch.cl)
        src = _defines(dict(tiles, IDX=idx)) + head + kernel_source("window") + kernel_source("conv") + \
            core_source(core)
        args = xa + wa + ba + ra + ya + [self.window_table(C, H, W, KH, KW, dil, tap_major)] + [
            np.int32(C), np.int32(H), np.int32(W), np.int32(K), np.int32(OH), np.int32(OW), np.int32(KH),
            np.int32(KW), np.int32(strides[0]), np.int32(strides[1]), np.int32(pads[0]), np.int32(pads[1]),
            np.int32(dil[0]), np.int32(dil[1]), np.int32(group), np.int32(N), np.int64(y_nstride),
            np.int64(y_nstride)]
        self._matrix(src, "conv2d", args, core, tiles, lsize, (g0, g1, group), M, NN, C * KH * KW, label)

    def winograd(self, x, u, bargs, rargs, y, head, pads, label, w=None, flip=False):
        """A convolution through Winograd F(2x2, 3x3), u = G w G^T [4, 4, K, C], or F(4x4, 3x3), u [6, 6, K, C]:
        input transform (winograd.cl) -> (m + 2)^2 products U[xi] V[xi] as one batched GEMM on the core -> output
        transform with the epilogue. V and M live in the block of the activation arena the planner set aside for this
        layer (plan.temps): where it is short of the whole layer, the layer runs in chunks of tiles, three launches
        each. u: the transformed weights (passes/winograd.py), or None with w: weights that change every run
        (training, F(2x2)), transformed here first into the front of that block (flip: dX's filters, w [C, K, 3, 3]
        flipped and transposed)."""
        N, C, H, W = x.shape
        K, OH, OW = y.shape[1:]
        m = u.shape[0] - 2 if u is not None else 2
        nx, kind = (m + 2) ** 2, "" if m == 2 else str(m)
        TH, TW = -(-OH // m), -(-OW // m)
        T = N * TH * TW
        off, nbytes = self.plan.temps[y.id]  # the planner's block for U, V and M (winograd_workspace)
        if u is None:
            u_bytes = _round_up(64 * K * C, 256)
            src = _defines({"IDX": self.index_type(w.size, 16 * K * C)} | ({"FLIP": 1} if flip else {})) + \
                act_macro(None) + kernel_source("winograd")
            self.emit(src, "wino_weights", self.args(w) + [self.act_buf, np.uint64(off // 4)] + [
                np.int32(K), np.int32(C)], (_round_up(K * C, 64),), (64,), label + " winograd weights")
            uargs = [self.act_buf, np.uint64(off // 4)]
            off, nbytes = off + u_bytes, nbytes - u_bytes
        else:
            uargs = self.args(u)
        TC = _wino_chunk(T, nbytes, C, K, nx)
        v_at, m_at = [self.act_buf, np.uint64(off // 4)], [self.act_buf, np.uint64(off // 4 + nx * C * TC)]
        idx = self.index_type(x.size, y.size, nx * C * TC, nx * K * TC)
        src = _defines({"IDX": idx, "WINO_M": m}) + head + kernel_source("winograd")
        for t0 in range(0, T, TC):
            tc = min(TC, T - t0)
            table = np.array([[xi * K * C, xi * C * tc, 0, xi * K * tc] for xi in range(nx)], np.int64)
            tag = f" winograd{kind}{'' if TC == T else f' tiles {t0}+{tc}'}"
            self.emit(src, "wino_input" + kind, self.args(x) + v_at + [np.int32(v) for v in (
                C, H, W, pads[0], pads[1], TH, TW, t0, tc)], (_round_up(tc, 64), C), (64, 1), label + tag + " in")
            self._gemm_launch(uargs, v_at, None, m_at, table, K, tc, C, (C, 1, tc, 1, 0, 0), idx, None, 1.0,
                              0.0, label + tag + " gemm", f"winograd{m}")
            self.emit(src, "wino_output" + kind, m_at + bargs + rargs + self.args(y) + [
                np.int32(v) for v in (K, OH, OW, TH, TW, t0, tc)] + [np.int64(K * OH * OW)] * 2,
                (_round_up(tc, 64), K), (64, 1), label + tag + " out")

    def winograd_dw(self, dy, x, dw, pads, label):
        """dW of a 3x3 stride-1 convolution through Winograd F(2x2, 3x3): per chunk of tiles, x's tiles transformed
        (V = B^T d B, wino_input), dy's (E = A dY A^T, wino_dy), and the 16 sums over tiles M[xi] += E[xi] V[xi]^T
        as one batched GEMM (K x tc times tc x C, both along the tiles); then dw = G^T M G (wino_dw). M sits at the
        front of the planner's block for this node (plan.temps), E and V after it."""
        N, C, H, W = x.shape
        K, OH, OW = dy.shape[1:]
        TH, TW = -(-OH // 2), -(-OW // 2)
        T = N * TH * TW
        off, nbytes = self.plan.temps[dw.id]  # ConvGradW.workspace
        m_bytes = _round_up(64 * K * C, 256)
        m_at = [self.act_buf, np.uint64(off // 4)]
        off, nbytes = off + m_bytes, nbytes - m_bytes
        TC = _wino_chunk(T, nbytes, C, K)
        e_at, v_at = [self.act_buf, np.uint64(off // 4)], [self.act_buf, np.uint64(off // 4 + 16 * K * TC)]
        idx = self.index_type(x.size, dy.size, 16 * C * TC, 16 * K * TC, 16 * K * C)
        src = _defines({"IDX": idx}) + act_macro(None) + kernel_source("winograd")
        for t0 in range(0, T, TC):
            tc = min(TC, T - t0)
            tag = f" winograd{'' if TC == T else f' tiles {t0}+{tc}'}"
            self.emit(src, "wino_input", self.args(x) + v_at + [np.int32(v) for v in (
                C, H, W, pads[0], pads[1], TH, TW, t0, tc)], (_round_up(tc, 64), C), (64, 1), label + tag + " in")
            self.emit(src, "wino_dy", self.args(dy) + e_at + [np.int32(v) for v in (K, OH, OW, TH, TW, t0, tc)],
                      (_round_up(tc, 64), K), (64, 1), label + tag + " dy")
            table = np.array([[xi * K * tc, xi * C * tc, xi * K * C, xi * K * C] for xi in range(16)], np.int64)
            self._gemm_launch(e_at, v_at, m_at if t0 else None, m_at, table, K, C, tc, (tc, 1, 1, tc, C, 1), idx,
                              None, 1.0, 1.0, label + tag + " gemm", "winograd_dw")
        self.emit(src, "wino_dw", m_at + self.args(dw) + [np.int32(K), np.int32(C)], (_round_up(K * C, 64),), (64,),
                  label + " winograd dw")

    WINDOW_PAD_ROWS = 128  # >= any tile's TK and TN: fetches run that far past the end (B_SAFE in gemm_fetch.cl)

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

    def conv_cpu(self, node, head, bargs, rargs, group, C, K, geo, y_nstride):
        """A convolution on a CPU device, in conv_cpu.cl's register-blocked tiles: read from zero-padded (phase)
        planes where it has more than one tap (CONV_CPU_DIRECT), else from im2col's packed panels (per panel in
        __local memory for 1x1 layers and where the im2col matrix is large); constant weights are packed here, once."""
        x, w, y = node.inputs[0], node.inputs[1], node.outputs[0]
        H, W, OH, OW, KH, KW, SH, SW, PH, PW, DH, DW = (int(v) for v in geo)
        if node.attrs.get("in_perm") is not None and not (CONV_CPU_DIRECT and KH * KW > 1):
            raise ModelError(f"node {node.name} (Conv): a channel map needs the padded planes' path")
        if node.attrs.get("prologue") and not (KH == KW == SH == SW == 1 and PH == PW == 0 and
                                               4 * C * 16 <= self.ctx.info.device.local_mem_size):
            raise ModelError(f"node {node.name} (Conv): a prologue needs a 1x1 stride-1 unpadded layer whose panel "
                             f"fits local memory")
        N, Cin = x.shape[0], x.shape[1]
        KK, OHW = C * KH * KW, OH * OW
        NN = N * OHW
        pointwise = KH == KW == SH == SW == 1 and PH == PW == 0
        direct = CONV_CPU_DIRECT and KH * KW > 1  # (a 1x1 stride 2 ran at 130 GF/s direct, 155 through im2col)
        # the direct path's planes: the padded extent the outputs read, split into SHP x SWP phases of Hq x Wq
        Hq, Wq = -(-((OH - 1) * SH + DH * (KH - 1) + 1) // SH), -(-((OW - 1) * SW + DW * (KW - 1) + 1) // SW)
        tiles = pick_conv_cpu_tiles(OH * Wq if direct else NN)
        MR, NR = tiles["MR"], 8 * tiles["NV"]
        MB, NB = -(-K // MR), -(-NN // NR)
        defs = dict(tiles)
        label = f"{node.name} Conv"
        TH, TW = -(-OH // 2), -(-OW // 2)  # Winograd's 2x2 output tiles, in rows of TWP
        TWP = _round_up(TW, 8)
        wino = CONV_CPU_WINOGRAD and KH == KW == 3 and SH == SW == DH == DW == 1 and group == 1 and \
            w.const is not None and not w.param and min(C, K) >= CONV_CPU_WINOGRAD_MIN_CHANNELS and \
            TWP <= CONV_CPU_WINOGRAD_MAX_ROW * TW
        if wino:
            tiles = pick_conv_cpu_tiles(TH * TWP)
            MR, NR = tiles["MR"], 8 * tiles["NV"]
            wino = 4 * 16 * (C + MR) * NR <= self.ctx.info.device.local_mem_size
        if wino:
            MB, NBI = -(-K // MR), -(-(TH * TWP) // NR)
            Hq, Wq = 2 * TH + 2, 2 * TWP + 2
            geo3 = {"KHC": 3, "KWC": 3, "SHC": 1, "SWC": 1, "DHC": 1, "DWC": 1}
            xp_nstride = self.pad_planes(x, H, W, geo3, Hq, Wq, PH, PW, 0, label, node.attrs.get("in_perm"))
            defs = dict(tiles, **geo3, WINO_CPU=1, A_PACKED=1, B_LOCAL=self.ctx.info.device.local_mem_size // 4)
            src = _defines(defs) + head + kernel_source("planes") + kernel_source("conv_cpu")
            from ..graph.passes.winograd import transform_weights
            u = np.zeros((16, MB * MR, C), np.float32)
            u[:, :K] = transform_weights(w.const, 2).reshape(16, K, C)
            u = u.reshape(16, MB, MR, C).transpose(0, 1, 3, 2)
            splits = min(MB, -(-8 * self.ctx.info.compute_units // (N * NBI)))
            MBS = -(-MB // splits)
            self.emit(src, "conv2d_cpu_wino", [self.dummy()[0], np.uint64(0), self.meta(u.ravel(), np.float32),
                                               np.uint64(0)] + bargs + rargs + self.args(y) + [
                np.int32(v) for v in (C, K, Wq, OH, OW, TH, TW, TWP, NBI)] + [
                np.int64(xp_nstride), np.int64(y_nstride), np.int64(y_nstride), np.int32(MBS)],
                (N * NBI, -(-MB // MBS)), (1, 1), f"{node.name} Conv winograd")
            self.use_scratch(self.launches[-1].kernel, 0, 4 * N * xp_nstride, "work")
            return
        wargs = self.conv_cpu_weights(w, group, K, KK, MR, defs)
        if direct:
            NBI = -(-(OH * Wq) // NR)
            tail = NBI * NR - OH * Wq + Wq - OW  # past the last plane: what the last panel's dropped columns read
            geo = {"KHC": KH, "KWC": KW, "SHC": SH, "SWC": SW, "DHC": DH, "DWC": DW}
            xp_nstride = self.pad_planes(x, H, W, geo, Hq, Wq, PH, PW, tail, label, node.attrs.get("in_perm"))
            defs.update(geo)
            if CONV_CPU_DIRECT_PACK and 4 * KK * NR <= self.ctx.info.device.local_mem_size:
                defs["B_LOCAL"] = self.ctx.info.device.local_mem_size // 4
            src = _defines(defs) + head + kernel_source("planes") + kernel_source("conv_cpu")
            splits = min(MB, -(-8 * self.ctx.info.compute_units // (N * NBI * group)))
            MBS = -(-MB // splits)
            self.emit(src, "conv2d_cpu_direct", [self.dummy()[0], np.uint64(0)] + wargs + bargs + rargs +
                      self.args(y) + [np.int32(v) for v in (C, K, Hq, Wq, OH, OW, NBI)] + [
                          np.int64(xp_nstride), np.int64(y_nstride), np.int64(y_nstride), np.int32(MBS)],
                      (N * NBI, -(-MB // MBS), group), (1, 1, 1), label)
            self.use_scratch(self.launches[-1].kernel, 0, 4 * N * xp_nstride, "work")
            return
        col_bytes = 4 * group * NB * NR * KK
        local = (pointwise or col_bytes >= CONV_CPU_LOCAL_MIN_BYTES) and \
            4 * KK * NR <= self.ctx.info.device.local_mem_size
        if local:  # each work-item packs its own panel: split the row blocks until 8 work-items per core
            # every such kernel declares the whole local memory: PoCL reallocates its threads' local areas when a
            # kernel asks for another size than the last one's, about 0.12 ms between kernels (densenet121 with
            # panels of their own sizes: 16.3 ms of gaps between its 345 kernels, against 3.4 at one size)
            defs["B_LOCAL"] = self.ctx.info.device.local_mem_size // 4
            if pointwise:
                defs["PACK_1X1"] = 1
            splits = min(MB, -(-8 * self.ctx.info.compute_units // (NB * group)))
            MBS = -(-MB // splits)
            splits = -(-MB // MBS)
        else:
            args = self.args(x) + [self.dummy()[0], np.int32(C)] + geo + [np.int64(Cin * H * W), np.int32(NN)]
            self.emit(_defines(defs) + head + kernel_source("conv_cpu"), "im2col_pack", args, (KK, group), (1, 1),
                      label + " im2col")
            self.use_scratch(self.launches[-1].kernel, 2, col_bytes, "work")
        if local:
            args = self.args(x) + wargs + bargs + rargs + self.args(y) + [
                np.int32(C), np.int32(K), np.int32(KK), np.int32(OHW), np.int32(NN), np.int64(y_nstride),
                np.int64(y_nstride), np.int32(H), np.int32(W), np.int32(OW), np.int32(KH), np.int32(KW), np.int32(SH),
                np.int32(SW), np.int32(PH), np.int32(PW), np.int32(DH), np.int32(DW), np.int64(Cin * H * W),
                np.int32(MBS)]
            if node.attrs.get("prologue"):  # fuse_conv_prologues: relu?(x * scale + shift) as each panel is packed
                from ..graph.passes.fuse import affine_chain
                _, scale, shift, relu = affine_chain(node.attrs["prologue"], x.shape)
                defs.update(PROLOGUE=1, **({"PRO_RELU": 1} if relu else {}))
                args += [self.meta(np.concatenate([scale, shift]).astype(np.float32), np.float32), np.uint64(0)]
            self.emit(_defines(defs) + head + kernel_source("conv_cpu"), "conv2d_cpu_local", args, (NB, splits, group),
                      (1, 1, 1), label)
            return
        args = self.args(x) + wargs + bargs + rargs + self.args(y) + [
            self.dummy()[0], np.int32(C), np.int32(K), np.int32(KK), np.int32(OHW), np.int32(NN),
            np.int64(y_nstride), np.int64(y_nstride)]
        self.emit(_defines(defs) + head + kernel_source("conv_cpu"), "conv2d_cpu", args, (MB, NB, group), (1, 1, 1),
                  label)
        self.use_scratch(self.launches[-1].kernel, 10, 0, "work")

    def pad_planes(self, x, H, W, geo, Hq, Wq, PH, PW, tail, label, cmap=None):
        """Launch planes.cl's pad_planes: x [N, C, H, W] (1-D: H = 1) into the plan's "work" scratch as zero-padded
        planes of Hq x Wq per channel and phase of geo's strides (KHC, KWC, SHC, SWC, DHC, DWC), then `tail` zeros
        per image; cmap: plane c copies channel cmap[c]. Returns the floats from one image's planes to the next's."""
        N, C = x.shape[:2]
        phases = plane_phases(geo)
        xp_nstride = _round_up(C * phases * Hq * Wq + tail, 16)
        per = max(1, min(PAD_MIN_FLOATS // (Hq * Wq), C * phases * N // PAD_MIN_ITEMS))  # planes per work-item
        extra, defs = [], dict(geo)
        if cmap is not None:
            extra, defs["CHANNEL_MAP"] = [self.meta(np.asarray(cmap, np.int32), np.int32), np.uint64(0)], 1
        self.emit(_defines(defs) + kernel_source("planes"), "pad_planes", self.args(x) + [self.dummy()[0]] + [
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

    def gemm(self, node):
        a, b = node.inputs[0], node.inputs[1]
        c = node.inputs[2] if len(node.inputs) > 2 else None
        y = node.outputs[0]
        if a.dtype != "float32" or b.dtype != "float32":
            raise ModelError(f"node {node.name} ({node.op}): float32 only, got {a.dtype} x {b.dtype}")
        at = node.attrs
        ta, tb = at.get("transA", 0), at.get("transB", 0)
        M, N = y.shape[-2], y.shape[-1]
        K = a.shape[-2] if ta else a.shape[-1]
        batch = y.shape[:-2]
        nb = int(np.prod(batch, dtype=np.int64))

        def mat_strides(v):
            s = codegen.broadcast_strides(v.shape, batch + v.shape[-2:])
            return s[:-2], s[-2], s[-1]

        sa_b, sa0, sa1 = mat_strides(a)
        sb_b, sb0, sb1 = mat_strides(b)
        sam, sak = (sa1, sa0) if ta else (sa0, sa1)
        sbk, sbn = (sb1, sb0) if tb else (sb0, sb1)
        cs = codegen.broadcast_strides(c.shape, y.shape) if c is not None else [0] * y.rank
        gpu_core = GEMM_TILES["cpu" if self.ctx.is_cpu else "gpu"]["core"] in GPU_CORES
        if not gpu_core and not batch and a.rank == b.rank == 2 and b.const is not None and not b.param:
            self.gemm_cpu(node, a, b, c, y, M, N, K, sam, sak, sbk, sbn, cs)
            return
        sc_b, scm, scn = cs[:-2], cs[-2], cs[-1]
        if gpu_core and not batch and self.gemv(a, b, c, y, M, N, K, sam, sak, sbk, sbn, scm, scn, at, node.name):
            return
        table = np.zeros((max(nb, 1), 4), np.int64)
        for bi, idx in enumerate(np.ndindex(*batch) if batch else [()]):
            table[bi] = [sum(i * s for i, s in zip(idx, sa_b)), sum(i * s for i, s in zip(idx, sb_b)),
                         sum(i * s for i, s in zip(idx, sc_b)), bi * M * N]
        idx = self.index_type(a.size, b.size, y.size, c.size if c is not None else 0)
        self._gemm_launch(self.args(a), self.args(b), self.args(c) if c is not None else None, self.args(y), table,
                          M, N, K, (sam, sak, sbk, sbn, scm, scn), idx, at.get("act"), at.get("alpha", 1.0),
                          at.get("beta", 1.0), f"{node.name} Gemm")

    def _gemm_launch(self, aa, ba, ca, ya, table, M, N, K, strides, idx, act, alpha, beta, label, where="gemm"):
        """gemm.cl on the device's core: len(table) products y = act(alpha A B + beta C), M x N x K, addressed by
        (buffer, offset) arguments aa..ya (ca None: no C), per-batch offsets `table` and element strides
        (sam, sak, sbk, sbn, scm, scn); y is row-major with N columns. where: the kind of product, for the tuner
        (with the operands' layout: A's rows and B's columns contiguous or not)."""
        nb = len(table)
        layout = f"{'r' if strides[1] == 1 else 'c'}{'r' if strides[3] == 1 else 'c'}"
        core, tiles, lsize, (g0, g1) = self.pick(M, N, K, nb, True, f"{where} {layout}")
        offs = np.asarray(table).reshape(nb, 4)
        aligned = (aa[1] % 4 == 0 and not (offs[:, 0] % 4).any(), ba[1] % 4 == 0 and not (offs[:, 1] % 4).any())
        src = gemm_source(core, tiles, strides, idx, act, ca is not None, aligned)
        args = gemm_args(aa, ba, ca if ca is not None else self.dummy(), ya, self.meta(np.asarray(table).ravel()), M,
                         N, K, strides, idx, alpha, beta)
        self._matrix(src, "gemm", args, core, tiles, lsize, (g0, g1, nb), M, N, K, label)

    def gemv(self, a, b, c, y, M, N, K, sam, sak, sbk, sbn, scm, scn, at, name):
        """A product of at most GEMV_MAX_ROWS rows on a GPU, with B's columns contiguous along k (Gemm transB=1
        weights): gemv.cl (at most GEMV_REG_ROWS rows) or gemv_rows.cl streams B once. False where it does not
        apply (the GEMM core takes it)."""
        if M > GEMV_MAX_ROWS or sak != 1 or sbk != 1 or K % 4 or sam % 4 or sbn % 4 or \
                self.loc(a)[1] % 4 or self.loc(b)[1] % 4 or max(a.size, b.size, y.size) >= 2**31:
            return False
        if M > GEMV_REG_ROWS:
            self.gemv_rows(a, b, c, y, M, N, K, sam, sbn, scm, scn, at, name)
            return True
        LK, LN, NC = GEMV_TILES
        if -(-N // (LN * NC)) < 2 * self.ctx.info.compute_units:
            NC = 1  # fewer columns per work-group where the grid would leave compute units idle
        defs = {"MR": M, "LK": LK, "LN": LN, "NC": NC}
        if c is not None:
            defs["HAS_C"] = 1
        src = _defines(defs) + act_macro(at.get("act")) + kernel_source("gemv")
        args = self.args(a) + self.args(b) + (self.args(c) if c is not None else self.dummy()) + self.args(y) + [
            np.int32(v) for v in (M, N, K, sam, sbn, scm, scn)] + [
            np.float32(at.get("alpha", 1.0)), np.float32(at.get("beta", 1.0))]
        groups = -(-N // (LN * NC))
        self.emit(src, "gemv", args, (groups * LK, LN), (LK, LN), f"{name} Gemm gemv")
        return True

    def gemv_rows(self, a, b, c, y, M, N, K, sam, sbn, scm, scn, at, name):
        """gemv.cl's product for more rows: gemv_mma.cl on NVIDIA tensor cores in tf32 mode, else gemv_rows.cl; K
        split into slices where the column blocks alone leave resident work-group slots idle (partial sums in a free
        block of the arena, else in scratch, summed by gemv_rows_reduce)."""
        mma = GEMV_MMA
        if mma and (-(-M // 16) * 16 * mma["KC"] // 4) % (32 * mma["WARPS"]):
            mma = None  # (a chunk of A is whole float4s per work-item)
        if self.ctx.precision == "tf32" and self.ctx.is_nvidia and mma:
            kernel, tiles = "gemv_mma", mma
            KC = tiles["KC"]
            lsize, cols = (32 * tiles["WARPS"], 1), 8 * tiles["WARPS"] * tiles["NBW"]
            defs = {"MR": M, "WARPS": tiles["WARPS"], "NBW": tiles["NBW"], "KC": KC}
        else:
            kernel, tiles = "gemv_rows", GEMV_ROWS_TILES[min([r for r in GEMV_ROWS_TILES if r >= M] or
                                                             [max(GEMV_ROWS_TILES)])]
            LK, LN, NC, KC = tiles["LK"], tiles["LN"], tiles["NC"], tiles["KC"]
            while 4 * M * KC > self.ctx.info.device.local_mem_size and KC > 4 * LK:
                KC //= 2
            KC4 = KC // 4
            lsize, cols = (LK, LN), LN * NC
            red_rows = max(1, min(M, M * KC // (LN * NC * (LK + 1))))  # rows of partial sums per pass of lane sums
            defs = {"MR": M, "LK": LK, "LN": LN, "NC": NC, "KC4": KC4, "RED_ROWS": red_rows,
                    "LOCAL4": max(M * KC4, -(-LN * NC * red_rows * (LK + 1) // 4))}
            if tiles.get("pf") and (M * KC4) % (LK * LN) == 0:
                defs["PREFETCH_A"] = 1
        blocks, chunks = -(-N // cols), -(-K // KC)
        max_splits = min(chunks, max(1, max(self.arena_room(), SPLITK_SCRATCH_MAX) // (4 * M * N)))
        if GEMV_ROWS_SPLITS:
            splits = min(GEMV_ROWS_SPLITS, max_splits)
        else:  # whole waves of the resident slots, each work-group costing its chunks and about one more
            slots = tiles["per_cu"] * self.ctx.info.compute_units
            splits = min(range(1, max_splits + 1),
                         key=lambda s: (-(-blocks * s // slots) * (-(-chunks // s) + 1), s))
        per_split = -(-chunks // splits)
        splits = -(-chunks // per_split)  # no empty slices
        defs["SPLITS"] = splits
        if c is not None:
            defs["HAS_C"] = 1
        src = _defines(defs) + act_macro(at.get("act")) + kernel_source("gemv_epilogue") + (
            kernel_source("mma_tf32") if kernel == "gemv_mma" else "") + kernel_source(kernel)
        args = self.args(a) + self.args(b) + (self.args(c) if c is not None else self.dummy()) + self.args(y) + [
            np.int32(v) for v in (N, K, sam, sbn, scm, scn)] + [
            np.float32(at.get("alpha", 1.0)), np.float32(at.get("beta", 1.0)), np.int32(per_split)]
        label = f"{name} Gemm {kernel}"
        grid = (blocks * lsize[0], lsize[1] * splits)
        if splits == 1:
            self.emit(src, kernel, args + self.dummy(), grid, lsize, label)
            return
        nbytes = 4 * splits * M * N
        off = self.arena_block(nbytes)
        ws = [self.act_buf, np.uint64(off // 4)] if off is not None else self.dummy()
        self.emit(src, kernel, args + ws, grid, lsize, label + f" splitK{splits}")
        self.emit(src, "gemv_rows_reduce", args + ws, (_round_up(N, 64), M), (64, 1), label + " reduce")
        if off is None:
            for launch in self.launches[-2:]:
                self.use_scratch(launch.kernel, len(args), nbytes, "splitk")

    def gemm_cpu(self, node, a, b, c, y, M, N, K, sam, sak, sbk, sbn, cs):
        """A 2-D Gemm with a constant B on a CPU device: B packed here, once, into panels of NR columns."""
        MR, NV = min(M, GEMM_CPU_TILES["rows"]), GEMM_CPU_TILES["NV"]
        NR = 8 * NV
        NB = -(-N // NR)
        bmat = np.lib.stride_tricks.as_strided(np.asarray(b.const, np.float32).ravel(), (K, N),
                                               (4 * sbk, 4 * sbn))
        packed = np.zeros((K, NB * NR), np.float32)
        packed[:, :N] = bmat
        packed = packed.reshape(K, NB, NR).transpose(1, 0, 2)
        at = node.attrs
        defs = {"MR": MR, "NV": NV}
        if c is not None:
            defs["HAS_C"] = 1
        src = _defines(defs) + act_macro(at.get("act")) + kernel_source("gemm_cpu")
        args = self.args(a) + [self.meta(packed.ravel(), np.float32), np.uint64(0)] + \
            (self.args(c) if c is not None else self.dummy()) + self.args(y) + [
            np.int32(M), np.int32(N), np.int32(K), np.int64(sam), np.int64(sak), np.int64(cs[-2]), np.int64(cs[-1]),
            np.float32(at.get("alpha", 1.0)), np.float32(at.get("beta", 1.0))]
        self.emit(src, "gemm_cpu", args, (-(-M // MR), NB), (1, 1), f"{node.name} Gemm")

    def pick(self, M, N, K, batches, deep, where):
        """pick_tiles, keeping what it chose for a tunable layer: _matrix tags its launches with it (Launch.tile),
        for tuner.tune_layers."""
        record = []
        picked = pick_tiles(self.ctx, M, N, K, batches, deep, where, record)
        self.tile = record[0] if record else None
        return picked

    def _matrix(self, src, name, args, core, tiles, lsize, grid, M, NN, KK, label):
        """Launch a GEMM-shaped kernel; on GPUs split K when the grid alone cannot fill the device."""
        start, tile, self.tile = len(self.launches), self.tile, None
        self._matrix_launches(src, name, args, core, tiles, lsize, grid, M, NN, KK, label)
        for launch in self.launches[start:]:
            launch.tile = tile

    def _matrix_launches(self, src, name, args, core, tiles, lsize, grid, M, NN, KK, label):
        groups = grid[0] // (lsize[0] if lsize else 1) * grid[1] * grid[2]
        per_split = 4 * grid[2] * M * NN  # bytes of partial sums per slice
        room = max(self.arena_room(), SPLITK_SCRATCH_MAX)
        splits = 1
        if core in GPU_CORES:  # every resident slot of the device busy
            from .tuner import tile_model
            target = resident_groups(tiles, tile_model(self.ctx)) * self.ctx.info.compute_units
            splits = pick_splits(groups, target, KK, max_splits=room // per_split)
        opts = TF32_OPTIONS if core == "gemm_mma" else ()
        if splits <= 1:
            self.emit(src, name, args + [self.dummy()[0], np.uint64(0)], grid, lsize, label, opts)
            if core == "gemm_vec":  # the CPU conv path reads im2col's output from the work buffer
                self.use_scratch(self.launches[-1].kernel, len(args), 0, "work")
            return
        src = f"#define SPLITS {splits}\n" + src + kernel_source("gemm_reduce")
        nbytes = per_split * splits
        at = self.arena_block(nbytes)  # the partial sums: a free block of the arena, else their own buffer
        ws = [self.act_buf, np.uint64(at // 4)] if at is not None else [self.dummy()[0], np.uint64(0)]
        self.emit(src, name, args + ws, (grid[0], grid[1], grid[2] * splits), lsize, label + f" splitK{splits}", opts)
        self.emit(src, name + "_reduce", args + ws, (_round_up(NN, 64), M, grid[2]), (64, 1, 1), label + " reduce",
                  opts)
        if at is None:
            for launch in self.launches[-2:]:
                self.use_scratch(launch.kernel, len(args), nbytes, "splitk")

    def arena_room(self):
        """Bytes of the largest block of the activation arena free while the current node runs."""
        return max([stop - start for start, stop in self._free_blocks()] + [0])

    def arena_block(self, nbytes):
        """Byte offset of `nbytes` in the activation arena that are free while the current node runs (the
        planner's plan.free_at), or None where no free block holds them."""
        for start, stop in self._free_blocks():
            if start + nbytes <= stop:
                return start
        return None

    def _free_blocks(self):
        if self.node is None or not self.node.outputs:
            return []
        return [(_round_up(off, 256), off + size if size is not None else self.plan.act_bytes)
                for off, size in self.plan.free_at.get(self.node.outputs[0].id, [])]

    def use_scratch(self, kernel, index, nbytes, pool):
        """Argument `index` of `kernel` is the plan's scratch buffer `pool`, which must hold at least `nbytes`."""
        self.scratch_users.append((kernel, index, pool))
        self.scratch_bytes[pool] = max(self.scratch_bytes.get(pool, 0), nbytes)

    def finish(self):
        """Bind the scratch buffers (one per pool for the plan: its launches run in order) once sizes are known,
        build every program of the plan at once, and bind each launch's arguments to its kernel."""
        for pool, nbytes in self.scratch_bytes.items():
            self.scratch[pool] = self.ctx.alloc(nbytes)
        for kernel, index, pool in self.scratch_users:
            kernel.set_arg(index, self.scratch[pool])
        pending = [launch for launch in self.launches if isinstance(launch.kernel, PendingKernel)]
        self.ctx.build_all([launch.kernel.key for launch in pending])
        for launch in pending:
            try:
                launch.kernel = launch.kernel.bind(self.ctx)
            except cl.Error as e:
                raise ModelError(f"{launch.label}: binding kernel {launch.kernel.name} arguments failed: {e}") from e
        self.keepalive = [b.get() if isinstance(b, Deferred) else b for b in self.keepalive]

    def conv_grad(self, node, which):
        """dW (which="dw") or dX ("dx") of a 1-D/2-D convolution as a GEMM on the device's core."""
        from ..graph.ops.grad_nn import _conv_dims
        dy, other = node.inputs
        out = node.outputs[0]
        x_shape = other.shape if which == "dw" else out.shape
        w_shape = out.shape if which == "dw" else other.shape
        H, W, OH, OW, KH, KW, s, p, d = _conv_dims(x_shape, dy.shape, w_shape, node.attrs)
        N, Cin = x_shape[0], x_shape[1]
        group = node.attrs.get("group", 1)
        K, C = w_shape[0] // group, Cin // group
        CKK, NPIX = C * KH * KW, N * OH * OW
        geo = [np.int32(v) for v in (Cin, H, W, OH, OW, KH, KW, s[0], s[1], p[0], p[1], d[0], d[1])]
        label = f"{node.name} {node.op}"
        if group == Cin and C == 1 and group > 1:  # depthwise: direct kernels (a GEMM per channel wastes its tiles)
            self._dwconv_grad(node, which, N, geo, K, label)
            return
        work = 4 * group * CKK * NPIX
        M, NN, KK = (K, CKK, NPIX) if which == "dw" else (CKK, NPIX, K)
        core, tiles, lsize, (g0, g1) = self.pick(M, NN, KK, group, False, f"{which}{KH}x{KW}s{s[0]}x{s[1]}")
        if which == "dw" and node.attrs.get("winograd"):
            self.winograd_dw(dy, other, out, p, label)
            return
        if which == "dx" and node.attrs.get("winograd"):  # dx = conv(dy, w flipped and transposed), Winograd
            self.winograd(dy, None, self.dummy(), self.dummy(), out, act_macro(None), [2 - p[0], 2 - p[1]], label,
                          w=other, flip=True)
            return
        if which == "dx" and core in GPU_CORES and list(s) == [1, 1] and KH * KW > 1 and \
                p[0] <= d[0] * (KH - 1) and p[1] <= d[1] * (KW - 1):
            # stride 1: dx = conv(dy, w flipped and transposed per group), pads d * (k - 1) - p: no col buffer
            self.emit(kernel_source("im2col"), "flip_weights", self.args(other) + [self.dummy()[0]] + [
                np.int32(v) for v in (group, K, C, KH * KW)] + [np.int64(other.size)], (other.size,), None,
                label + " flip")
            self.use_scratch(self.launches[-1].kernel, 2, 4 * other.size, "wflip")
            n_launch = len(self.launches)
            idx = self.index_type(dy.size, other.size, out.size)
            self._conv_gemm(self.args(dy), self.dummy(), self.dummy(), self.dummy(), self.args(out), act_macro(None),
                            idx, N, group * K, OH, OW, Cin, H, W, KH, KW, [1, 1],
                            [d[0] * (KH - 1) - p[0], d[1] * (KW - 1) - p[1]], list(d), group, label)
            for launch in self.launches[n_launch:]:
                self.use_scratch(launch.kernel, 2, 4 * other.size, "wflip")
            return
        implicit = which == "dw" and core in GPU_CORES  # the GPU cores read dw's windows straight from x
        direct = which == "dx" and KH == KW == 1 and list(s) == [1, 1] and list(p) == [0, 0]
        if which == "dw" and not implicit:  # col = im2col(x)
            total = group * CKK * NPIX
            self.emit(kernel_source("im2col"), "im2col", self.args(other) + [self.dummy()[0]] + geo +
                      [np.int64(Cin * H * W), np.int32(NPIX), np.int64(total)], (total,), None, label + " im2col")
            self.use_scratch(self.launches[-1].kernel, 2, work, "work")
        along = {"B_ALONG_K": 1} if which == "dw" else {"A_ALONG_M": 1}  # col rows / w columns run along k / m
        along["IDX"] = self.index_type(dy.size, other.size, out.size, group * CKK * NPIX)
        if implicit:
            along["IMPLICIT_COL"] = 1
        if direct:
            along["DX_DIRECT"] = 1
        src = _defines(dict(tiles, **along, **{"CONV_DW" if which == "dw" else "CONV_DX": 1})) + \
            kernel_source("window") + kernel_source("conv_grad_gemm") + core_source(core)
        w_args = self.dummy() if which == "dw" else self.args(other)
        y_args = self.args(out) if which == "dw" or direct else self.dummy()
        x_args = self.args(other) if implicit else self.dummy()
        args = self.args(dy) + w_args + y_args + [self.dummy()[0], np.int32(K), np.int32(CKK), np.int32(OH * OW),
                                                  np.int32(NPIX), np.int64(group * K * OH * OW)] + x_args + [
            self.window_table(C, H, W, KH, KW, d) if implicit else self.dummy()[0]] + [
            np.int32(v) for v in (H, W, OW, s[0], s[1], p[0], p[1])] + [np.int64(Cin * H * W), np.int64(C * H * W)]
        n_launch = len(self.launches)
        self._matrix(src, f"conv_{which}", args, core, tiles, lsize, (g0, g1, group), M, NN, KK, label)
        if not implicit and not direct:
            for launch in self.launches[n_launch:]:
                self.use_scratch(launch.kernel, 6, work, "work")  # argument 6: col
        if which == "dx" and not direct:  # dx = col2im(colgrad)
            col_args = [self.dummy()[0]] + self.args(out) + geo + [np.int32(NPIX), np.int64(out.size)]
            self.emit(kernel_source("im2col"), "col2im", col_args, (max(out.size, 1),), None, label + " col2im")
            self.use_scratch(self.launches[-1].kernel, 0, work, "work")

    def _dwconv_grad(self, node, which, N, geo, mult, label):
        dy, other = node.inputs
        out = node.outputs[0]
        Cin, H, W, OH, OW, KH, KW = (int(v) for v in geo[:7])
        src = _defines({"TAPS": KH * KW}) + kernel_source("dwconv_grad")
        if which == "dx":
            self.emit(src, "dw_dx", self.args(dy) + self.args(other) + self.args(out) + geo + [np.int32(mult)],
                      (_round_up(W, 16), _round_up(H, 4), N * Cin), (16, 4, 1), label)
            return
        CO, count = Cin * mult, N * OH * OW
        wg = 64 if self.ctx.is_cpu else 256
        G = max(1, min(-(-8 * self.ctx.info.compute_units // CO), -(-count // (4 * wg))))
        src = f"#define WG {wg}\n" + src
        args = self.args(dy) + self.args(other) + [np.int32(N)] + geo + [np.int32(mult), np.int32(G),
                                                                           self.dummy()[0]]
        self.emit(src, "dw_partial", args, (G * wg, CO), (wg, 1), label + " partial")
        self.use_scratch(self.launches[-1].kernel, len(args) - 1, 4 * CO * G * KH * KW, "splitk")
        args = self.args(out) + [np.int32(CO), np.int32(G), self.dummy()[0]]
        self.emit(src, "dw_finish", args, (CO * KH * KW,), None, label)
        self.use_scratch(self.launches[-1].kernel, len(args) - 1, 4 * CO * G * KH * KW, "splitk")

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
        if x.dtype in ("float32", "float64"):
            lowest = "-INFINITY"
        else:  # INT64_MIN has no literal of its own in C
            lowest = "(-9223372036854775807L - 1)" if x.dtype == "int64" else str(np.iinfo(x.dtype).min)
        head = (("#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" if x.dtype == "float64" else "") +
                _defines({"POOL_MAX" if mode == "max" else "POOL_AVG": 1, "T": DTYPE_TO_C[x.dtype], "LOWEST": lowest}))
        if self.ctx.is_cpu and nsp <= 2:  # one work-item per output row; (H, W) are the last two of the padded dims
            window = {name: v[d] for name, v in (("K", pad3(k, 1)), ("S", pad3(strides, 1)), ("D", pad3(dil, 1)))
                      for d, name in ((1, name + "H"), (2, name + "W"))}
            if x.dtype == "float32":
                window["VEC"] = 1
            args = self.args(x) + self.args(y) + [np.int32(v[d]) for v in (ins, outs, pad3(pads[:nsp], 0))
                                                  for d in (1, 2)] + [np.int32(a.get("count_include_pad", 0))]
            planes = int(np.prod(y.shape[:2], dtype=np.int64))
            # rows per work-item: PoCL's cost per work-group outweighed a short row's (192 x 56 rows of 56: 1.2 ms)
            window["ROWS"] = R = max(1, min(outs[1], POOL_CPU_ROWS * 8 // max(outs[2], 8)))
            self.emit(head + _defines(window) + kernel_source("pool_cpu"), "pool_cpu", args,
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
        if self.ctx.is_cpu:
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
        if x.dtype != "float32":
            raise ModelError(f"node {node.name} ({node.op}): float32 only, got {x.dtype}")
        axis = node.attrs["axis"] % x.rank
        outer = int(np.prod(x.shape[:axis], dtype=np.int64))
        inner = int(np.prod(x.shape[axis + 1:], dtype=np.int64))
        src = _defines({"LOG_SOFTMAX" if log else "SOFTMAX": 1}) + kernel_source("softmax")
        args = self.args(x) + self.args(y) + [np.int32(outer), np.int32(x.shape[axis]), np.int32(inner)]
        self.emit(src, "softmax", args, (max(outer * inner, 1),), None, f"{node.name} {node.op}")

    def layernorm(self, node):
        x, scale, bias = node.inputs
        y = node.outputs[0]
        D = x.shape[-1]
        rows = x.size // max(D, 1)
        args = self.args(x) + self.args(scale) + self.args(bias) + self.args(y) + [
            np.int64(rows), np.int32(D), np.float32(node.attrs["epsilon"])]
        self.emit(kernel_source("layernorm"), "layernorm", args, (max(rows, 1),), None, f"{node.name} LayerNorm")

    REDUCE = {  # mode: (pre, combine, init, post)
        "sum": ("x0v", "acc += v;", "0", "acc"),
        "mean": ("x0v", "acc += v;", "0", "acc / count"),
        "max": ("x0v", "acc = v > acc ? v : acc;", "LOWEST", "acc"),
        "min": ("x0v", "acc = v < acc ? v : acc;", "HIGHEST", "acc"),
        "prod": ("x0v", "acc *= v;", "1", "acc"),
        "l1": ("(x0v < 0 ? -x0v : x0v)", "acc += v;", "0", "acc"),
        "l2": ("x0v * x0v", "acc += v;", "0", "sqrt(acc)"),
        "logsum": ("x0v", "acc += v;", "0", "log(acc)"),
        "logsumexp": ("exp(x0v)", "acc += v;", "0", "log(acc)"),
        "sumsquare": ("x0v * x0v", "acc += v;", "0", "acc"),
    }

    def reduce(self, node):
        y, prologue = node.outputs[0], node.attrs.get("prologue")
        x = prologue[-1].outputs[0] if prologue else node.inputs[0]  # the reduced value (prologue: not stored)
        axes = sorted(a % x.rank for a in node.attrs["axes"])
        keep = [d for d in range(x.rank) if d not in axes]
        if prologue:
            operands, lines = self._pointwise_body(prologue, x.shape)
        else:
            operands, lines = [(x, 0, self.strides(x))], []
        out_dims = [x.shape[d] for d in keep] or [1]
        y_strides = codegen.contiguous_strides(out_dims)
        # reduced dims that are adjacent in every operand (stride = the next one's stride times its extent) merge
        groups = []
        for d in axes:
            if groups and groups[-1][-1] == d - 1 and all(xs[d - 1] == xs[d] * x.shape[d] for _, _, xs in operands):
                groups[-1].append(d)
            else:
                groups.append([d])
        red_dims = [int(np.prod([x.shape[d] for d in g])) for g in groups] or [1]
        x_out, x_red = [], []
        for _, _, xs in operands:  # each operand's strides over the kept dims, then over the reduced ones
            x_out += [xs[d] for d in keep] or [0]
            x_red += [xs[g[-1]] for g in groups] or [0]
        pre, combine, init, post = self.REDUCE[node.attrs["mode"]]
        if prologue:  # the mode's expression reads the prologue's result in place of x0v
            lines.append(f"{codegen._vtype(x.dtype)} p0 = t{len(prologue) - 1};")
            pre = pre.replace("x0v", "p0")
        acc = "float32" if x.dtype in ("float32", "float16") else x.dtype
        ct = DTYPE_TO_C[acc]
        if init == "LOWEST":
            init = "-INFINITY" if acc in ("float32", "float64") else f"({ct}){np.iinfo(acc).min}" \
                if acc != "bool" else "0"
        elif init == "HIGHEST":
            init = "INFINITY" if acc in ("float32", "float64") else f"({ct}){np.iinfo(acc).max}" \
                if acc != "bool" else "1"
        n_out, count = int(np.prod(out_dims)), int(np.prod(red_dims))
        # GPUs: a work-group per output once each output reduces many elements (batch-norm statistics, losses)
        group = REDUCE_GROUP["cpu" if self.ctx.is_cpu else "gpu"]
        group = group if count >= 1024 and n_out < 64 * self.ctx.info.compute_units else 0
        # ... and several work-groups per output where the outputs alone would leave the device short of work
        # (a bias gradient: 64 sums of 800k elements each), their partial results combined by red_finish
        splits = min(-(-REDUCE_GROUPS_PER_CU * self.ctx.info.compute_units // n_out), count // (16 * group)) \
            if group else 1
        splits = max(splits, 1)
        I = self.index_type(x.size, y.size, n_out * splits)
        src = codegen.reduce_source(len(out_dims), len(red_dims), [v.dtype for v, _, _ in operands], acc, y.dtype,
                                    pre, combine, init, post, group, I, prologue=" ".join(lines), splits=splits,
                                    lanes=REDUCE_LANES if self.ctx.is_cpu else 1)
        meta = out_dims + y_strides + x_out + red_dims + x_red
        args = self.args(y) + [a for v, _, _ in operands for a in self.args(v)]
        args.append(self.meta(meta, np.int32 if I == "int" else np.int64))
        if splits > 1:
            nbytes = n_out * splits * np.dtype(acc).itemsize
            self.emit(src, "red", args + [self.dummy()[0]], (n_out * splits * group,), (group,),
                      f"{node.name} Reduce split{splits}")
            self.use_scratch(self.launches[-1].kernel, len(args), nbytes, "splitk")
            self.emit(src, "red_finish", args + [self.dummy()[0]], (n_out,), None, f"{node.name} Reduce finish")
            self.use_scratch(self.launches[-1].kernel, len(args), nbytes, "splitk")
        elif group:
            self.emit(src, "red", args, (n_out * group,), (group,), f"{node.name} Reduce")
        else:
            self.emit(src, "red", args, (n_out,), None, f"{node.name} Reduce")

    def _typed(self, source, dtype, idx_dtype=None):
        d = {"T": DTYPE_TO_C[dtype]}
        if idx_dtype:
            d["IT"] = DTYPE_TO_C[idx_dtype]
        head = "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" if dtype == "float64" else ""
        return head + _defines(d) + kernel_source(source)

    def gather(self, node):
        x, idx = node.inputs
        y = node.outputs[0]
        axis = node.attrs["axis"] % x.rank
        inner = int(np.prod(x.shape[axis + 1:], dtype=np.int64))
        args = self.args(y) + self.args(x) + self.args(idx) + [np.int64(max(idx.size, 1)), np.int64(x.shape[axis]),
                                                               np.int64(inner), np.int64(y.size)]
        self.emit(self._typed("gather", x.dtype, idx.dtype), "gather", args, (max(y.size, 1),), None,
                  f"{node.name} Gather")

    def gather_grad(self, node):
        dy, idx = node.inputs
        dx = node.outputs[0]
        axis = node.attrs["axis"] % dx.rank
        inner = int(np.prod(dx.shape[axis + 1:], dtype=np.int64))
        args = self.args(dx) + self.args(dy) + self.args(idx) + [np.int64(max(idx.size, 1)),
                                                                  np.int64(dx.shape[axis]), np.int64(inner),
                                                                  np.int64(dx.size)]
        self.emit(self._typed("gather", dx.dtype, idx.dtype), "gather_grad", args, (max(dx.size, 1),), None,
                  f"{node.name} GatherGrad")

    def pad(self, node):
        x, y = node.inputs[0], node.outputs[0]
        pads = node.attrs["pads"]
        r = x.rank
        mode = {"constant": 0, "reflect": 1, "edge": 2, "wrap": 3}[node.attrs.get("mode", "constant")]
        if any(p < 0 for p in pads):
            raise ModelError(f"node {node.name} (Pad): negative pads are not supported")
        src = self._typed("pad", x.dtype).replace("#define T", f"#define MODE {mode}\n#define T", 1)
        value = np.asarray(node.attrs.get("value", 0)).astype(x.dtype if x.dtype != "bool" else "uint8")
        args = self.args(y) + self.args(x) + [self.meta(list(y.shape) + list(x.shape) + list(pads[:r])),
                                              np.int32(r), value[()] if value.ndim else value]
        if self.ctx.is_cpu and r > 0 and y.size:
            rows = y.size // y.shape[-1]
            self.emit(src, "pad_rows", args + [np.int64(rows)], (rows,), None, f"{node.name} Pad")
        else:
            self.emit(src, "pad", args + [np.int64(y.size)], (max(y.size, 1),), None, f"{node.name} Pad")

    def alias(self, y, x):
        pass  # a view: the memory plan gave y x's place, in the weight arena where x is a weight

    # ops added for ONNX coverage ------------------------------------------------------
    def argreduce(self, node):
        x, y = node.inputs[0], node.outputs[0]
        if x.dtype == "float16":
            raise ModelError(f"node {node.name} ({node.op}): float16 is not supported (float32/64 and integers are)")
        axis = node.attrs["axis"]
        inner = int(np.prod(x.shape[axis + 1:], dtype=np.int64))
        defs = {"ARG_MAX" if node.attrs["mode"] == "max" else "ARG_MIN": 1}
        if node.attrs.get("select_last", 0):
            defs["SELECT_LAST"] = 1
        src = _defines(defs) + self._typed("argreduce", x.dtype)
        args = self.args(y) + self.args(x) + [np.int64(x.shape[axis]), np.int64(inner), np.int64(y.size)]
        self.emit(src, "argreduce", args, (max(y.size, 1),), None, f"{node.name} {node.op}")

    def _elements_meta(self, node, x, idx):
        return self.meta(list(idx.shape) + self.strides(x)), np.int32(x.rank), np.int32(node.attrs["axis"]), \
            np.int64(x.shape[node.attrs["axis"]])

    def gather_elements(self, node):
        x, idx = node.inputs
        y = node.outputs[0]
        if x.dtype == "float16":
            raise ModelError(f"node {node.name} ({node.op}): float16 is not supported")
        meta, rank, axis, n = self._elements_meta(node, x, idx)
        args = self.args(y) + self.args(x) + self.args(idx) + [meta, rank, axis, n, np.int64(y.size)]
        self.emit(self._typed("gather_elements", x.dtype, idx.dtype), "gather_elements", args, (max(y.size, 1),),
                  None, f"{node.name} {node.op}")

    def scatter_elements(self, node):
        x, idx, upd = node.inputs
        y = node.outputs[0]
        if x.dtype == "float16":
            raise ModelError(f"node {node.name} ({node.op}): float16 is not supported")
        ys = self.strides(y)
        self._elementwise(y, 0, ys, [(x, 0, ys)], "r0 = x0v;", f"{node.name} copy")
        meta, rank, axis, n = self._elements_meta(node, x, idx)
        red = node.attrs.get("reduction", "none")
        src = self._typed("gather_elements", x.dtype, idx.dtype)
        if red != "none":
            src = f"#define RED_{red.upper()} 1\n" + src
        args = self.args(y) + self.args(upd) + self.args(idx) + [meta, rank, axis, n, np.int64(idx.size)]
        self.emit(src, "scatter_elements", args, (1,), None, f"{node.name} {node.op}")
