"""Inference BatchNormalization: folded into the preceding Conv's weights and bias, else a per-channel Mul+Add."""
import numpy as np

from ..ir import Node


def _scale_shift(node):
    x, scale, b, mean, var = node.inputs
    inv = scale.const.astype(np.float64) / np.sqrt(var.const.astype(np.float64) + node.attrs.get("epsilon", 1e-5))
    shift = b.const.astype(np.float64) - mean.const.astype(np.float64) * inv
    return inv, shift


def fold_batchnorm(graph):
    changed = False
    for node in list(graph.nodes):
        if node.op != "BatchNormalization" or any(v.const is None or v.param for v in node.inputs[1:]):
            continue
        x, y = node.inputs[0], node.outputs[0]
        inv, shift = _scale_shift(node)
        conv = x.producer
        if (conv is not None and conv.op == "Conv" and len(x.users) == 1 and x not in graph.outputs
                and conv.inputs[1].const is not None and not conv.inputs[1].param
                and not conv.attrs.get("act") and len(conv.inputs) <= 3):
            w = conv.inputs[1].const
            bias = conv.inputs[2].const.astype(np.float64) if len(conv.inputs) > 2 else np.zeros(w.shape[0])
            # in the weights' own precision (one product, rounded once more than in float64): a float64 copy of
            # resnet50's weights took a third of a warm start's planning
            new_w = w * inv.astype(w.dtype).reshape((-1,) + (1,) * (w.ndim - 1))
            graph.set_input(conv, 1, graph.constant(new_w.astype(conv.inputs[1].dtype, copy=False)))
            new_b = graph.constant((bias * inv + shift).astype(x.dtype))
            if len(conv.inputs) > 2:
                graph.set_input(conv, 2, new_b)
            else:
                conv.inputs.append(new_b)
                new_b.users.append(conv)
            graph.replace_all_uses(y, x)
            graph.remove_node(node)
        else:
            shape = (1, -1) + (1,) * (x.rank - 2)
            mid = graph.new_value(x.dtype, x.shape)
            i = graph.nodes.index(node)
            graph.remove_node(node)
            graph.add_node(Node("Mul", [x, graph.constant(inv.astype(x.dtype).reshape(shape))], [mid], {},
                                node.name + "/scale"), i)
            graph.add_node(Node("Add", [mid, graph.constant(shift.astype(x.dtype).reshape(shape))], [y], {},
                                node.name + "/shift"), i + 1)
        changed = True
    return changed
