"""Recognise LayerNorm and exact GELU in the primitives PyTorch decomposes them into at op-set 13.

LayerNorm:  d = x - ReduceMean(x, -1);  d / Sqrt(ReduceMean(Pow(d, 2), -1) + eps)  [* scale]  [+ bias]
GELU:       x * 0.5 * (1 + Erf(x / sqrt 2)), with the three factors multiplied in any order.
Each becomes one node (LayerNorm: one row kernel; Gelu: a pointwise row that still fuses with its neighbours).
"""
import math

import numpy as np

from ..ir import Node


def _scalar(v):
    """The value of a one-element constant, else None."""
    if v is None or v.const is None or v.size != 1:
        return None
    return float(np.asarray(v.const).reshape(()))


def _near(v, target):
    c = _scalar(v)
    return c is not None and math.isclose(c, target, rel_tol=1e-6)


def _other(node, v):
    """The operand of binary `node` that is not `v` (None when v is not exactly one of them)."""
    a, b = node.inputs
    if a is v and b is not v:
        return b
    if b is v and a is not v:
        return a
    return None


def _sole_user(graph, v, op):
    """The only reader of `v` when it is an `op` node and `v` is no graph output, else None."""
    if v in graph.outputs or len(set(v.users)) != 1 or len(v.users) != 1:
        return None
    user = v.users[0]
    return user if user.op == op else None


def _replace(graph, matched, op, inputs, attrs):
    """Swap the `matched` nodes (the last one writes the result) for one `op` node writing the same value."""
    end = matched[-1]
    out = end.outputs[0]
    at = graph.nodes.index(end) - (len(matched) - 1)  # every matched node runs before `end`
    for n in matched:
        graph.remove_node(n)
    out.producer = None
    graph.add_node(Node(op, inputs, [out], attrs, end.name), at)


# ---------------------------------------------------------------------------------------------------- LayerNorm
def _last_axis_mean(node, x):
    return (node is not None and node.op == "Reduce" and node.attrs["mode"] == "mean" and node.inputs[0] is x and
            tuple(a % x.rank for a in node.attrs["axes"]) == (x.rank - 1,) and node.attrs["keepdims"])


def _row_vector(graph, v, x):
    """`v` as a [D] constant when it is a constant broadcasting only along x's last axis, else None."""
    D = x.shape[-1]
    if v is None or v.const is None or v.dtype != x.dtype or v.rank > x.rank or v.size not in (1, D):
        return None
    if any(d != 1 for d in v.shape[:-1]):
        return None
    if v.shape == (D,):
        return v
    if v.param:  # a trainable weight keeps its own shape: leave its Mul/Add outside
        return None
    return graph.constant(np.broadcast_to(v.const.reshape(-1), (D,)).astype(x.dtype))


def _match_layernorm(graph, mean1):
    x = mean1.inputs[0]
    if x.dtype != "float32" or x.rank == 0 or not _last_axis_mean(mean1, x):
        return None
    sub = _sole_user(graph, mean1.outputs[0], "Sub")
    if sub is None or sub.inputs[0] is not x or sub.inputs[1] is not mean1.outputs[0]:
        return None
    d = sub.outputs[0]
    if d in graph.outputs:
        return None
    readers = set(d.users)
    square = next((n for n in readers if n.op == "Pow" and n.inputs[0] is d and _near(n.inputs[1], 2.0)), None) or \
        next((n for n in readers if n.op == "Mul" and n.inputs[0] is d and n.inputs[1] is d), None)
    div = next((n for n in readers if n.op == "Div" and n.inputs[0] is d), None)
    if square is None or div is None or readers != {square, div} or div.inputs[1] is d:
        return None
    mean2 = _sole_user(graph, square.outputs[0], "Reduce")
    if not _last_axis_mean(mean2, square.outputs[0]):
        return None
    add = _sole_user(graph, mean2.outputs[0], "Add")
    eps = _scalar(_other(add, mean2.outputs[0])) if add is not None else None
    if eps is None:
        return None
    sqrt = _sole_user(graph, add.outputs[0], "Sqrt")
    if sqrt is None or _sole_user(graph, sqrt.outputs[0], "Div") is not div:
        return None
    matched = [mean1, sub, square, mean2, add, sqrt, div]
    scale = bias = None
    mul = _sole_user(graph, div.outputs[0], "Mul")
    if mul is not None:
        scale = _row_vector(graph, _other(mul, div.outputs[0]), x)
        if scale is not None:
            matched.append(mul)
    tail = matched[-1].outputs[0]
    shift = _sole_user(graph, tail, "Add")
    if shift is not None:
        bias = _row_vector(graph, _other(shift, tail), x)
        if bias is not None:
            matched.append(shift)
    D = x.shape[-1]
    scale = scale if scale is not None else graph.constant(np.ones(D, x.dtype))
    bias = bias if bias is not None else graph.constant(np.zeros(D, x.dtype))
    return matched, [x, scale, bias], {"epsilon": eps}


# ---------------------------------------------------------------------------------------------------- GELU
def _match_gelu(graph, erf):
    a = erf.inputs[0]
    scaled = a.producer
    if scaled is None or _sole_user(graph, a, "Erf") is not erf:
        return None
    if (scaled.op == "Div" and _near(scaled.inputs[1], math.sqrt(2.0))) or \
            (scaled.op == "Mul" and _near(scaled.inputs[1], math.sqrt(0.5))):
        x = scaled.inputs[0]
    elif scaled.op == "Mul" and _near(scaled.inputs[0], math.sqrt(0.5)):
        x = scaled.inputs[1]
    else:
        return None
    if x.dtype not in ("float32", "float64"):
        return None
    one = _sole_user(graph, erf.outputs[0], "Add")
    if one is None or not _near(_other(one, erf.outputs[0]), 1.0):
        return None
    matched = [scaled, erf, one]
    # (1 + erf) times x and 0.5: two Muls in either order, or one Mul by a (0.5 * x) computed beside it
    v, factors = one.outputs[0], []
    while len(factors) < 2:
        mul = _sole_user(graph, v, "Mul")
        other = _other(mul, v) if mul is not None else None
        if other is None:
            return None
        matched.append(mul)
        v = mul.outputs[0]
        if other is x:
            factors.append("x")
        elif _near(other, 0.5):
            factors.append("half")
        else:
            half_x = other.producer
            if half_x is None or half_x.op != "Mul" or _sole_user(graph, other, "Mul") is not mul or \
                    not _near(_other(half_x, x), 0.5):
                return None
            matched.insert(0, half_x)
            factors += ["x", "half"]
    if sorted(factors) != ["half", "x"] or v.shape != x.shape:
        return None
    matched.sort(key=graph.nodes.index)
    return matched, [x], {}


def normalize_layers(graph):
    """Replace decomposed LayerNorm and exact GELU subgraphs by LayerNorm and Gelu nodes."""
    changed = False
    for node in list(graph.nodes):
        if node.op not in ("Reduce", "Erf") or node not in graph.nodes:  # (the op first: a linear pass on the rest)
            continue
        if node.op == "Reduce":
            found = _match_layernorm(graph, node)
            op = "LayerNorm"
        elif node.op == "Erf":
            found = _match_gelu(graph, node)
            op = "Gelu"
        else:
            continue
        if found is not None:
            matched, inputs, attrs = found
            _replace(graph, matched, op, inputs, attrs)
            changed = True
    return changed
