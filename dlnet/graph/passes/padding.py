"""TensorFlow-style padding: begin != end pads become an explicit Pad node before the symmetric op."""
import numpy as np

from ..ir import Node


def _pool_count(shape, node, nsp):
    """Cells of each window inside the unpadded input (for AveragePool without count_include_pad)."""
    a = node.attrs
    k, s = a["kernel_shape"], a.get("strides") or [1] * nsp
    pads = a.get("pads") or [0] * 2 * nsp
    dil = a.get("dilations") or [1] * nsp
    out = node.outputs[0].shape[2:]
    counts = np.ones((), np.float64)
    for i in range(nsp):
        starts = np.arange(out[i]) * s[i] - pads[i]
        taps = starts[:, None] + np.arange(k[i])[None, :] * dil[i]
        c = ((taps >= 0) & (taps < shape[2 + i])).sum(axis=1)
        counts = np.multiply.outer(counts, c)
    return counts


def explicit_padding(graph):
    changed = False
    for node in list(graph.nodes):
        if node.op not in ("Conv", "MaxPool", "AveragePool"):
            continue
        x = node.inputs[0]
        nsp = x.rank - 2
        pads = list(node.attrs.get("pads") or [0] * 2 * nsp)
        if all(pads[i] == pads[i + nsp] for i in range(nsp)):
            continue
        sym = [min(pads[i], pads[i + nsp]) for i in range(nsp)]
        extra = [pads[i] - sym[i] for i in range(nsp)] + [pads[i + nsp] - sym[i] for i in range(nsp)]
        full = [0, 0] + extra[:nsp] + [0, 0] + extra[nsp:]
        value = float("-inf") if node.op == "MaxPool" else 0.0
        y = graph.new_value(x.dtype, [d + full[i] + full[i + x.rank] for i, d in enumerate(x.shape)])
        pad = Node("Pad", [x], [y], {"pads": tuple(full), "mode": "constant", "value": value}, node.name + "/pad")
        graph.add_node(pad, graph.nodes.index(node))
        counts = None
        if node.op == "AveragePool" and not node.attrs.get("count_include_pad", 0):
            counts = _pool_count(x.shape, node, nsp)
        graph.set_input(node, 0, y)
        node.attrs["pads"] = tuple(sym + sym)
        if node.op == "AveragePool":
            node.attrs["count_include_pad"] = 1
        if counts is not None:
            # the pool now averages over whole windows of the padded input; rescale to the true cell count
            sym_counts = _pool_count_padded(node, y.shape, nsp)
            scale = (sym_counts / counts).astype(np.float32)
            out = node.outputs[0]
            z = graph.new_value(out.dtype, out.shape)
            graph.replace_all_uses(out, z)
            mul = Node("Mul", [out, graph.constant(scale.reshape((1, 1) + scale.shape))], [z], {},
                       node.name + "/count")
            graph.add_node(mul, graph.nodes.index(node) + 1)
        changed = True
    return changed


def _pool_count_padded(node, padded_shape, nsp):
    """Cells each window counts after padding: the padded input's cells inside the window, plus symmetric pads."""
    a = node.attrs
    k, s = a["kernel_shape"], a.get("strides") or [1] * nsp
    pads = a["pads"]
    dil = a.get("dilations") or [1] * nsp
    out = node.outputs[0].shape[2:]
    counts = np.ones((), np.float64)
    for i in range(nsp):
        starts = np.arange(out[i]) * s[i] - pads[i]
        taps = starts[:, None] + np.arange(k[i])[None, :] * dil[i]
        # count_include_pad=1 counts every tap up to the symmetric padded border
        c = ((taps >= -pads[i]) & (taps < padded_shape[2 + i] + pads[i])).sum(axis=1)
        counts = np.multiply.outer(counts, c)
    return counts
