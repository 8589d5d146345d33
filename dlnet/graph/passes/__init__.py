"""Graph passes. Each is a function graph -> changed (bool)."""
from .batchnorm import fold_batchnorm, fold_conv_affine
from .fold import fold_constants, remove_dead
from .fuse import fuse_epilogues, fuse_pointwise
from .normalize import normalize_layers
from .padding import explicit_padding

INFERENCE_PASSES = [explicit_padding, fold_batchnorm, fold_constants, fold_conv_affine, normalize_layers,
                    fuse_epilogues, fuse_pointwise, remove_dead]  # then the device's (kernels/schedule.py)


def run_passes(graph, passes=None, verify=True):
    for p in passes or INFERENCE_PASSES:
        p(graph)
        if verify:
            graph.verify()
    return graph
