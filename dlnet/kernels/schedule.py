"""The device schedule: how this device runs each node, decided once before memory planning.

- `device_passes`: the weight layouts this device's kernels read best (pretransposed, tap-major, Winograd U).
- `ALGOS`: per op an ordered table of algorithms; the first that applies runs the node (DLPrimitives'
  Conv2DForward::create, Caffe's layer factory). `schedule(graph, ctx)` writes the choice on each node as
  node.schedule["algo"]; lowering records the tile it takes as node.schedule["tile"]; `print(net.graph)` shows both.
- `chunked_prefix`: the nodes that run slice by slice of the batch while a large input goes up.
"""
from dataclasses import dataclass

import numpy as np

from ..graph.passes.fuse import fold_channel_shuffles, fuse_conv_prologues
from ..graph.passes.half import half_input_copies, half_weight_copies, store_half
from ..graph.passes.layout import (
    flatten_gemm_rows,
    pretranspose_weights,
    slices_as_views,
    tap_major_weights,
    tf32_weights,
    transposes_as_views,
)
from ..graph.passes.transposes import transposes_into_product_views
from ..graph.passes.winograd import winograd_on_device, winograd_weights
from . import half
from .families.attention import grad_mma_tile, head_dims
from .families.conv import is_depthwise
from .families.conv_cpu import conv_cpu_algo
from .families.conv_grad import ConvGradFamily
from .families.elementwise import ElementwiseFamily
from .families.indexing import IndexFamily
from .families.norm_pool import NormPoolFamily
from .families.reduce import ReduceFamily
from .families.training import TrainingFamily
from .rules import GEMV_REG_ROWS, TAP_MAJOR_MULTIPLE, ldsm_f16_tiles, ldsm_product, wgmma_product


class Algo:
    """One way to run an op: `applies(node, dev, options)`; `name` is what the IR prints; `half_io(node, dev)` what
    its kernels read and write in half (precision "fp16": kernels/half.py)."""
    name = None

    @staticmethod
    def applies(node, dev, options):
        return True

    @staticmethod
    def half_io(node, dev):
        return half.NONE


class Winograd(Algo):
    """Winograd F(2x2, 3x3) / F(4x4, 3x3) on the GPU cores (passes/winograd.py chose the layer and wrote U)."""
    name = "winograd"

    @staticmethod
    def applies(node, dev, options):
        return bool(node.attrs.get("winograd"))

    @staticmethod
    def half_io(node, dev):  # winograd.cl's transforms (conv_half.cl) and the GEMM's A (U); V and M stay float
        if node.attrs.get("winograd") != 1:
            return half.NONE
        return half.copy_pipeline_io(dev, half.EVERY, reads=(0,))  # (x, read by the transform, not the GEMM)


class DepthwisePlanesCpu(Algo):
    name = "depthwise_planes_cpu"

    @staticmethod
    def applies(node, dev, options):
        return dev.is_cpu and options.dw_cpu_planes and is_depthwise(node)


class DepthwiseCpu(Algo):
    name = "depthwise_cpu"

    @staticmethod
    def applies(node, dev, options):
        return dev.is_cpu and is_depthwise(node)


class DepthwiseGpu(Algo):
    name = "depthwise"

    @staticmethod
    def half_io(node, dev):  # dwconv.cl (conv_half.cl)
        return half.EVERY

    @staticmethod
    def applies(node, dev, options):
        return is_depthwise(node)


class ConvCpu(Algo):
    """conv_cpu.cl's paths (conv_cpu_algo): cpu_winograd, cpu_pixels, cpu_direct, cpu_local, cpu_im2col."""
    name = "cpu"

    @staticmethod
    def applies(node, dev, options):
        return not dev.tiled


class ImplicitGemm(Algo):
    """The GPU cores over the input's windows (window.cl + conv.cl)."""
    name = "implicit_gemm"

    @staticmethod
    def half_io(node, dev):  # (a half x or w takes the register-staged path on NVIDIA: half.without_copies)
        return half.copy_pipeline_io(dev, half.EVERY)


