"""Weight layout: constant Gemm weights used transposed are stored transposed once, so every kernel reads B
contiguous along the output columns (vector loads on CPUs, coalesced loads on GPUs) -- except in products of at
most `keep_rows` rows, which a GPU runs as gemv.cl: that reads B best as it comes, contiguous along k.

Constant convolution weights of KH x KW > 1 taps and a multiple of `multiple` channels go tap-major, [K, KH, KW, C]:
the GPU cores' depth (c, ky, kx) becomes (ky, kx, c), so a slice of depth is channels of one tap, whose window
position and padding test hold for the whole slice (gemm_fetch.cl's BC_STEP)."""
import numpy as np


def pretranspose_weights(graph, keep_rows=0):
    changed = False
    for node in graph.nodes:
        if node.op != "Gemm" or not node.attrs["transB"]:
            continue
        w = node.inputs[1]
        if w.const is None or w.param or w.rank != 2 or node.outputs[0].shape[-2] <= keep_rows:
            continue
        graph.set_input(node, 1, graph.constant(np.ascontiguousarray(w.const.T)))
        node.attrs["transB"] = 0
        changed = True
    return changed


def tap_major_weights(graph, multiple):
    changed = False
    for node in graph.nodes:
        if node.op != "Conv" or node.attrs.get("winograd") or node.attrs.get("tap_major"):
            continue
        w = node.inputs[1]
        if w.const is None or w.param or w.rank != 4 or w.shape[2] * w.shape[3] == 1 or w.shape[1] % multiple or \
                node.attrs["group"] != 1:
            continue
        graph.set_input(node, 1, graph.constant(np.ascontiguousarray(w.const.transpose(0, 2, 3, 1))))
        node.attrs["tap_major"] = 1
        changed = True
    return changed
