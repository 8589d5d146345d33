"""Weight layout: constant Gemm weights used transposed are stored transposed once, so every kernel reads B
contiguous along the output columns (vector loads on CPUs, coalesced loads on GPUs)."""
import numpy as np


def pretranspose_weights(graph):
    changed = False
    for node in graph.nodes:
        if node.op != "Gemm" or not node.attrs.get("transB", 0):
            continue
        w = node.inputs[1]
        if w.const is None or w.param or w.rank != 2:
            continue
        graph.set_input(node, 1, graph.constant(np.ascontiguousarray(w.const.T)))
        node.attrs["transB"] = 0
        changed = True
    return changed
