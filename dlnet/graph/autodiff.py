"""Reverse-mode autodiff on the IR: the backward graph is appended to the forward graph, so one liveness plan
covers both and each activation lives only until the last backward node that reads it.

Each op's `grad(b, node, dys)` returns one gradient per input at the op's own (broadcast) shape; gradients are
summed back to the input's shape here, once, and accumulated with Add where a value has several readers.
"""
import numpy as np

from ..errors import ModelError
from .ir import Builder

FLOATS = ("float32", "float64", "float16")


def reduce_to_shape(b, g, shape):
    """Sum a broadcast gradient `g` back to `shape` (numpy broadcasting rules)."""
    shape = tuple(shape)
    if g.shape == shape:
        return g
    lead = g.rank - len(shape)
    axes = [i for i in range(lead)]
    axes += [lead + i for i, d in enumerate(shape) if d == 1 and g.shape[lead + i] != 1]
    if axes:
        g = b.op("Reduce", [g], {"mode": "sum", "axes": tuple(axes), "keepdims": 1})
    if g.shape != shape:
        g = b.op("Reshape", [g], {"shape": shape})
    return g


def requires_grad(graph, wrt):
    """Ids of every float value that depends on one of `wrt` through differentiable ops (a piecewise constant op,
    `differentiable = False`, passes a zero gradient: no path goes through it)."""
    need = {v.id for v in wrt}
    for node in graph.nodes:
        if node.spec.differentiable and any(v is not None and v.id in need for v in node.inputs):
            need.update(v.id for v in node.outputs if v.dtype in FLOATS)
    return need


def gradients(graph, loss, wrt):
    """Append the backward graph of scalar `loss` w.r.t. the values `wrt`; returns their gradient values.

    A value of `wrt` the loss does not depend on gets None.
    """
    if loss.size != 1:
        raise ModelError(f"autodiff: the loss must be a scalar, got {loss.type_str()}")
    need = requires_grad(graph, wrt)
    b = Builder(graph)
    grads = {loss.id: b.const(np.ones(loss.shape, loss.dtype))}
    for node in reversed(list(graph.nodes)):
        if not any(o.id in grads for o in node.outputs):
            continue
        if not any(v is not None and v.id in need for v in node.inputs):
            continue
        dys = []
        for o in node.outputs:
            g = grads.get(o.id)
            if g is None and o.dtype in FLOATS:
                g = b.const(np.zeros(o.shape, o.dtype))
            dys.append(g)
        b.node_name = f"{node.name}/grad" if node.name else ""
        din = node.spec.grad(b, node, dys)
        if din is None:
            raise ModelError(f"autodiff: node {node.name} ({node.op}) has no gradient rule")
        for x, g in zip(node.inputs, din):
            if x is None or g is None or x.id not in need:
                continue
            g = reduce_to_shape(b, g, x.shape)
            if g.dtype != x.dtype:
                g = b.op("Cast", [g], {"to": x.dtype})
            prev = grads.get(x.id)
            grads[x.id] = g if prev is None else b.op("Add", [prev, g])
    return [grads.get(v.id) for v in wrt]
