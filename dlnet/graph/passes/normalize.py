"""Recognise LayerNorm, RMSNorm and GELU in the primitives exporters decompose them into (PyTorch's TorchScript exporter
before op-set 17 for LayerNorm, before 20 for GELU; every exporter before op-set 23 for RMSNorm).

LayerNorm:  d = x - ReduceMean(x, axes);  d / Sqrt(ReduceMean(Pow(d, 2), axes) + eps)  [* scale]  [+ bias], axes
            the trailing ones (several: on a view of x with them merged, Reshapes that copy nothing)
RMSNorm:    x * Reciprocal(Sqrt(ReduceMean(x^2, axes) + eps)) (or x * (1 / Sqrt(..)), x / Sqrt(..))  [* scale], x^2
            as Pow(x, 2) or x * x (torch 2.13's dynamo exporter writes nn.RMSNorm so at op-set 20, both exporters
            Llama's hand-written x * rsqrt(mean(x^2) + eps) * w)
GELU:       x * 0.5 * (1 + Erf(x / sqrt 2)), with the three factors multiplied in any order;
GELU tanh:  x * 0.5 * (1 + Tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))), likewise.
Each becomes one node (LayerNorm, RMSNorm: one row kernel; Gelu, GeluTanh: a pointwise op that still fuses with its
neighbours).
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
def _trailing_mean(node, x):
    """The first axis k of a keepdims mean of x over its trailing axes [k, rank), else None."""
    if node is None or node.op != "Reduce" or node.attrs["mode"] != "mean" or node.inputs[0] is not x or \
            not node.attrs["keepdims"]:
        return None
    axes = sorted(a % x.rank for a in node.attrs["axes"])
    return axes[0] if axes == list(range(x.rank - len(axes), x.rank)) and axes else None


def _row_vector(graph, v, x, k):
    """`v` as a [D] constant (D: the size of x's axes [k, rank)) when it is a constant broadcasting only along those
    axes, else None."""
    inner = x.shape[k:]
    D = int(np.prod(inner, dtype=np.int64))
    if v is None or v.const is None or v.dtype != x.dtype or v.rank > x.rank:
        return None
    lead = v.shape[:max(0, v.rank - len(inner))]
    if any(d != 1 for d in lead) or np.broadcast_shapes(v.shape[len(lead):], inner) != inner:
        return None
    if v.shape == (D,) and k == x.rank - 1:
        return v
    if v.param:  # a trainable weight keeps its own shape: leave its Mul/Add outside
        return None
    return graph.constant(np.broadcast_to(v.const.reshape(v.shape[len(lead):]), inner).reshape(D).astype(x.dtype))


def _match_layernorm(graph, mean1):
    x = mean1.inputs[0]
    k = _trailing_mean(mean1, x) if x.dtype == "float32" and x.rank else None
    if k is None:
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
    if _trailing_mean(mean2, square.outputs[0]) != k:
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
        scale = _row_vector(graph, _other(mul, div.outputs[0]), x, k)
        if scale is not None:
            matched.append(mul)
    tail = matched[-1].outputs[0]
    shift = _sole_user(graph, tail, "Add")
    if shift is not None:
        bias = _row_vector(graph, _other(shift, tail), x, k)
        if bias is not None:
            matched.append(shift)
    if matched[-1].outputs[0].shape != x.shape:
        return None
    D = int(np.prod(x.shape[k:], dtype=np.int64))
    scale = scale if scale is not None else graph.constant(np.ones(D, x.dtype))
    bias = bias if bias is not None else graph.constant(np.zeros(D, x.dtype))
    return matched, [x, scale, bias], {"epsilon": eps}, x.shape[:k] + (D,)


def _scaled_tail(graph, matched, x, k):
    """The optional `* scale` after the normalised value (the last matched node's output): (scale or None, nodes)."""
    mul = _sole_user(graph, matched[-1].outputs[0], "Mul")
    scale = _row_vector(graph, _other(mul, matched[-1].outputs[0]), x, k) if mul is not None else None
    return scale, matched + ([mul] if scale is not None else [])


def _match_rmsnorm(graph, mean):
    """x * rsqrt(mean(x^2) + eps) [* scale] from the mean of the squares: (matched, [x, scale], attrs, view)."""
    square = mean.inputs[0].producer
    if square is None or not (square.op == "Pow" and _near(square.inputs[1], 2.0)) and \
            not (square.op == "Mul" and square.inputs[0] is square.inputs[1]):
        return None
    x = square.inputs[0]
    if x.dtype != "float32" or not x.rank or _sole_user(graph, square.outputs[0], "Reduce") is not mean:
        return None
    k = _trailing_mean(mean, square.outputs[0])
    add = _sole_user(graph, mean.outputs[0], "Add") if k is not None else None
    eps = _scalar(_other(add, mean.outputs[0])) if add is not None else None
    sqrt = _sole_user(graph, add.outputs[0], "Sqrt") if eps is not None else None
    if sqrt is None or len(sqrt.outputs[0].users) != 1 or sqrt.outputs[0] in graph.outputs:
        return None
    matched = [square, mean, add, sqrt]
    step = sqrt.outputs[0].users[0]
    if step.op == "Div" and step.inputs == [x, sqrt.outputs[0]]:  # x / sqrt(..)
        matched.append(step)
    else:  # x * (1 / sqrt(..)): Reciprocal, or Div of 1
        if not (step.op == "Reciprocal" or (step.op == "Div" and step.inputs[1] is sqrt.outputs[0] and
                                            _near(step.inputs[0], 1.0))):
            return None
        mul = _sole_user(graph, step.outputs[0], "Mul")
        if mul is None or _other(mul, step.outputs[0]) is not x:
            return None
        matched += [step, mul]
    scale, matched = _scaled_tail(graph, matched, x, k)
    if matched[-1].outputs[0].shape != x.shape:
        return None
    D = int(np.prod(x.shape[k:], dtype=np.int64))
    scale = scale if scale is not None else graph.constant(np.ones(D, x.dtype))
    return matched, [x, scale], {"epsilon": eps}, x.shape[:k] + (D,)


def _replace_viewed(graph, matched, op, inputs, attrs, view):
    """As _replace, the op reading its first input viewed as `view` (trailing axes merged: Reshape, no copy) and its
    output reshaped back."""
    end = matched[-1]
    out = end.outputs[0]
    x = inputs[0]
    flat, y = graph.new_value(x.dtype, view), graph.new_value(out.dtype, view)
    _replace(graph, matched, "Reshape", [y], {"shape": out.shape})
    at = graph.nodes.index(out.producer)
    graph.add_node(Node("Reshape", [x], [flat], {"shape": view}, end.name), at)
    graph.add_node(Node(op, [flat] + inputs[1:], [y], attrs, end.name), at + 1)


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
    return _gelu_tail(graph, x, erf, [scaled, erf])


def _match_gelu_tanh(graph, tanh):
    """x * 0.5 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))), x^3 as Pow(x, 3) or x * (x * x), any order."""
    a = tanh.inputs[0]
    scaled = a.producer
    if scaled is None or scaled.op != "Mul" or _sole_user(graph, a, "Tanh") is not tanh:
        return None
    inner = _factor_of(scaled, math.sqrt(2.0 / math.pi))
    add = inner.producer if inner is not None and _sole_user(graph, inner, "Mul") is scaled else None
    if add is None or add.op != "Add":
        return None
    for x, term in (add.inputs, add.inputs[::-1]):
        mul = term.producer if _sole_user(graph, term, "Add") is add else None
        cube = _factor_of(mul, 0.044715) if mul is not None and mul.op == "Mul" else None
        powers = _cube_of(graph, cube, x, mul) if cube is not None else None
        if powers is not None:
            return _gelu_tail(graph, x, tanh, powers + [mul, add, scaled, tanh])
    return None


def _factor_of(mul, c):
    """The other operand of Mul node `mul` when one operand is the constant c, else None."""
    if mul is None or mul.op != "Mul":
        return None
    for v, other in (mul.inputs, mul.inputs[::-1]):
        if _near(v, c) and not _near(other, c):
            return other
    return None


def _cube_of(graph, v, x, reader):
    """The nodes computing v = x^3 (Pow(x, 3), or x * (x * x) in either order) when `reader` is v's only reader."""
    node = v.producer
    if node is None or _sole_user(graph, v, reader.op) is not reader:
        return None
    if node.op == "Pow" and node.inputs[0] is x and _near(node.inputs[1], 3.0):
        return [node]
    if node.op != "Mul" or x not in node.inputs:
        return None
    square = _other(node, x)
    sq = square.producer if square is not None else None
    if sq is None or sq.op != "Mul" or sq.inputs != [x, x] or _sole_user(graph, square, "Mul") is not node:
        return None
    return [sq, node]


def _gelu_tail(graph, x, core, matched):
    """The rest of a GELU whose Erf or Tanh node is `core` ((1 + core) times x and 0.5), `matched` the nodes so far:
    (matched nodes, [x], {}) or None."""
    if x.dtype not in ("float32", "float64"):
        return None
    one = _sole_user(graph, core.outputs[0], "Add")
    if one is None or not _near(_other(one, core.outputs[0]), 1.0):
        return None
    matched = matched + [one]
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
    """Replace decomposed LayerNorm, RMSNorm and GELU subgraphs by LayerNorm, RMSNorm, Gelu and GeluTanh nodes."""
    changed = False
    for node in list(graph.nodes):
        if node.op not in ("Reduce", "Erf", "Tanh") or node not in graph.nodes:  # (the op first: linear)
            continue
        if node.op == "Reduce":
            op, found = "LayerNorm", _match_layernorm(graph, node)
            if found is None:
                op, found = "RMSNorm", _match_rmsnorm(graph, node)
            if found is not None and found[3] != found[1][0].shape:  # over several trailing axes: on a view
                _replace_viewed(graph, found[0], op, *found[1:])
                changed = True
                continue
        elif node.op == "Erf":
            found = _match_gelu(graph, node)
            op = "Gelu"
        elif node.op == "Tanh":
            found = _match_gelu_tanh(graph, node)
            op = "GeluTanh"
        else:
            continue
        if found is not None:
            matched, inputs, attrs = found[:3]
            _replace(graph, matched, op, inputs, attrs)
            changed = True
    return changed


def layer_norm_stats(graph):
    """LayerNorm -> LayerNormStats before autodiff: the same kernel also keeps each row's mean and 1 / sqrt(var + eps),
    so the gradient reads them instead of computing them again (LayerNorm's own rule takes four row means over x and
    dy, this one two: ViT-B/16's 25 LayerNorms at batch 16 launched 100 means of 768 elements over 3152 rows)."""
    changed = False
    for node in list(graph.nodes):
        if node.op != "LayerNorm":
            continue
        x, y = node.inputs[0], node.outputs[0]
        stats = [graph.new_value("float32", x.shape[:-1] + (1,)) for _ in range(2)]
        at = graph.nodes.index(node)
        graph.remove_node(node)
        graph.add_node(Node("LayerNormStats", list(node.inputs), [y] + stats, node.attrs, node.name, node.schedule),
                       at)
        changed = True
    return changed
