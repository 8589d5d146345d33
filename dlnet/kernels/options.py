"""Options: every tunable of the kernels in one frozen object that travels with the Context.

Each default carries the one-line measured reason for it (the long measurements are in bench/RESULTS.md). The
environment is read once, by `Options.from_env()`, and only for the knobs the README's table documents;
`DLNET_OPTIONS="name=value,..."` sets any field for an experiment. Tests build `Options(...)` and hand it to
`Context(..., options=...)` or `ctx.with_options(...)`.
"""
import dataclasses
import os
from dataclasses import dataclass, field, fields

from ..errors import DeviceError


@dataclass(frozen=True)
class Options:
    # --- run-time settings (documented environment knobs) -------------------------------------------------------
    cache_dir: str = ""  # DLNET_CACHE; "" = ~/.cache/dlnet (XDG_CACHE_HOME); "none" = no cache
    tune: str = ""  # DLNET_TUNE: "" measure unknown GPUs' tile model once, "0" never, "1" always (H100 too)
    tune_layers: str = ""  # DLNET_TUNE_LAYERS: "1" measure each layer's tile where not yet done, "0" ignore them
    build_processes: int = 0  # DLNET_BUILD_PROCS: compile workers for a cold plan (0: 8 on NVIDIA, else 1)
    build_threads: int = 0  # DLNET_BUILD_THREADS: programs built at once in-process (0: min(8, cores))
    build_options: tuple = ()  # DLNET_BUILD_OPTIONS: extra OpenCL build flags, e.g. -cl-nv-verbose
    binary_cache: bool = False  # DLNET_BINARY_CACHE=1: keep program binaries on disk (PoCL caches its own)
    debug_bounds: bool = False  # DLNET_DEBUG_BOUNDS=1: guard bytes after every arena, checked after each run
    # the CPU device's worker threads (PoCL's), fixed for the process by its first Context (0: one per core);
    # Context(threads=N) sets it, as onnxruntime's intra_op_num_threads does
    threads: int = 0
    # the PyTorch bridge on NVIDIA (cuda_share.py): torch's stream waits for dlnet's launches on the GPU, not the
    # host (False: the host waits for the queue)
    cuda_device_wait: bool = True
    # ... and the plan's kernels (their PTX, as NVIDIA's OpenCL built them) launched by CUDA on torch's stream, in
    # torch's context: no hand-over between the two contexts at all (False: the OpenCL queue, handed over)
    cuda_launch: bool = True
    # data-parallel gradients (allreduce.py): "auto" is, where every rank is on one host, "shm-device" on GPUs and
    # "shm" on the CPU device, else "mpi" (MPI's all-reduce on pinned host buffers). "shm": a shared-memory segment,
    # summed on the host; "shm-device": the same segment, summed on the device. 2 H200s, b64, scaling efficiency:
    # resnet50 48% (mpi), 90% (shm), 97% (shm-device); vgg16 15%, 75%, 97%. "shm-mpi" (not chosen by auto): shared
    # memory within each host, MPI between the hosts' first ranks
    gradient_transport: str = "auto"
    # host threads a rank sums the shared slots on (0: cores / ranks, at most 4; 4 threads 24 GB/s against 8 on one)
    reduce_threads: int = 0

    # --- matrix cores ---------------------------------------------------------------------------------------------
    # "portable" runs the GPU's tiled core (gemm_core.cl) on any device: tests keep that fallback covered on PoCL; in
    # fp32 on NVIDIA too (not the tensor cores of fp32_tf32x3). "mma_emulated" (tests; precision "tf32" or "fp16" on a
    # device without PTX): the GPU cores with the tensor-core one, gemm_mma.cl, its mma.sync emulated (device.Device)
    matrix_core: str = "auto"
    # fp32 core on NVIDIA: K slices in a cp.async pipeline; H100 GEMM n=4096 41.1 TFLOP/s against 31.8 through
    # registers (0: through registers, the portable path)
    fp32_stages: int = 3
    # tf32: the 128x64x32 tile for deep products (alexnet features.6 0.083 -> 0.060 ms) and the 96-row one
    tf32_tall: bool = True
    # tf32: 64x128 tiles for products of at most 64 rows (vgg16 features.2 0.925 -> 0.874 ms on an H200)
    tf32_wide: bool = True
    # fp16 on NVIDIA: products and convolutions not on gemm_ldsm.cl's f16 core take the tf32 tensor-core core
    # (gemm_mma.cl; half is exact in tf32) instead of the fp32 core, the convolutions reading x and w in float32 for
    # its cp.async pipeline (products of half operands through registers): fp16 kernel time at b16 on an H200,
    # alexnet 1.25 -> 0.62 ms, resnet50 6.41 -> 3.34, vgg16 14.00 -> 4.18
    fp16_mma: bool = True
    # fp32 on NVIDIA (compute capability 8 and later): products and convolutions on the tf32 tensor-core cores with
    # each operand split into two tf32
    # halves, three mma a product (mma_tf32.cl's TF32X3): fp32's accuracy at tensor-core speed. H200 against float64
    # (bench/probes/tf32x3.py): 3152 x 768 -> 2304 2.0e-7 (cuBLAS fp32 3.5e-7, tf32 2.9e-4) in 0.22 ms (cuBLAS fp32
    # 0.30, the fp32 FMA core 0.33). An infinite operand gives NaN where fp32 gives +-inf. False: the FMA core.
    fp32_tf32x3: bool = True
    # tf32: products of depth in [lo, hi) stay on the fp32 core (resnet50 tf32 b16 kernel time 3.80 -> 3.54 ms at
    # (32, 200)); from depth 96 on the tensor cores (convnext_small tf32 b16, whose first stage's Linear layers are
    # 50176 x 384 x 96: 7.50 -> 7.03 ms; resnet50 3.35 / 3.39, wide_resnet50_2 5.57 / 5.64, resnext50 5.14 / 5.24)
    tf32_fp32_k: tuple = (32, 96)
    # tf32: 128x128 tiles only where their grid fills this many waves (else 64x64 before split-K)
    tf32_huge_fill: float = 1.0
    # tf32 work-groups a compute unit holds when split-K fills the device; the tall tile's (resnet50 128 x 12544 x
    # 1152 at b16: 0.071 ms in 4 slices against 0.063 unsplit)
    tf32_resident: int = 2
    tf32_tall_resident: int = 1
    # tf32: products of at least this many rows and columns with a constant B run on gemm_ldsm.cl (B stored [N, K] at
    # load, ldmatrix fragments; 0: never). Off: alone it ran 4096^3 at 157 TFLOP/s against the gemm_mma core's
    # 117-150, but ViT-B/16 b16's products took 6.59 ms against 6.23 on gemm_mma (H100, bench/gpu_profile.py)
    ldsm_min_rows: int = 0
    # fp16 on NVIDIA: products of half A and B on gemm_ldsm.cl's f16 tensor-core core (False: the fp32 core's
    # register-staged path, half loads, FMA)
    ldsm_f16: bool = True
    # fp16 and tf32 on Hopper (NVIDIA, compute capability 9): those products whose B is constant or stored [N, K] on
    # gemm_wgmma.cl (wgmma; constant B stored [N, K] at load, in tf32 rounded to tf32 too) instead of gemm_ldsm.cl
    # (fp16) or gemm_mma.cl (tf32)
    wgmma: bool = True
    # ... fp16 products whose A runs along M or B along N (a weight gradient's operands, a product by a weight read as
    # stored) on wgmma too, its operands transposed in shared memory (MN-major), instead of on gemm_ldsm.cl. H200
    # (bench/probes/weight_grads.py, ms, on / off): gpt2's dW 4096 x 768 x 3072 0.066 / 0.092, 4096 x 768 x 2304
    # 0.060 / 0.088; gpt2's fp16 training step 22.0 / 23.9 (bench/gpu_train.py)
    wgmma_mn: bool = True
    # ... and products at least this deep, with enough tiles, on its 128 x 256 tile (rules.GEMM_TILES["wgmma_f16"])
    wgmma_deep_k: int = 2048
    # ... wgmma groups each warpgroup leaves running at the end of a K slice (gemm_wgmma.cl's WG_WAIT) where set;
    # -1: the tile's own (rules.GEMM_TILES: 0 on 128 x 128, 1 on 128 x 256)
    wgmma_wait: int = -1
    # ... products at least this deep whose grid leaves the device's slots idle split K (gemm_reduce.cl adds the
    # partial sums; 0: never): a weight gradient's few tiles over all the tokens. Off: H200, gpt2's fp16 training
    # step's Gemm kernels took 13.15 ms with its 48 weight gradients split (3.39, their reductions 1.00) against 12.90
    # whole (bench/gpu_profile.py, before a slice's copies were made cheap)
    wgmma_split_k: int = 0
    # gemm_wgmma.cl's tile stored through __local memory in runs of 8 columns (Y_ROWS8: 16-byte stores, C read 8 at a
    # time) where there is a C (a bias, a residual) and y's rows allow, not as each work-item's fragments (4 or 8
    # bytes in each of 8 rows a warp store). H200, bench/probes/wgmma_layers.py (bias, half out in fp16), Gemm kernel
    # ms, fragments / staged: fp16 4096 x 768 -> 3072 0.0750 / 0.0568, -> 2304 0.0724 / 0.0507, 4096 x 3072 -> 768
    # 0.0562 / 0.0508; tf32 0.1278 / 0.1092, 0.1238 / 0.0938, 0.1267 / 0.1185. A bare product (no C, float y) lost:
    # fp16 4096 x 768 -> 3072 0.0532 / 0.0635, tf32 0.1032 / 0.1085.
    wgmma_staged_y: bool = True
    # tf32: a product's A stored rounded to tf32 by the kernel that makes it, where tf32 products alone read it
    # (schedule's tf32_y / tf32_a; gemm_wgmma.cl then rounds neither operand). H200 b16 tf32 Gemm kernel ms: gpt2
    # 5.83 -> 4.77, vit_b_16 5.77 -> 4.92
    tf32_producers: bool = True
    # tf32 and fp16: attention's two products on the tensor cores (attention_mma.cl) for head dims that are multiples
    # of 8 (fp16: of 16)
    attention_mma: bool = True
    # its work-groups' warps, 16 query rows each: each K/V tile loaded once for more rows. H100, ViT-B/16 b16 (197
    # tokens, d 64), the 12 layers' attention: 1 warp 3.09 ms, 2 1.49, 4 1.07, 8 0.79 (the fp32 kernel 2.40)
    attention_mma_warps: int = 8
    # attention_mma.cl's K and V tiles by cp.async into two stages where their rows are 16-byte aligned (KV_ASYNC;
    # fp16: read by ldmatrix; False: through registers, V transposed by scalar stores), with up to this many warps
    # a work-group where the head dims are at most 64. H200, kernel ms (bench/probes/attention_mma.py), fp16,
    # registers 8 warps -> cp.async 8 / 4 warps: 16 x 12 x 256 x 64 causal 0.0532 -> 0.0295 / 0.0249; 16 x 12 x 197 x
    # 64 0.0486 -> 0.0318 / 0.0277. The same for attention_grad_mma.cl's f16 tiles (GA: q, k, v and dy by cp.async,
    # B by ldmatrix; else stored by the work-items, with transposed copies): H200, the two kernels at 16 x 12 x 256 x
    # 64 causal 0.324 -> 0.126 ms
    attention_async: bool = True
    attention_async_warps: int = 4
    # training in tf32 and fp16: attention's gradient as one AttentionGrad node on the tensor cores
    # (attention_grad_mma.cl, FlashAttention-2's backward) where its head dims allow, not the decomposition. H200,
    # fp16, Adam b16 step ms: gpt2 20.88 -> 17.22, vit_b_16 25.36 -> 19.42 (bench/gpu_train.py); its two kernels at
    # 16 x 12 x 256 x 64 causal 0.126 ms (PyTorch's FlashAttention backward 0.141; bench/probes/attention_grad_mma.py)
    attention_grad_mma: bool = True
    # tests: the PTX helpers of the tensor-core kernels emulated through __local memory (mma_emu.cl), so that
    # attention_grad_mma.cl runs on any device (slowly)
    mma_emulate: bool = False
    # NVIDIA: AddLayerNorm with a warp per row and its chunks in registers (add_layernorm_warp; False: a work-group
    # per row, add_layernorm_wg)
    norm_warps: bool = True
    # CPUs: attention of at least 8 query rows with the rows in vector lanes (attention_cpu_rows; False:
    # attention_cpu's 4 rows a work-item and a horizontal sum per score), and its gradient's dq (dk, dv) where there
    # are 8 query (key) rows (attention_grad_lanes.cl; False: attention_grad.cl's 8 rows a work-item in turn)
    attention_cpu_lanes: bool = True
    # decoding (attention.cl's tile of a few query rows): the keys split over up to this many work-groups per head,
    # each a run of whole key tiles, the last to finish merging them (FlashDecoding; 1: one work-group streams them)
    attention_decode_splits: int = 32

    # --- fully connected layers of few rows -----------------------------------------------------------------------
    # at most this many rows run as gemv (B streamed once): 16 x 4096 x 25088 0.179 ms against cuBLAS 0.231
    gemv_max_rows: int = 32
    # gemv_rows.cl per largest row count {rows: dict(LK, LN, NC, KC, per_cu, pf)}; None: rules.GEMV_ROWS_TILES
    gemv_rows_tiles: dict = None
    # gemv_rows.cl's and gemv_cols.cl's K slices (0: whole waves of resident work-groups)
    gemv_rows_splits: int = 0
    # products whose B is a [K, N] tensor (not a constant: a fully connected layer's gradients) on gemv_cols.cl:
    # gemv_cols for at most gemv_cols_max_rows rows (0: off), gemm_outer for K of at most outer_max_k (0: off); else
    # the GEMM core. H200, batch 16, kernel ms: 16 x 9216 x 4096 0.071 (core 0.159, cuBLAS 0.172); 4096 x 9216 x 16
    # 0.077 (core 0.175, cuBLAS 0.074). At 32 rows gemv_cols lost to the core (0.32 against 0.20: 32 float4 sums)
    gemv_cols_max_rows: int = 16
    outer_max_k: int = 32
    # tf32: gemv_mma.cl's WARPS, NBW, KC, per_cu (16 x 4096 x 25088 0.158 ms against gemv_rows 0.180); None: off
    gemv_mma: dict = field(default_factory=lambda: {"WARPS": 8, "NBW": 1, "KC": 64, "per_cu": 2})

    # --- Winograd -------------------------------------------------------------------------------------------------
    # F(2x2, 3x3) for 3x3 stride-1 layers of at least this many channels (H100 b16: 64 beat 128 and 256; 0: never)
    winograd_min_channels: int = 64
    # ... at least this many in tf32 on NVIDIA (vgg16 tf32 b16 against PyTorch: from 64 0.60, from 256 0.74; H200
    # session 41, kernel ms from 256 / 128 / 64 channels: wide_resnet50_2 4.50 / 4.30 / 4.29, vgg16 4.02 / 3.82 / 4.48,
    # resnet18 1.01 / 1.00 / 1.24, resnet50 2.73 / 2.72 / 2.87)
    winograd_min_channels_tf32: int = 128
    # output tile m of F(m x m, 3x3) in fp32 and in tf32 inference (tf32's products are 3x faster)
    winograd_m: int = 2
    winograd_m_tf32: int = 4
    # F(4x4) only on layers of at least this many 4x4 tiles: its U is 36/9 of the weights (resnet18 tf32 b16 216 MiB
    # against PyTorch's 194 with F(4x4) everywhere, no faster)
    winograd_f4_min_tiles: int = 512
    # a layer short of workspace runs in chunks of at least this many tiles (and an eighth of the layer's) ...
    winograd_min_tiles: int = 1024
    # ... but takes the whole layer's up to this many bytes, the arena growing (H100, resnet18 b16 training step:
    # layers ran in up to 3 chunks of 3 launches each; 10.71 -> 8.94 ms of kernel time, 661 -> 415 launches)
    winograd_whole_bytes: int = 128 << 20
    # training: Winograd for convolutions and their input gradients, and for weight gradients
    winograd_training: bool = True
    winograd_dw: bool = True
    # only layers of at least this many 2x2 tiles (vgg16 b1 14x14: 0.052 ms against 0.075 direct; U costs memory)
    winograd_min_layer_tiles: int = 256
    # GPU convolutions with constant weights read their depth tap by tap ([K, KH, KW, C]): one window-table entry
    # per slice of depth
    tap_major: bool = True

    # --- training BatchNorm (bn.cl) ---------------------------------------------------------------------------------
    # the normalisation launches add their channel's partial sums themselves: no statistics launch per layer and
    # direction (sync_bn's layers keep it: it exchanges the statistics between the two)
    bn_stats_in_apply: bool = True

    # --- input upload overlapped with the first layers (GPU inference) ------------------------------------------
    # slices of the batch (H100 9.6 MB from pinned memory then 4 kernels: 0.333 -> 0.224 ms in 4 chunks; 1: off)
    input_chunks: int = 4
    input_chunk_min_bytes: int = 1 << 20
    # GPUs: an output of (min, max) bytes comes back through a pinned host array of its plan (the device's copy at
    # the bus's speed), into the new array in chunks of the third, each as its copy lands. H200, gpt2 b16 fp16's
    # 3.2 MB of logits into an ordinary array: 0.648 ms (bench/gpu_overhead.py). (0, 0): off
    download_staging: tuple = (1 << 18, 1 << 27, 1 << 20)
    # the chain continues while earlier convolutions did fewer flops per input byte than this (alexnet b16 fp32
    # 1.44 -> 1.31 ms) and a slice keeps this many output pixels
    chunk_flops_per_byte: dict = field(default_factory=lambda: {"fp32": 1000, "tf32": 2000, "fp16": 2000})
    chunk_min_pixels: dict = field(default_factory=lambda: {"fp32": 2048, "tf32": 8192, "fp16": 8192})

    # --- CPU products (gemm_cpu.cl) --------------------------------------------------------------------------------
    # A's rows contiguous: its loads indexed by k itself, not by k * sak from MR stepped pointers
    gemm_cpu_unit_k: bool = True
    # 2-D products whose B is not a constant (a parameter in training, an activation) on gemm_cpu.cl too, B packed by
    # gemm_cpu_pack before each run (False: gemm_vec.cl, B read in place). 2 cores, a causal attention layer's training
    # step (bench/probes/attention_grad_cpu.py, T 512): qkv's product and its gradients 236 + 227 ms on gemm_vec
    gemm_cpu_pack: bool = True
    # ... and A packed too where its rows are not contiguous (a weight gradient's X^T, read along its columns) and
    # several column blocks read it: gemm_cpu_pack in panels of MR rows, then MR adjacent floats a k
    gemm_cpu_pack_a: bool = True
    # convolution gradients (other than depthwise and Winograd ones) as gemm_cpu.cl products too: dy gathered into rows
    # of channels, then dW = dy col^T or colgrad = w^T dy, im2col / col2im a plane per work-item (False:
    # conv_grad_gemm.cl on gemm_vec.cl). 2 cores, a small CNN's training step 202 -> 33 ms
    # (bench/probes/cpu_train_ab.py)
    conv_grad_cpu_panels: bool = True

    # --- CPU convolutions (conv_cpu.cl, dwconv_cpu.cl) -----------------------------------------------------------
    # work-items per core that a register-tiled convolution's tiles are split into (row or channel blocks shared out)
    conv_cpu_items_per_core: int = 8
    # CPU devices with several worker threads: a run's consecutive launches as one persistent kernel (persist.py;
    # PoCL's workers stay awake between layers), where at least cpu_persistent_min of them can be merged; its program
    # is built when the plan's run number cpu_persistent_after starts (0: its first), once (cold, about 3 s for
    # squeezenet's 40 launches, then cached), so a plan run once builds none
    cpu_persistent: bool = True
    cpu_persistent_min: int = 8
    cpu_persistent_after: int = 1
    # consecutive panels per work-item (conv_cpu.cl's local and direct paths), up to this many bytes of them (an L1
    # share), each row block running over them in turn: a row's 64-byte lines that two panels share (planes of an
    # odd size such as 55 x 55) are then written one tile after the other, not once per panel's pass over the rows
    conv_cpu_panel_bytes: int = 24 << 10
    # im2col panels packed per panel in __local memory above this im2col size (densenet 56x56 128->32: 9.3 -> 4.1 ms)
    conv_cpu_local_min_bytes: int = 2 << 20
    # layers of several taps read zero-padded planes, not im2col (densenet121 63 -> 47 ms)
    conv_cpu_direct: bool = True
    # ... their panels' rows copied to __local memory first (3x3 s2 64 -> 128 at 56x56: 157 against 137 GF/s)
    conv_cpu_direct_pack: bool = True
    # ... their panels inside output rows where that computes no more positions (conv_cpu.cl's ROW_TILES,
    # rules.direct_row_tiles: squeezenet 1.1's stem 0.350 -> 0.304 ms, shufflenet's 0.160 -> 0.138)
    conv_cpu_direct_row_tiles: bool = True
    # fused Winograd F(2x2, 3x3) for 3x3 stride-1 layers (resnet50 50.9 -> 46.4 ms)
    conv_cpu_winograd: bool = True
    conv_cpu_winograd_min_channels: int = 16
    # ... where rows of tiles rounded up to 8 grow by at most this factor
    conv_cpu_winograd_max_row: float = 1.15
    # layers of at most this many output pixels (all images) and whole 16-channel panels: pixels as rows, channels as
    # columns (conv2d_cpu_pixels), packed from x without pads (0: never). resnet50's 7x7 3x3 512 layer 1.48 -> 1.39 ms,
    # its 1x1 stride-2 1024 -> 2048 1.48 -> 1.17; at 14x14 (196) a 1x1 256 -> 1024 ran 1.01 -> 1.18: not there
    conv_cpu_pixels_max: int = 64
    # ... every pixel panel packed once, then the weights stationary: each channel panel runs over all the pixel blocks
    # (resnet50, both in one context: median 71.3 -> 68.6 ms; its 3x3 512 layers at 7x7 5.01 -> 4.69, stride 2 2.65 ->
    # 2.34; weights read once per pixel block came from memory)
    conv_cpu_pixels_packed: bool = True
    # depthwise layers over zero-padded planes (shufflenet 5.76 -> 5.02 ms)
    dw_cpu_planes: bool = True
    # ... each work-item padding the rows it reads itself where they fit dw_pad_in_floats (shufflenet 4.82 -> 4.38)
    dw_cpu_pad_in: bool = True
    dw_pad_in_floats: int = 8192
    # ... computed in blocks of about this many float8 accumulators: a row's vectors times rows (rules.dw_row_block;
    # 0: one vector at a time). shufflenet's layers, 0 -> 4: 136 x 28 x 28 0.043 -> 0.031 ms, 272 x 14 x 14 0.032 ->
    # 0.021, 544 x 7 x 7 0.027 -> 0.017, stride 2 112 x 56 -> 28 0.066 -> 0.053; 8 ran 0.031 -> 0.039 at 28 x 28
    dw_cpu_row_accs: int = 4
    # depthwise rows per work-item: at least this many outputs while the grid keeps dw_min_items work-items (256 ->
    # 1024, whole 28 x 28 planes: 136 x 28 x 28 0.031 -> 0.027 ms, stride 2 112 x 56 -> 28 0.049 -> 0.045)
    dw_min_outputs: int = 1024
    dw_min_items: int = 64
    # pad_planes: planes per work-item up to this many floats while the grid keeps pad_min_items
    pad_min_floats: int = 2048
    pad_min_items: int = 16
    # CPU pooling: rows of about this many outputs per work-item (192 x 56 rows of 56: 1.2 ms one row each)
    pool_cpu_rows: int = 64
    # MaxPool 3x3 stride 2: each input row's 3-wide maxima once, shared by the two output rows that read it
    # (squeezenet's three 0.34 + 0.27 + 0.21 -> 0.27 + 0.24 + 0.14 ms, resnet50's 0.25 -> 0.20; a contended machine;
    # then plain maxima with a NaN mask, pool_cpu.cl: squeezenet 1.1's pool1 0.187 -> 0.105 ms, resnet50's 0.20 -> 0.12)
    pool_cpu_separable: bool = True
    # CPU reductions: accumulators per output over interleaved elements (GlobalAveragePool 0.115 -> 0.039 ms)
    reduce_lanes: int = 4
    # ... and a float32 sum down columns (a bias gradient over tokens: [rows, N] over rows) as 8 columns a work-item
    # in one float8 (red_cols; False: a work-item a column, reading 4 bytes a row). A 2-layer ViT's step, its mlp.0
    # bias gradient (394 rows of 3072): 1.75 ms before
    reduce_columns_cpu: bool = True
    # GPU pointwise kernels (codegen.elementwise_source): elements per work-item where every operand's innermost dim
    # is contiguous or broadcast, as one vector load and store each (4), or one element (1). H200, training step
    # (session 36): gpt2 fp16 28.7 -> 24.1 ms, vit fp16 29.9 -> 26.5, gpt2 fp32 61.9 -> 59.1, vit fp32 56.8 -> 53.9
    ew_vector: int = 4
    # training graphs: a Transpose read only by products (attention's gradient: q, k, v and dy to [b, h, t, d], 4
    # copies a layer) as a TransposeView the products read in place (H200, gpt2's training step with ew_vector=4:
    # fp32 59.1 -> 58.4 ms, fp16 24.1 -> 23.8)
    transpose_views: bool = True
    # training: the device kinds ("cpu", "gpu") whose attention gradient is one AttentionGrad node (attention_grad.cl,
    # no T x T scores) rather than its decomposition into products, softmax and pointwise ops. CPU (2 cores, PoCL),
    # training step of a 768-wide causal self-attention layer, 12 heads, batch 2: T 64 68.2 -> 61.6 ms, 128 133.4 ->
    # 124.5, 256 319.7 -> 246.8, 512 788.6 -> 538.6. Elsewhere the gradients that attention_grad_mma.cl takes (tf32 and
    # fp16 on NVIDIA: attention_grad_mma) are fused, the others decomposed (fp32 GPUs: products on the tensor cores)
    fused_attention_grad: tuple = ("cpu",)
    # training: the device kinds whose optimizer updates take eight consecutive elements a work-item as one float8
    # (optim.cl's VEC8). 2 cores (EPYC, PoCL), Adam over 15.5M parameters 68 -> 20 ms, the same values
    optim_vectors: tuple = ("cpu",)

    @staticmethod
    def from_env(environ=None):
        """The options the environment asks for (read once per Context)."""
        env = os.environ if environ is None else environ
        values = {"cache_dir": env.get("DLNET_CACHE", ""), "tune": env.get("DLNET_TUNE", ""),
                  "tune_layers": env.get("DLNET_TUNE_LAYERS", ""),
                  "build_processes": _int(env, "DLNET_BUILD_PROCS"), "build_threads": _int(env, "DLNET_BUILD_THREADS"),
                  "build_options": tuple(env.get("DLNET_BUILD_OPTIONS", "").split()),
                  "binary_cache": env.get("DLNET_BINARY_CACHE", "") == "1",
                  "debug_bounds": env.get("DLNET_DEBUG_BOUNDS", "") not in ("", "0")}
        options = Options(**values)
        spec = env.get("DLNET_OPTIONS", "")
        return options.parse(spec, "DLNET_OPTIONS") if spec.strip() else options

    def parse(self, spec, where="options"):
        """These options with 'name=value,...' applied (values as Python literals; a dict or tuple in brackets)."""
        import ast
        kinds = {f.name: f.type for f in fields(self)}
        changes, known = {}, set(kinds)
        for item in _split_items(spec):
            name, sep, text = item.partition("=")
            name = name.strip()
            if not sep or name not in known:
                raise DeviceError(f"{where}: {item!r}: expected name=value with a name of {sorted(known)}")
            try:
                value = ast.literal_eval(text.strip())
            except (ValueError, SyntaxError):
                value = text.strip()
            changes[name] = _typed(value, kinds[name], f"{where}: {name}")
        return self.replace(**changes)

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


