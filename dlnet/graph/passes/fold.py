"""Constant folding and dead-code removal."""
import numpy as np

from ...limits import MAX_FOLD_ELEMENTS, elements


def fold_constants(graph):
    """Evaluate on the host every node whose inputs are all constants (and not trainable)."""
    changed = False
    for node in list(graph.nodes):
        spec = node.spec
        if spec.numpy is None or any(v is not None and (v.const is None or v.param) for v in node.inputs):
            continue
        if any(elements(v.shape) > MAX_FOLD_ELEMENTS for v in node.outputs):  # too big for the host: on the device
            continue
        results = spec.numpy(node, *[None if v is None else v.const for v in node.inputs])
        if results is None:
            continue
        graph.remove_node(node)
        for v, r in zip(node.outputs, results):
            v.const = np.asarray(r, dtype=v.dtype).reshape(v.shape)
            v.producer = None
        changed = True
    return changed


def remove_dead(graph):
    """Drop nodes none of whose outputs reach a graph output."""
    live = {v.id for v in graph.outputs}
    keep = []
    for node in reversed(graph.nodes):
        if any(v.id in live for v in node.outputs):
            keep.append(node)
            live.update(v.id for v in node.inputs if v is not None)
    changed = len(keep) != len(graph.nodes)
    for node in graph.nodes:
        if node not in keep:
            for v in node.inputs:
                if v is not None and node in v.users:
                    v.users.remove(node)
    graph.nodes = list(reversed(keep))
    return changed