class GemmCpu(Algo):
    """gemm_cpu.cl: a 2-D product on a CPU, B packed into panels once where it is a constant, else by a kernel before
    each run (Options.gemm_cpu_pack: a parameter's or an activation's). A transformer's [batch, tokens, d] MatMul is
    one by then: device_passes flattens its rows (graph/passes/layout.py flatten_gemm_rows)."""
    name = "gemm_cpu"

    @staticmethod
    def applies(node, dev, options):
        a, b, y = node.inputs[0], node.inputs[1], node.outputs[0]
        return not dev.tiled and y.rank == 2 and a.rank == b.rank == 2 and \
            (b.const is not None and not b.param or options.gemm_cpu_pack)

    @staticmethod
    def half_io(node, dev):  # (a constant B is packed in float32 at lowering; gemm_cpu_pack reads any other in half)
        b = node.inputs[1]
        return half.HalfIO((0, 2) if b.const is not None and not b.param else (0, 1, 2), True)


class Gemv(Algo):
    """Products of few rows that stream B once: gemv.cl (at most GEMV_REG_ROWS rows), gemv_rows.cl, or gemv_mma.cl
    on tensor cores (where the operands' offsets allow; else the GEMM core)."""
    name = "gemv"

    @staticmethod
    def applies(node, dev, options):
        y = node.outputs[0]
        return dev.tiled and y.rank == 2 and y.shape[0] <= options.gemv_max_rows

    @staticmethod
    def variant(node, dev, options):
        rows = node.outputs[0].shape[0]
        if rows <= options.gemv_cols_max_rows and b_by_rows(node):
            return "gemv_cols"
        if rows <= GEMV_REG_ROWS:
            return "gemv"
        return "gemv_mma" if dev.tensor_cores and options.gemv_mma else "gemv_rows"

    @staticmethod
    def half_io(node, dev):  # gemv.cl, gemv_rows.cl: every operand; gemv_mma.cl float32; where gemv.cl cannot read a
        # view the GEMM core takes the product (GemmCore's half_io, then)
        if node.schedule.get("algo") == "gemv_mma":
            return half.NONE
        return GemmCore.half_io(node, dev)


def b_by_rows(node):
    """Is Gemm `node`'s B a 2-D [K, N] (transB=0), as a fully connected layer's gradients read the weight and the
    activations (constant weights are transposed at load where gemv.cl reads them)?"""
    return not node.attrs.get("transB", 0) and node.inputs[1].rank == 2


class GemmOuter(Algo):
    """gemv_cols.cl's gemm_outer: a 2-D product over a short K (a fully connected layer's weight gradient, dy^T x, at
    a small batch) with B [K, N]: bound by writing y, which the GEMM core's tiles write slowly."""
    name = "gemm_outer"

    @staticmethod
    def applies(node, dev, options):
        a, y = node.inputs[0], node.outputs[0]
        k = a.shape[-2] if node.attrs.get("transA", 0) else a.shape[-1]
        return dev.tiled and y.rank == 2 and a.rank == 2 and k <= options.outer_max_k and b_by_rows(node)

    @staticmethod
    def half_io(node, dev):
        return half.EVERY


class GemmCore(Algo):
    """gemm.cl on the device's core: gemm_core.cl's tiles, gemm_mma.cl's in tf32 mode, gemm_vec.cl on CPUs."""
    name = "gemm"

    @staticmethod
    def half_io(node, dev):  # (a half A or B takes the register-staged path on NVIDIA: half.without_copies)
        return half.EVERY


class FlashCpu(Algo):
    """attention_cpu.cl: a work-item per few query rows, keys from global memory, no barriers (CPUs)."""
    name = "flash_cpu"

    @staticmethod
    def half_io(node, dev):  # q, k, v and y (attention_cpu.cl, attention.cl); a mask stays as it is
        return half.HalfIO((0, 1, 2), True)

    @staticmethod
    def applies(node, dev, options):
        return not dev.tiled


