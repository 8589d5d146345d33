"""Weight layout: constant Gemm weights used transposed are stored transposed once, so every kernel reads B
contiguous along the output columns (vector loads on CPUs, coalesced loads on GPUs) -- except in products of at
most `keep_rows` rows, which a GPU runs as gemv.cl: that reads B best as it comes, contiguous along k."""
import numpy as np


def pretranspose_weights(graph, keep_rows=0):
    changed = False
    for node in graph.nodes:
        if node.op != "Gemm" or not node.attrs.get("transB", 0):
            continue
        w = node.inputs[1]
        if w.const is None or w.param or w.rank != 2 or node.outputs[0].shape[-2] <= keep_rows:
            continue
        graph.set_input(node, 1, graph.constant(np.ascontiguousarray(w.const.T)))
        node.attrs["transB"] = 0
        changed = True
    return changed