def _typed(value, kind, where):
    """value as a field of this kind ("str", "int", "float", "bool", "tuple", "dict") takes it, or a DeviceError."""
    kind = kind if isinstance(kind, str) else kind.__name__
    if kind == "str":
        return str(value)
    if kind == "bool" and (isinstance(value, bool) or value in (0, 1)):
        return bool(value)
    if kind == "int" and isinstance(value, (int, float)) and not isinstance(value, bool) and int(value) == value:
        return int(value)
    if kind == "float" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind == "tuple" and isinstance(value, (tuple, list)):
        return tuple(value)
    if kind == "dict" and (value is None or isinstance(value, dict)):
        return value
    raise DeviceError(f"{where}={value!r}: expected a value of type {kind}")


def _int(env, name):
    text = env.get(name, "")
    try:
        return int(text) if text else 0
    except ValueError:
        raise DeviceError(f"{name}={text!r}: expected an integer") from None


def _split_items(spec):
    """'a=1,b={1: 2, 3: 4},c=(1,2)' -> ['a=1', 'b={1: 2, 3: 4}', 'c=(1,2)']: commas inside brackets stay."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(spec):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            items.append(spec[start:i])
            start = i + 1
    items.append(spec[start:])
    return [s for s in (s.strip() for s in items) if s]