class Flash(Algo):
    """attention.cl: the online softmax over K/V tiles in __local memory (kernels/families/attention.py)."""
    name = "flash"
    half_io = FlashCpu.half_io


class FlashGradMma(Algo):
    """attention_grad_mma.cl: AttentionGrad on NVIDIA's tensor cores in tf32 and fp16 (FlashAttention-2's backward)."""
    name = "flash_grad_mma"

    @staticmethod
    def half_io(node, dev):  # q, k, v, y and dy in, dq, dk and dv out (each row's statistics stay float)
        return half.HalfIO((0, 1, 2, 3, 4), (0, 1, 2))

    @staticmethod
    def applies(node, dev, options):
        return grad_mma_tile(dev, options, *head_dims(node)) is not None


class FlashGrad(Algo):
    """attention_grad.cl: a work-item per query row, then per key row (CPUs: 8 rows in vector lanes)."""
    name = "flash_grad"


ALGOS = {
    "Conv": [Winograd, DepthwisePlanesCpu, DepthwiseCpu, DepthwiseGpu, ConvCpu, ImplicitGemm],
    "Gemm": [GemmCpu, Gemv, GemmOuter, GemmCore],  # (the importer makes MatMul a Gemm)
    "Attention": [FlashCpu, Flash],
    "AttentionGrad": [FlashGradMma, FlashGrad],
}


def choose(node, dev, options):
    """The name of the first algorithm of ALGOS[node.op] that applies (None for ops without a table)."""
    for algo in ALGOS.get(node.op, ()):
        if algo.applies(node, dev, options):
            if algo is Winograd:
                return f"winograd{node.inputs[1].shape[0] - 2 if node.attrs['winograd'] == 1 else 2}"
            if algo is ConvCpu:
                return conv_cpu_algo(node, dev, options)
            if algo is Gemv:
                return Gemv.variant(node, dev, options)
            return algo.name
    return None


def algorithm(node, dev, options):
    """The node's scheduled algorithm, chosen now where the schedule has not run (a node built while lowering)."""
    algo = node.schedule.get("algo")
    if algo is None:
        algo = choose(node, dev, options)
        if algo is not None:
            node.schedule["algo"] = algo
    return algo


def product_extents(node):
    """(M, N, K) of Gemm `node`'s product (of each batch), or None where A or y has fewer than 2 dims."""
    a, y = node.inputs[0], node.outputs[0]
    if y.rank < 2 or a.rank < 2:
        return None
    return y.shape[-2], y.shape[-1], a.shape[-2] if node.attrs.get("transA", 0) else a.shape[-1]


def half_core(node, dev, options):
    """Does Gemm `node` run on a core of half operands (wgmma, gemm_ldsm.cl's f16) when both are stored in half?"""
    mnk = product_extents(node)
    return mnk is not None and (wgmma_product(dev, options, *mnk) or ldsm_f16_tiles(dev, options, *mnk, 1) is not None)


def schedule(graph, ctx):
    """Write each node's algorithm on it (node.schedule["algo"]) for ctx's device and options; in precision "fp16"
    then store in half what the chosen kernels read and write in half (graph/passes/half.py; in a training graph
    too: its weights, the parameters, stay float32)."""
    dev, options = ctx.dev, ctx.options
    for node in graph.nodes:
        algo = choose(node, dev, options)
        if algo is not None:
            node.schedule["algo"] = algo
    if dev.wgmma and dev.tensor_cores and not dev.half_storage and options.wgmma and options.tf32_producers:
        tf32_producers(graph, lambda node: tf32_product(node, dev, options))
    if dev.half_storage and not getattr(graph, "stored_half", False):
        half.check_half_io(ctx)
        io = lambda node: half_io(node, dev, options)  # noqa: E731
        if any(v.param for v in graph.values()):  # training: the kernels that read weights in half read half copies
            half_weight_copies(graph, io)
        elif dev.is_nvidia and not dev.is_cpu:  # products of a graph input on the tensor cores read a half copy
            half_input_copies(graph, io, lambda node: half_core(node, dev, options))
        store_half(graph, io)
    return graph


