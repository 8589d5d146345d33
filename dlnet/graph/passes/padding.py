"""TensorFlow-style padding: begin != end pads become an explicit Pad node before the symmetric op."""
import numpy as np

from ..ir import Node


def _window_counts(node, shape, nsp, margin):
    """Taps of each AveragePool window that fall in [-margin, size + margin) of an input of `shape`, per output cell.

    margin 0: the cells of the unpadded input (count_include_pad=0); margin = the node's symmetric pads: what the
    kernel counts with count_include_pad=1 on the padded input.
    """
    a = node.attrs
    k, s, pads, dil = a["kernel_shape"], a["strides"], a["pads"], a["dilations"]
    out = node.outputs[0].shape[2:]
    counts = np.ones((), np.float64)
    for i in range(nsp):
        taps = (np.arange(out[i]) * s[i] - pads[i])[:, None] + np.arange(k[i])[None, :] * dil[i]
        m = margin[i]
        counts = np.multiply.outer(counts, ((taps >= -m) & (taps < shape[2 + i] + m)).sum(axis=1))
    return counts


def explicit_padding(graph):
    changed = False
    for node in list(graph.nodes):
        if node.op not in ("Conv", "MaxPool", "AveragePool"):
            continue
        x = node.inputs[0]
        nsp = x.rank - 2
        pads = list(node.attrs["pads"])
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
        if node.op == "AveragePool" and not node.attrs["count_include_pad"]:
            counts = _window_counts(node, x.shape, nsp, [0] * nsp)
        graph.set_input(node, 0, y)
        node.attrs["pads"] = tuple(sym + sym)
        if node.op == "AveragePool":
            node.attrs["count_include_pad"] = 1
        if counts is not None:
            # the pool now averages over whole windows of the padded input; rescale to the true cell count
            sym_counts = _window_counts(node, y.shape, nsp, sym)
            scale = (sym_counts / counts).astype(np.float32)
            out = node.outputs[0]
            z = graph.new_value(out.dtype, out.shape)
            graph.replace_all_uses(out, z)
            mul = Node("Mul", [out, graph.constant(scale.reshape((1, 1) + scale.shape))], [z], {},
                       node.name + "/count")
            graph.add_node(mul, graph.nodes.index(node) + 1)
        changed = True
    return changed
