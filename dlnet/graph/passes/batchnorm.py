"""Inference BatchNormalization: folded into the preceding Conv's weights and bias, else a per-channel Mul+Add; and
per-channel Mul / Add by constants right after a Conv folded the same way (fold_conv_affine)."""
import numpy as np

from ..ir import Node


def _scale_shift(node):
    x, scale, b, mean, var = node.inputs
    inv = scale.const.astype(np.float64) / np.sqrt(var.const.astype(np.float64) + node.attrs["epsilon"])
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


def fold_conv_affine(graph):
    """A Conv's only reader that multiplies or adds a per-channel constant (Caffe's Scale layer after a BatchNorm
    folded into the Conv: densenet121's 120, each a kernel of its own otherwise) folded into the Conv's constant
    weights and bias, one after another."""
    from .fuse import _absorb, _per_channel, _single_user
    changed = False
    for node in list(graph.nodes):
        while node.op == "Conv" and node in graph.nodes and not node.attrs.get("act") and len(node.inputs) <= 3:
            w, y = node.inputs[1], node.outputs[0]
            bias = node.inputs[2] if len(node.inputs) > 2 else None
            if w.const is None or w.param or (bias is not None and (bias.const is None or bias.param)) or \
                    not _single_user(graph, y):
                break
            nxt = y.users[0]
            if nxt.op not in ("Mul", "Add") or nxt.inputs.count(y) != 1:
                break
            other = nxt.inputs[1] if nxt.inputs[0] is y else nxt.inputs[0]
            if other.dtype != y.dtype or not _per_channel(other, y):
                break
            c = other.const.reshape(-1).astype(np.float64)
            b = bias.const.astype(np.float64) if bias is not None else np.zeros(w.shape[0])
            if nxt.op == "Mul":  # (as fold_batchnorm: the weights' product in their own precision)
                scaled = w.const * c.astype(w.const.dtype).reshape((-1,) + (1,) * (w.rank - 1))
                graph.set_input(node, 1, graph.constant(scaled.astype(w.dtype, copy=False)))
                b = b * c
            else:
                b = b + c
            new_b = graph.constant(b.astype(y.dtype))
            if bias is not None:
                graph.set_input(node, 2, new_b)
            else:
                node.inputs.append(new_b)
                new_b.users.append(node)
            _absorb(graph, node, nxt)
            changed = True
    return changed
