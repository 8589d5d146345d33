"""Every pipeline, in one place: the only module that orders passes.

ONNX -> graph (onnx/importer.py) -> generic passes (graph/passes) -> device passes (kernels/schedule.py: weight
layouts this device reads best) -> Plan (plan.py: the schedule, the memory plan, the launches). Inference, the stage
after a host step and training each take their graph from here.
"""
from .graph.passes import run_passes
from .graph.passes.attention import fuse_attention, fused_attention_grads
from .graph.passes.fold import fold_constants, remove_dead
from .graph.passes.fuse import broadcast_expands, fuse_pointwise, fuse_reduce_prologues
from .graph.passes.layout import flatten_gemm_rows
from .graph.passes.normalize import layer_norm_stats, normalize_layers
from .graph.passes.padding import explicit_padding
from .graph.passes.transposes import slice_grads_into_concat, transposes_into_products
from .kernels.schedule import device_passes
from .onnx.importer import Importer

# a training graph keeps its weights as parameters: no BatchNormalization folding, no convolution epilogues that would
# hide a gradient's input; only what keeps the backward graph exact
TRAINING_PASSES = [fold_constants, broadcast_expands, slice_grads_into_concat, fuse_pointwise, fuse_reduce_prologues,
                   remove_dead]


def inference_graph(model, path, shapes, ctx, passes=True, outputs=None, values=None):
    """The graph of `model` for these input shapes after the generic and ctx's device passes (passes=False: as
    imported). outputs: the names of the model outputs to keep (None: all); dead-code removal then drops the work
    only the others need (a graph that stops before a host step keeps every value it hands on). values: inputs bound
    as constants ({name: array}; given, small inputs that decide shapes raise importer.BindInputs)."""
    graph = Importer(model, path).build(shapes, values=values)
    if outputs is not None and graph.cut is None:
        kept = [(v, n) for v, n in zip(graph.outputs, graph.output_names) if n in outputs]
        graph.outputs, graph.output_names = [v for v, _ in kept], [n for _, n in kept]
    return device_passes(run_passes(graph), ctx) if passes else graph


def stage_graph(model, path, start, types, consts, ctx):
    """The graph of the model from ONNX node `start` on (after a host step), for inputs of these types."""
    graph = Importer(model, path).build_stage(start, types, consts)
    return device_passes(run_passes(graph), ctx)


def training_import(model, path, shapes, attention_grads=False):
    """(graph, importer) of the forward graph for training (batch statistics, active Dropout, float initializers as
    parameters), its padding explicit (the gradients read it so) and its attention fused before autodiff (the
    forward runs the fused kernel, the backward Attention's rule; trainable scales and masks stay inputs). Products
    of a sequence by a weight become one 2-D product before autodiff too, so their weight gradient is one product;
    LayerNorms keep their row statistics for their gradients; products read transposed weights as they are stored.
    Decomposed LayerNorms, RMSNorms and GELUs become their ops first, so that each takes its op's one gradient rule.
    attention_grads: attention's gradient as one AttentionGrad node (fused kernels), not its decomposition (True:
    every Attention node's; a function: those of the nodes it takes)."""
    imp = Importer(model, path)
    graph = imp.build(shapes, training=True)
    explicit_padding(graph)
    normalize_layers(graph)
    fuse_attention(graph)
    if attention_grads:
        fused_attention_grads(graph, None if attention_grads is True else attention_grads)
    transposes_into_products(graph)
    flatten_gemm_rows(graph)
    layer_norm_stats(graph)
    return graph, imp


def training_passes(graph, ctx):
    """A forward graph with its loss and gradients: the training passes, then the device's (Winograd on the device
    where it pays)."""
    run_passes(graph, TRAINING_PASSES)
    return device_passes(graph, ctx, training=True)
