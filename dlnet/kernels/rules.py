"""Selection rules: the tile tables of the matrix cores and the pure functions that pick a tile, a split of K or a
CPU blocking for a problem on a device. They read a Device (device.py), Options (options.py) and, where given, what
was measured (the tuner's tile model and per-layer tiles); they emit nothing and need no device to test."""
from .device import TILED_CORES

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
    # (STAGES: K slices of the tf32 core's cp.async pipeline)
    "tf32": {"core": "gemm_mma", "huge": dict(TM=128, TN=128, TK=16, WARPS_M=2, WARPS_N=2, STAGES=4),
             "big": dict(TM=64, TN=64, TK=16, WARPS_M=2, WARPS_N=2, STAGES=4),
             # products of at most 64 rows, many columns and K >= 256 (64-channel convolutions): warps of 64 x 32,
             # not the big tile's 32 x 32, so fewer fragment reads per mma (H200, vgg16 b16 features.2: 0.925 ->
             # 0.874 ms; features.0, K = 27, lost: 0.27 -> 0.34)
             "wide": dict(TM=64, TN=128, TK=16, WARPS_M=1, WARPS_N=4, STAGES=4),
             # the big tile's place for products of at least 128 rows and depth 512 whose slices of 32 are whole
             # (plain products, 1x1 convolutions, tap-major ones of 32k channels): twice the depth per barrier and per
             # window-table entry, twice the rows per fetched B column. H100 batch 16, kernel ms against 64x64x16
             # (`bench/probes/tf32_tiles.py`): alexnet features.6 0.083 -> 0.060, resnet50's 3x3 stride-2 layers
             # 0.072 / 0.121 / 0.114 -> 0.058 / 0.083 / 0.088, its 1x1 layers on 7x7 0.045 / 0.038 -> 0.042 / 0.033;
             # 256 -> 512 1x1 at 14x14 (depth 256) lost, 0.020 -> 0.028. Three stages: four would hold one per SM.
             "tall": dict(TM=128, TN=64, TK=32, WARPS_M=2, WARPS_N=2, STAGES=3),
             # the huge tile's place where 96 rows pad M less than 128 do: alexnet features.3 (192 output channels,
             # two tiles of 128 rows = 256) 0.134 -> 0.112 ms
             "huge96": dict(TM=96, TN=128, TK=16, WARPS_M=2, WARPS_N=2, STAGES=4)},
    # gemm_ldsm.cl, the ldmatrix-fed tensor-core core: A k-contiguous, B [N, K] (a weight stored so at load); one
    # tile (bench/probes/ldsm_gemm.py, H100: 4096^3 157 TFLOP/s, ViT's 3152 x 3072 x 768 104, against cuBLAS 344 / 160)
    "ldsm_tf32": {"core": "gemm_ldsm", "huge": dict(TM=128, TN=128, TK=32, WARPS_M=2, WARPS_N=2, STAGES=3, GROUP_M=8,
                                                    TF32=1, B_NK=1)},
    # ... in f16 (precision "fp16", A and B stored in half; B [K, N] through ldmatrix.trans, or [N, K]): H200 4096^3
    # 325 TFLOP/s against cuBLAS fp16's 604, ViT-B/16 b16's 3152 x 3072 x 768 199 against 395 (fragments
    # double-buffered, LDSM_PIPE: 128 x 128 x 64 in 3 stages without it gave 301 and 183); the 64 x 64 tile where
    # 128 x 128 tiles leave compute units idle
    "ldsm_f16": {"core": "gemm_ldsm",
                 "huge": dict(TM=128, TN=128, TK=32, WARPS_M=2, WARPS_N=2, STAGES=4, GROUP_M=8, F16=1, LDSM_PIPE=1),
                 "big": dict(TM=64, TN=64, TK=64, WARPS_M=2, WARPS_N=2, STAGES=3, GROUP_M=8, F16=1)},
    # gemm_wgmma.cl (Hopper's wgmma; f16 A and B K-major, or transposed where matmul's _ldsm_f16 sends them there:
    # those tables without B_NK then), one tile: 128 x 128 in 3 stages (96 KiB), so that two
    # work-groups share a compute unit and one's epilogue (bias, GELU, half stores) overlaps the other's products.
    # H200, transformer layers with their epilogues (bench/probes/wgmma_layers.py, ms): 4096 x 768 -> 3072 + GELU
    # 0.096 against 0.148 for 128 x 256 in 4 stages (one work-group a unit) and 0.157 on gemm_ldsm.cl; the bare
    # product alone prefers 128 x 256 (4096^3 490 TFLOP/s against cuBLAS fp16's 624: bench/probes/wgmma_gemm.py)
    # Deep products (K >= Options.wgmma_deep_k) with a grid of 128 x 256 tiles that fills the device take those, in 4
    # stages (192 KiB, one work-group a unit): their epilogue is short beside the K loop. H200, Gemm kernel ms
    # (bench/probes/wgmma_layers.py), 128 x 128 / 3 against 128 x 256 / 4: f16 8192^3 2.62 / 2.36, 4096^3 0.364 /
    # 0.355, but with GELU 0.389 / 0.465 (one work-group a unit: no other one's products under its epilogue); tf32
    # 4096^3 0.854 / 0.754, with GELU 0.899 / 0.846. Tried again once a slice's copies were cheap (session 37, same
    # probe, tf32 / f16 ms at 4096 x 768 -> 3072): 128 x 256 / 3 0.179 / 0.120, 256 x 128 / 3 0.189 / 0.120, 128 x 128
    # in 4 or 6 stages (one work-group a unit) 0.186 / 0.111 and 0.181 / 0.108, against 0.134 / 0.074 on 128 x 128 / 3.
    # WG_WAIT: wgmma groups a warpgroup leaves running at the end of a slice (gemm_wgmma.cl). 128 x 128 waits for all
    # (copies then go 2 slices ahead): H200, bench/probes/wgmma_layers.py, Gemm kernel ms, WG_WAIT 1 / 0, f16 4096 x
    # 3072 -> 768 0.0628 / 0.0557, with GELU 0.0679 / 0.0572; tf32 0.1344 / 0.1240, 4096 x 768 -> 3072 0.1358 /
    # 0.1309 (every layer shape the same or faster; with the per-chunk address arithmetic of session 36 it was slower)
    "wgmma_f16": {"core": "gemm_wgmma",
                  "huge": dict(TM=128, TN=128, TK=64, WG=2, STAGES=3, GROUP_M=8, F16=1, B_NK=1, WG_WAIT=0),
                  "deep": dict(TM=128, TN=256, TK=64, WG=2, STAGES=4, GROUP_M=8, F16=1, B_NK=1, WG_WAIT=1)},
    # ... on float A and B read as tf32 (precision "tf32"), 32 floats a 128-byte row, rounded in shared memory
    "wgmma_tf32": {"core": "gemm_wgmma",
                   "huge": dict(TM=128, TN=128, TK=32, WG=2, STAGES=3, GROUP_M=8, TF32=1, B_NK=1, WG_WAIT=0),
                   "deep": dict(TM=128, TN=256, TK=32, WG=2, STAGES=4, GROUP_M=8, TF32=1, B_NK=1, WG_WAIT=1)},
    "cpu": {"core": "gemm_vec", "huge": dict(RM=8), "big": dict(RM=8), "narrow_m": dict(RM=1), "narrow_n": dict(RM=8)},
}
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
# channels, which fill half or three quarters of a 128-row tile
GPU_TILE_MODEL["wide"] = dict(per_cu=4, rate=29.0, k0=26)


