"""Graph passes. Each is a function graph -> changed (bool)."""
from .attention import fuse_attention
from .batchnorm import fold_batchnorm, fold_conv_affine
from .fold import fold_constants, remove_dead
from .fuse import fuse_epilogues, fuse_pointwise
from .normalize import normalize_layers
from .padding import explicit_padding
from .transformer import fuse_qkv, fuse_residual_norm, split_packed_projections
from .transposes import layernorm_layouts, rows_in_input_order, transposes_into_pointwise

# (remove_dead before fuse_attention: a score matrix read by dead nodes, nn.MultiheadAttention's unused averaged
# weights, is read by its product alone; fuse_residual_norm after fuse_epilogues: a Gemm that can take the residual
# Add as its C does better so, passes/transformer.py says why; fuse_qkv after fuse_attention's layouts, the Gemms'
# biases and the removal of the head Transposes fuse_attention left unread, before fuse_pointwise; a packed
# in-projection's split, the same views, then the Transposes nothing reads go)
# (layernorm_layouts and transposes_into_pointwise: ConvNeXt's layout copies; after the fusions, so that a Transpose
# joins the Fused chain that reads it; rows_in_input_order once attention, the packed projections and their views are
# in place, before fuse_pointwise: it follows single pointwise nodes)
INFERENCE_PASSES = [explicit_padding, fold_batchnorm, fold_constants, fold_conv_affine, normalize_layers, remove_dead,
                    fuse_attention, fuse_epilogues, fuse_residual_norm, remove_dead, fuse_qkv,
                    split_packed_projections, remove_dead, rows_in_input_order, fuse_pointwise, layernorm_layouts,
                    transposes_into_pointwise, remove_dead]  # then the device's (schedule.py)


def run_passes(graph, passes=None, verify=True):
    for p in passes or INFERENCE_PASSES:
        p(graph)
        if verify:
            graph.verify()
    return graph