# the kernels that can store their y rounded to tf32 (Y_TF32): op -> its algorithm (None: ops without a table)
TF32_STORES = {"Gemm": "gemm", "AddLayerNorm": None, "LayerNorm": None, "Attention": "flash"}


def tf32_product(node, dev, options):
    """Is `node` a product on gemm_wgmma.cl in tf32 (precision "tf32", Hopper) that reads its A as input 0?"""
    if node.op != "Gemm" or node.schedule.get("algo") != "gemm" or node.attrs.get("transA", 0):
        return False
    mnk = product_extents(node)
    return mnk is not None and wgmma_product(dev, options, *mnk)


def tf32_producers(graph, product):
    """precision "tf32": a float32 value that products on the tensor cores alone read, as their A (`product(node)`;
    through views), stored rounded to tf32 by the kernel that makes it (its schedule's tf32_y) where that kernel can
    (TF32_STORES); its products (tf32_a) then read it as it is: wgmma drops the low bits that gemm_wgmma.cl would
    otherwise round in shared memory, in every tile of the product that reads the slice."""
    outputs = {id(v) for v in graph.outputs}

    def readers(v):  # the products reading v (through views), or None where anything else reads it
        found = []
        for user in v.users:
            if user.spec.kind == "alias":
                more = readers(user.outputs[0])
                if more is None:
                    return None
                found += more
            elif product(user) and user.inputs[0] is v and v not in user.inputs[1:]:
                found.append(user)
            else:
                return None
        return None if id(v) in outputs else found

    for node in graph.nodes:
        want = TF32_STORES.get(node.op, False)
        y = node.outputs[0] if node.outputs else None
        if want is False or node.schedule.get("algo") != want or y.dtype != "float32" or y.const is not None:
            continue
        products = readers(y)
        if products:
            node.schedule["tf32_y"] = 1
            for p in products:
                p.schedule["tf32_a"] = 1


# {op: HalfIO, or (node, dev) -> HalfIO} that the kernel families of ops without an algorithm table declare (their
# HALF_IO)
FAMILY_HALF_IO = {**ElementwiseFamily.HALF_IO, **ReduceFamily.HALF_IO, **NormPoolFamily.HALF_IO, **IndexFamily.HALF_IO,
                  **TrainingFamily.HALF_IO, **ConvGradFamily.HALF_IO}


def half_io(node, dev, options):
    """What node's kernels read and write in half: its algorithm's (ALGOS), else its family's HALF_IO; pointwise
    chains and copies (codegen.py) take half everywhere."""
    for algo in ALGOS.get(node.op, ()):
        if algo.applies(node, dev, options):
            return algo.half_io(node, dev)
    if node.op in ALGOS:
        return half.NONE
    if node.op == "Fused" or node.spec.kind == "pointwise":
        return half.EVERY
    io = FAMILY_HALF_IO.get(node.op, half.NONE)
    return io(node, dev) if callable(io) else io


