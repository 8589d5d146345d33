"""Winograd weights: a 3x3 stride-1 convolution that lowering will run as Winograd F(2x2, 3x3) gets its constant
weights w [K, C, 3, 3] replaced by U = G w G^T [4, 4, K, C] (computed once, in float64), so the planner stores U
instead of w. Device-dependent: Net runs it only where the lowering has a Winograd path (winograd_min_channels)."""
import numpy as np

G = np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]])


def winograd_eligible(node, min_channels):
    if node.op != "Conv" or node.attrs.get("winograd") or len(node.inputs[0].shape) != 4:
        return False
    w = node.inputs[1]
    a = node.attrs
    return (min_channels > 0 and w.const is not None and not w.param and w.shape[2:] == (3, 3)
            and list(a.get("strides") or [1, 1]) == [1, 1] and list(a.get("dilations") or [1, 1]) == [1, 1]
            and a.get("group", 1) == 1 and min(w.shape[0], w.shape[1]) >= min_channels)


def winograd_weights(graph, min_channels):
    changed = False
    for node in graph.nodes:
        if not winograd_eligible(node, min_channels):
            continue
        w = node.inputs[1]
        u = np.einsum("ai,kcij,bj->abkc", G, np.asarray(w.const, np.float64), G).astype(np.float32)
        graph.set_input(node, 1, graph.constant(np.ascontiguousarray(u)))
        node.attrs["winograd"] = 1
        changed = True
    return changed