def tile_estimate(shape, M, N, K, batches, compute_units, tile_model):
    """Relative time of an M x N x K product (`batches` of them) on GEMM_TILES["gpu"][shape], by a tile model
    (GPU_TILE_MODEL's form: tuner.tile_model)."""
    t, model = GEMM_TILES["gpu"][shape], tile_model[shape]
    groups = -(-M // t["TM"]) * -(-N // t["TN"]) * batches
    waves = -(-groups // (model["per_cu"] * compute_units))  # a grid short of one wave is split along K later
    return waves * model["per_cu"] * t["TM"] * t["TN"] * (K + model["k0"]) / model["rate"]



GPU_CORES = TILED_CORES

# Products of at most this many rows (fully connected layers at small batches) run as gemv.cl where B's columns are
# contiguous along k: bound by reading B. H100 (probe of 6 configs, kernel time): 1 x 4096 x 25088 0.143 ms (2.9
# TB/s) against the GEMM core's 0.518 and cuBLAS's 0.159; 4 x 4096 x 9216 0.059 against 0.200 and 0.095; at 16 rows
# it lost (0.98 against the core's 0.63: every row of A is re-read per column group). Its work-groups: LK
# work-items along k times LN column groups of NC columns. Products of GEMV_REG_ROWS < M <= GEMV_MAX_ROWS rows run as
# gemv_rows.cl instead (A's rows from __local memory, split-K); device_passes keeps B as it comes (transB=1) for all
# of them. Options.gemv_max_rows.
GEMV_REG_ROWS = 8
GEMV_TILES = (64, 2, 2)
# gemv_rows.cl per largest row count: LK lanes along k x LN column groups of NC columns per work-group, chunks of KC
# floats of K (A's rows for a chunk in __local memory: MR x KC floats), work-groups resident per compute unit for
# the split-K choice (registers: about MR x NC accumulators + 4 NC per work-item), and pf: the next chunk of A read
# ahead into registers (PREFETCH_A, where the chunk is whole float4s per work-item); Options.gemv_rows_tiles
# replaces the table. H100 (`python3 bench/gpu_gemv.py --rows
# [--prefetch]`, kernel time with B out of L2, ms; cuBLAS in brackets): 16 rows, 8,16,4,512,2 with pf against the
# earlier 8,16,4,256,3 without: x 4096 x 25088 0.179 / 0.196 (0.231), x 9216 0.080 / 0.085 (0.106), x 4096 0.044
# / 0.050 (0.061), 1000 x 4096 0.021 / 0.021 (0.049); 32 rows, 16,16,4,256,2 with pf: 0.272 / 0.360 (0.242), 0.115
# / 0.144 (0.102), 0.063 / 0.082 (0.056), 0.028 / 0.024 (0.028); 12 rows x 9216: 8,16,4,128,3 with pf 0.080 / 0.085,
# the 16-row config 0.098
GEMV_ROWS_TILES = {12: dict(LK=8, LN=16, NC=4, KC=128, per_cu=3, pf=1),
                   16: dict(LK=8, LN=16, NC=4, KC=512, per_cu=2, pf=1),
                   32: dict(LK=16, LN=16, NC=4, KC=256, per_cu=2, pf=1)}
# gemv_cols.cl's two products of B stored [K, N] (a fully connected layer's gradients at a small batch: dX = dy W
# over few rows, dW = dy^T x over a short K): gemv_cols's LN lanes of 4 columns x LK lanes along k, chunks of KC rows
# of B, work-groups resident per compute unit (MR float4 accumulators); gemm_outer's LN lanes of 4 columns, RM rows
# each. H200 (`python3 bench/probes/fc_grads.py --cols ... --outer ...`, kernel ms at batch 16): 64,4,64,2 against
# 32,8,64,2: 16 x 9216 x 4096 0.071 / 0.080, x 25088 0.189 / 0.199; gemm_outer 64,8 0.077 at 4096 x 9216 x 16
# (64,4 0.083, 32,8 0.089, 128,8 0.077).
GEMV_COLS_TILES = dict(LN=64, LK=4, KC=64, per_cu=2)
OUTER_TILES = dict(LN=64, RM=8)
# tf32 mode on NVIDIA: gemv_mma.cl in place of gemv_rows.cl: Options.gemv_mma (measurements in bench/RESULTS.md,
# session 18)


# CPU convolutions (conv_cpu.cl): MR x 8*NV outputs per work-item held in MR*NV float8 accumulators (AVX2 has 16
# registers). On 2 EPYC (znver3) cores through PoCL 3.0, 6x16 ran resnet50's GEMM shapes at 120-145 GFLOP/s with
# packed weights; 12x8 pads fewer columns where a layer's pixel count is small (7x7 = 49: 56 columns against 64).
CONV_CPU_TILES = {"wide": dict(MR=6, NV=2), "narrow": dict(MR=12, NV=1)}


# CPU Gemm with a constant B (gemm_cpu.cl): rows of A per tile up to 6 (a batch-1 fully connected layer is M = 1,
# so MR = M there: no duplicated rows), 16 packed columns per panel.
GEMM_CPU_TILES = {"rows": 6, "NV": 2}


def pick_conv_cpu_tiles(NN):
    """The CONV_CPU_TILES entry for NN output columns: narrow where 16-column panels would pad more than 15%."""
    return CONV_CPU_TILES["narrow" if _round_up(NN, 16) > 1.15 * NN else "wide"]




# CPU convolutions over small maps with many channels (conv_cpu.cl's conv2d_cpu_pixels): output pixels as MR rows,
# output channels as whole 16-column panels; MR from these, the one that pads the pixels least (49 = 7 x 7: 50 at 5,
# where 16- or 8-column panels of pixels computed 64 or 56). At MR = 7 (14 float8 accumulators, 2 of B and the
# broadcast: 17 registers) PoCL's code spilled: resnet50's 7x7 layers ran 1.5x slower than at 6; 5 and 6 ran 5-15%
# faster than the pixel panels there (bench/RESULTS.md, cpu4).
CONV_CPU_PIXEL_ROWS = (6, 5)
CONV_CPU_PIXEL_COLS = 16
# ... the last panel's channels past K zero, where that pads K by at most this factor (1000 -> 1008)
CONV_CPU_PIXEL_PAD = 1.02
# ... where each packed pixel panel serves at least 8 channel panels (K >= 128), and 1x1 stride-1 layers (whose pixel
# panels the other path packs as vectors) from 512 channels: one-layer kernel times at 7x7, pixels against panels,
# densenet121's 3x3 128 -> 32 0.065 -> 0.130 ms, inception's 1x1 832 -> 48 0.064 -> 0.134 and 832 -> 384 0.382 ->
# 0.405, its 3x3 192 -> 384 0.800 -> 0.768 and 5x5 48 -> 128 0.291 -> 0.236, resnet50's 1x1 512 -> 2048 0.629 -> 0.571
CONV_CPU_PIXEL_MIN_K = 128
CONV_CPU_PIXEL_MIN_K_1X1 = 512


def pick_conv_cpu_pixels(NN, K, KK, pointwise, max_pixels, local_mem):
    """MR (pixels per tile) for conv2d_cpu_pixels with NN output pixels, K output channels (per group), KK taps, a
    1x1 stride-1 layer or not; or None where it does not apply: more pixels than max_pixels, K padded to whole panels
    of CONV_CPU_PIXEL_COLS by more than CONV_CPU_PIXEL_PAD or under the minimum, or a KK x MR panel over local
    memory."""
    min_k = CONV_CPU_PIXEL_MIN_K_1X1 if pointwise else CONV_CPU_PIXEL_MIN_K
    if NN > max_pixels or round_up(K, CONV_CPU_PIXEL_COLS) > CONV_CPU_PIXEL_PAD * K or K < min_k:
        return None
    mr = min(CONV_CPU_PIXEL_ROWS, key=lambda r: (round_up(NN, r), -r))
    return mr if 4 * KK * mr <= local_mem else None


def round_up(n, m):
    return (n + m - 1) // m * m


_round_up = round_up

# Split-K's partial sums go to a block of the activation arena free at their layer; a split whose partials need
# more than such a block has is taken only up to this many bytes, in a buffer of their own.
SPLITK_SCRATCH_MAX = 4 << 20
# Split-K: at most this many slices (a single tile of a first layer's weight gradient, 64 x 27 x 800k at batch 16,
# took 1.97 ms in 64 slices on an H100's 132 SMs)
SPLITK_MAX = 256
# GPU convolutions take their depth tap by tap where channels are a multiple of this (every GPU tile's TK divides it)
TAP_MAJOR_MULTIPLE = 16


def resident_groups(tiles, tile_model, options):
    """Work-groups of these tiles one compute unit holds at once: the tile model's figure for the fp32 GPU tiles
    (a 1x1 convolution's variant too), else the options' tf32 figures."""
    for shape, model in tile_model.items():
        if all(tiles.get(k) == v for k, v in GEMM_TILES["gpu"][shape].items()):
            return model["per_cu"]
    if all(tiles.get(k) == v for k, v in GEMM_TILES["tf32"]["tall"].items()):
        return options.tf32_tall_resident
    return options.tf32_resident


def plane_phases(geo):
    """planes.cl's SHP * SWP: the phase planes stored per channel for geo's strides (KHC, KWC, SHC, SWC, DHC, DWC)."""
    return (geo["SHC"] if geo["KHC"] > 1 and geo["DHC"] % geo["SHC"] else 1) * \
        (geo["SWC"] if geo["KWC"] > 1 and geo["DWC"] % geo["SWC"] else 1)


# dwconv.cl's dwconv2d_tiled (GPUs: stride 1, dilation 1, one output channel per input channel) up to 9 x 9 taps
DW_TILED_MAX_TAPS = 81


def dw_tile(OW, OH):
    """(TX, TY, PX) of dwconv2d_tiled for an OH x OW output plane: TX work-items along a row (each PX outputs, TX
    apart), TY rows, at most 256 work-items; the smallest block that still covers narrow planes (ConvNeXt's 7 x 7 and
    14 x 14) in one or two groups."""
    tx = 32 if OW > 16 else 16 if OW > 8 else 8
    px = 2 if OW > 48 else 1
    ty = min(256 // tx, 8 if OH > 16 else 1 << max(OH - 1, 0).bit_length())
    return tx, ty, px


def dw_rows(OH, OW, planes, options):
    """Rows per work-item of dwconv_cpu.cl for OH x OW outputs in each of `planes` (image, channel) planes."""
    rows = max(1, min(OH, -(-options.dw_min_outputs // OW)))
    while rows > 1 and planes * -(-OH // rows) < options.dw_min_items:
        rows //= 2
    return rows


def direct_row_tiles(OW, Wq, NR):
    """Panels of NR positions per output row for conv_cpu.cl's ROW_TILES, or 0: where they compute no more positions
    than the planes' rows of Wq (stems: squeezenet 1.1's 3 -> 64 0.350 -> 0.304 ms, shufflenet's 3 -> 24 0.160 ->
    0.138, resnet50's 1.48 -> 1.31; resnet50's 3x3 stride-2 56 -> 28, rows of 2 x 16 for 28 outputs, ran 1.25 ->
    1.33)."""
    tiles = -(-OW // NR)
    return tiles if OW >= NR and tiles * NR <= Wq else 0


def dw_row_block(OW, accs):
    """(VC, RB) of dwconv_cpu.cl's row blocks for rows of OW outputs: VC float8s of a row by RB rows, about `accs`
    accumulators (VC at most accs, RB rows of rows narrower)."""
    vc = min(-(-OW // 8), accs)
    return vc, max(1, accs // vc)


def pick_splits(groups, target, K, k0=32, max_splits=SPLITK_MAX):
    """Slices of K for a grid of `groups` work-groups on `target` resident slots: the count with the least time in
    whole waves, waves(groups * s) * (K / s + k0) (k0: a tile's fixed cost, GPU_TILE_MODEL), where that beats one
    slice by 10% (the partial sums cost a reduction pass); at most SPLITK_MAX (and max_splits) slices of at least
    256. A count that spills into one more wave loses: alexnet's batch-16 fully connected layers had split 9 ways
    into 576 work-groups on 528 slots (two waves) where 8 fill one."""
    if groups >= target or K < 512:
        return 1

    def cost(s):
        return -(-groups * s // target) * (K / s + k0)
    best = min(range(1, max(1, min(SPLITK_MAX, K // 256, max_splits)) + 1), key=lambda s: (cost(s), s))
    return best if cost(best) < 0.9 * cost(1) else 1


def wino_chunk(T, nbytes, C, K, options, nx=16):
    """Tiles per chunk of a Winograd layer of T tiles (nx transformed values each) whose V and M (or dW's V and E)
    get nbytes: all of them, else a multiple of 256 and at least options.winograd_min_tiles."""
    TC = min(T, nbytes // (4 * nx * (C + K)))
    return TC if TC == T else max(TC // 256 * 256, min(T, options.winograd_min_tiles))


def tf32_core(dev, options, M, N, K):
    """Does an M x N x K product run on the tensor cores (tf32 and fp16 modes on NVIDIA; small, shallow ones stay
    fp32)?"""
    lo, hi = options.tf32_fp32_k
    return dev.mma and min(M, N) >= 32 and not lo <= K < hi


def ldsm_product(dev, options, M, N, K):
    """Does an M x N x K product with a constant B run on gemm_ldsm.cl (B then stored [N, K])?"""
    rows = options.ldsm_min_rows
    return bool(rows) and dev.ldsm_tf32 and M >= rows and N >= rows and K >= 64 and K % 4 == 0 and N % 4 == 0 \
        and not options.tf32_fp32_k[0] <= K < options.tf32_fp32_k[1]


def wgmma_product(dev, options, M, N, K):
    """Does an M x N x K product run on gemm_wgmma.cl (Hopper; B then stored [N, K])? Half A and B (precision
    "fp16"), or float A and B in tf32 outside options.tf32_fp32_k (rows of 16 bytes: K a multiple of 8 halves or 4
    floats)."""
    if not (dev.wgmma and options.wgmma and min(M, N) >= 64 and N % 8 == 0):
        return False
    lo, hi = options.tf32_fp32_k
    return K % 8 == 0 if dev.half_storage else dev.tensor_cores and K % 4 == 0 and not lo <= K < hi


def wgmma_tiles(dev, options, M, N, K, act=None):
    """gemm_wgmma.cl's tiles for an M x N x K product (f16 or tf32 by the precision) with a fused activation `act`
    or none, or None where it does not run."""
    if not wgmma_product(dev, options, M, N, K):
        return None
    table = GEMM_TILES["wgmma_f16" if dev.half_storage else "wgmma_tf32"]
    deep = table["deep"]
    if K >= options.wgmma_deep_k and -(-M // deep["TM"]) * -(-N // deep["TN"]) >= dev.compute_units and \
            (act is None or not dev.half_storage):  # (f16: a GELU epilogue left 128 x 256 behind, 0.465 / 0.389 ms)
        tiles = deep
    else:
        tiles = table["huge"]
    return tiles if options.wgmma_wait < 0 else dict(tiles, WG_WAIT=options.wgmma_wait)


# gemm_wgmma.cl's fixed cost a tile in units of K, for split-K (pick_splits): its pipeline's fill and its epilogue
WGMMA_K0 = 256


def wgmma_resident(tiles):
    """gemm_wgmma.cl's work-groups of these tiles a Hopper unit holds at once: its 228 KiB of shared memory over
    the tile's stages (128 x 128 in 3 stages: 2; 128 x 256 in 4: 1)."""
    return max(1, (228 << 10) // (tiles["STAGES"] * (tiles["TM"] + tiles["TN"]) * 128 + (1 << 10)))


def ldsm_f16_tiles(dev, options, M, N, K, batches, k_rows=True):
    """gemm_ldsm.cl's f16 tiles for an M x N x K product (`batches` of them) whose A and B are stored in half
    (NVIDIA, precision "fp16"), or None where it does not run: N, and K where an operand's rows run along k
    (k_rows), whole 16-byte rows."""
    if not (dev.is_nvidia and dev.half_storage and options.ldsm_f16 and min(M, N) >= 16 and
            (K % 8 == 0 or not k_rows) and N % 8 == 0):
        return None
    table, huge = GEMM_TILES["ldsm_f16"], GEMM_TILES["ldsm_f16"]["huge"]
    groups = -(-M // huge["TM"]) * -(-N // huge["TN"]) * batches
    return table["huge" if groups >= dev.compute_units else "big"]


def rule_shape(dev, options, M, N, K, batches, deep, tile_model=GPU_TILE_MODEL):
    """(tf32 core or not, tile shape) by rule for an M x N x K product (`batches` of them)."""
    tf32 = tf32_core(dev, options, M, N, K)
    fill, units = options.tf32_huge_fill, dev.compute_units
    huge = GEMM_TILES["tf32"]["huge"]
    if M <= 4 and N > 16:
        shape = "narrow_m"
    elif N <= 4 and M > 16:
        shape = "narrow_n"
    elif dev.core == "gemm_core" and not tf32:  # (the GPU table forced onto a CPU device in tests too)
        shape = min(tile_model, key=lambda s: tile_estimate(s, M, N, K, batches, units, tile_model))
    elif M >= 96 and N >= 2048 and (dev.is_cpu or -(-M // huge["TM"]) * -(-N // (huge["TN"] if tf32 else 128)) *
                                    batches >= fill * units):
        shape = "huge"
    elif tf32 and options.tf32_wide and M <= 64 and N >= 2048 and K >= 256 and \
            -(-N // GEMM_TILES["tf32"]["wide"]["TN"]) * batches >= fill * units:
        shape = "wide"
    else:
        shape = "big"
    if tf32 and options.tf32_tall:
        if shape == "big" and deep and M >= 128 and K >= 512:
            shape = "tall"
        elif shape == "huge" and -(-M // 96) * 96 < -(-M // huge["TM"]) * huge["TM"]:
            shape = "huge96"
    if tf32 and dev.tf32x3 and shape in ("huge", "huge96", "tall"):
        # fp32 split in tf32 halves (gemm_mma.cl's TF32X3): warps of 4 x 4 mma blocks, whose six mma of 16 of depth go
        # into one sum. H200, kernel ms (bench/probes/tf32x3.py --x3-tiles): 3152 x 768 -> 2304 huge96 0.225, huge
        # 0.235, wide 0.202; 4096 x 3072 -> 768 tall 0.444, wide 0.337; 3152 x 768 -> 3072 huge96 0.265, wide 0.280
        shape = "wide"
    return tf32, shape


def tile_options(dev, M, N, deep, tile_model=GPU_TILE_MODEL):
    """The tiles (as "gpu:shape" / "tf32:shape") a product may take where measured (tuner.tune_layers): the fp32
    GPU core's shapes, and on NVIDIA in tf32 and fp16 modes the tensor-core ones (the tall tile only where slices of
    32 along K are fine); none where the device runs no tiled core (CPUs' gemm_vec)."""
    if not dev.tiled:
        return ()
    options = tuple(f"gpu:{s}" for s in tile_model)
    if dev.mma and min(M, N) >= 32:
        options += tuple(f"tf32:{s}" for s in ("huge", "huge96", "big", "wide") + (("tall",) if deep else ()))
    return options


def tile_table(dev, tf32, shape):
    """The GEMM_TILES table a tile of this kind and shape comes from."""
    if tf32 and shape in GEMM_TILES["tf32"]:
        return GEMM_TILES["tf32"]
    return GEMM_TILES["gpu" if dev.tiled else "cpu"]


def core_tiles(dev, options, tiles, core):
    """A core's tiles as dev runs them: the fp32 core on NVIDIA through the cp.async pipeline (options.fp32_stages);
    the tf32 cores' in fp32 with operands split in tf32 halves (dev.tf32x3)."""
    if core in ("gemm_mma", "gemm_ldsm") and dev.tf32x3 and tiles.get("TF32", core == "gemm_mma"):
        return dict(tiles, TF32X3=1)
    if core == "gemm_mma" and dev.mma_emulated:  # (tests: mma.sync and cp.async emulated, gemm_fetch.cl, mma_emu.cl)
        return dict(tiles, MMA_EMULATED=1)
    if core != "gemm_core" or not dev.cp_async or not options.fp32_stages:
        return tiles
    return dict(tiles, STAGES=max(2, options.fp32_stages))


def core_threads(tiles):
    """Work-items per work-group of gemm_core.cl with these tiles (NTHREADS)."""
    return (tiles["TM"] // tiles["WM"]) * (tiles["TN"] // tiles["WN"])


def b_vec_fits(core, tiles):
    """Do a B tile's 16-byte copies (gemm_fetch.cl's B_VEC, B_CVEC) divide among the core's work-items?"""
    return core == "gemm_mma" or tiles["TK"] * tiles["TN"] // 4 % core_threads(tiles) == 0


def tile_label(core, tiles):
    """How a tile prints in the IR: 128x64 (TM x TN; x TK where the core's depth slice is not its usual 8)."""
    if core == "gemm_vec":
        return f"{tiles['RM']}x8"
    return f"{tiles['TM']}x{tiles['TN']}" + (f"x{tiles['TK']}" if tiles.get("TK", 8) not in (8, 16) else "") + \
        split_mark(tiles)


def split_mark(tiles):
    """How a tile of operands split in tf32 halves (TF32X3) is marked where it prints."""
    return "/3xtf32" if tiles.get("TF32X3") else ""


def launch_geometry(core, tiles, M, N):
    """(local size, global size) of gemm.cl-shaped kernels for M x N outputs on a core with these tiles."""
    if core == "gemm_vec":  # 8 columns per work-item as float8
        return None, (-(-N // 8), -(-M // tiles["RM"]))
    if core == "gemm_wgmma":
        nthreads = 128 * tiles["WG"]
    elif core in ("gemm_mma", "gemm_ldsm"):
        nthreads = 32 * tiles["WARPS_M"] * tiles["WARPS_N"]
    else:
        nthreads = core_threads(tiles)
    return (nthreads, 1, 1), (-(-N // tiles["TN"]) * nthreads, -(-M // tiles["TM"]))


class Pick:
    """A matrix product's tile: the core, its defines, local and global size, the tile's name ("gpu:huge",
    "tf32:tall", "cpu:big") and, where the layer could take several, its tuner key and those names."""
    __slots__ = ("core", "tiles", "lsize", "grid", "name", "key", "choices")

    def __init__(self, core, tiles, lsize, grid, name, key=None, choices=()):
        self.core, self.tiles, self.lsize, self.grid = core, tiles, lsize, grid
        self.name, self.key, self.choices = name, key, choices

    def __iter__(self):  # core, tiles, lsize, grid
        return iter((self.core, self.tiles, self.lsize, self.grid))

    @property
    def label(self):
        return tile_label(self.core, self.tiles)


def pick_tiles(dev, options, M, N, K, batches=1, deep=True, where="gemm", measured=None):
    """The tile for `batches` M x N products of depth K; deep: slices of 32 along K are fine (a convolution's
    tap-major depth must hold whole slices of them). `measured` (tuner.Measured) supplies the device's tile model
    and the tile measured best for this layer (`where` names the caller's kind of product), which replaces the
    rule's."""
    model = measured.tile_model if measured is not None else GPU_TILE_MODEL
    tf32, shape = rule_shape(dev, options, M, N, K, batches, deep, model)
    choices = tile_options(dev, M, N, deep, model) if shape not in ("narrow_m", "narrow_n") else ()
    key = None
    if choices:
        key = f"{where} {M}x{N}x{K}x{batches}{' deep' if deep else ''}"
        name = f"{'tf32' if tf32 else 'gpu'}:{shape}"
        if measured is not None:
            name = measured.layer_tile(key, name, choices)
        kind, shape = name.split(":")
        tf32 = kind == "tf32"
    table = tile_table(dev, tf32, shape)
    tiles = core_tiles(dev, options, table[shape], table["core"])
    lsize, grid = launch_geometry(table["core"], tiles, M, N)
    kind = "tf32" if table["core"] == "gemm_mma" else ("gpu" if dev.tiled else "cpu")
    return Pick(table["core"], tiles, lsize, grid, f"{kind}:{shape}", key, choices)