def device_passes(graph, ctx, training=False):
    """The weight layouts this device's kernels read best, after the graph passes: Gemm weights pretransposed
    (except where gemv.cl reads them as they are) and 3x3 weights transformed for Winograd where convolutions run
    on the GPU core. Training (weights change every step): Winograd with the transform on the device, for the
    convolutions and their input and weight gradients."""
    dev, o = ctx.dev, ctx.options
    core = dev.core
    min_channels, wino_m = o.winograd_min_channels, o.winograd_m
    if dev.mma:  # (tf32, and fp16 on the tf32 core)
        min_channels, wino_m = max(min_channels, o.winograd_min_channels_tf32), o.winograd_m_tf32
    if training:
        if core == "gemm_core" and o.winograd_training:
            winograd_on_device(graph, min_channels, o.winograd_min_layer_tiles, o.winograd_dw)
        if o.transpose_views:  # (attention's gradient: its products read q, k, v and dy in place)
            transposes_into_product_views(graph)
        return graph
    if core == "gemm_vec":  # CPU convolutions: per-channel affine + Relu producers of 1x1 layers as prologues,
        # channel shuffles in their planes
        fuse_conv_prologues(graph, dev.local_mem // (4 * 16))
        if o.conv_cpu_direct and o.dw_cpu_planes:
            fold_channel_shuffles(graph)
    flatten_gemm_rows(graph)
    transposes_as_views(graph)
    slices_as_views(graph)
    pretranspose_weights(graph, o.gemv_max_rows if dev.tiled else 0,
                         (lambda M, N, K: wgmma_product(dev, o, M, N, K) or ldsm_product(dev, o, M, N, K))
                         if dev.ldsm_tf32 or dev.wgmma else None)
    if dev.tensor_cores and dev.wgmma:
        tf32_weights(graph, lambda M, N, K: wgmma_product(dev, o, M, N, K))
    if core == "gemm_core":
        winograd_weights(graph, min_channels, o.winograd_min_layer_tiles, wino_m, o.winograd_f4_min_tiles)
        if o.tap_major:
            tap_major_weights(graph, TAP_MAJOR_MULTIPLE)
    return graph


# CPU convolutions (conv_cpu.cl): MR x 8*NV outputs per work-item held in MR*NV float8 accumulators (AVX2 has 16



# GPU inference: where a graph input of at least options.input_chunk_min_bytes is read by one node alone, that node and
# the chain of nodes after it (chunked_prefix) run over options.input_chunks slices of the batch, slice after slice,
# each slice's launches awaiting only its slice's upload (Plan.run uploads such an input in chunks on a second queue):
# the upload overlaps the first layers. H100: 9.6 MB from pinned memory 0.20 ms, then 4 kernels 0.13 ms: 0.333 ms one
# after the other, 0.224 in 4 overlapped chunks.
CHUNK_OPS = ("Conv", "MaxPool", "AveragePool", "LRN")


@dataclass
class Prefix:
    """nodes[start:stop] run slice after slice of the batch of graph input `input`: chunks [(first image, images)]."""
    input: int
    start: int
    stop: int
    chunks: list


def data_inputs(node):
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
    """The nodes that run over slices of the batch while the input goes up (options.input_chunks): a chain from the one
    node reading a large graph input, each node the only reader of the one before it, consecutive in the graph's
    order; or None. GPU cores only: CPU devices share the host's memory and cores with the copy."""
    dev, o = ctx.dev, ctx.options
    if o.input_chunks < 2 or (dev.is_cpu and not dev.tiled):
        return None
    nodes, outputs = graph.nodes, {v.id for v in graph.outputs}
    readers = {}
    for i, n in enumerate(nodes):
        for v in n.inputs:
            if v is not None:
                readers.setdefault(v.id, []).append(i)
    for xi, x in enumerate(graph.inputs):
        N = x.shape[0] if x.rank else 1
        if N < 2 or x.nbytes < o.input_chunk_min_bytes or x.id in outputs or len(readers.get(x.id, [])) != 1:
            continue
        start = readers[x.id][0]

        def fits(node, made):
            data = data_inputs(node)
            return (data is not None and all(v.rank and v.shape[0] == N for v in data + node.outputs)
                    and not any(v.id in made for v in node.inputs[1:] if v is not None))
        if not fits(nodes[start], ()):
            continue
        nb = N // min(o.input_chunks, N)  # the smallest slice
        budget = x.nbytes * o.chunk_flops_per_byte.get(dev.precision, 1000)
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
                if flops >= budget or nb * pixels < o.chunk_min_pixels.get(dev.precision, 2048):
                    break
                flops += _conv_flops(node)
            stop += 1
        bounds = [N * c // min(o.input_chunks, N) for c in range(min(o.input_chunks, N) + 1)]
        return Prefix(xi, start, stop, [(b0, b1 - b0) for b0, b1 in zip(bounds, bounds[1:])])
    return None


#  (every GPU tile's TK
# divides it) take their depth tap by tap (passes/layout.py): one window-table entry and one padding test per slice
