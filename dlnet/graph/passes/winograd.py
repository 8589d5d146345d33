"""Winograd weights: a 3x3 stride-1 convolution that lowering will run as Winograd F(2x2, 3x3) gets its constant
weights w [K, C, 3, 3] replaced by U = G w G^T [4, 4, K, C], so the planner stores U instead of w. Device-dependent:
Net runs it only where the lowering has a Winograd path (lowering.device_passes)."""
import numpy as np

G = np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]])


def winograd_tiles(node):
    """2x2 output tiles of a convolution: the N of its 16 Winograd products."""
    n, _, oh, ow = node.outputs[0].shape
    return n * -(-oh // 2) * -(-ow // 2)


def winograd_eligible(node, min_channels, min_tiles=0):
    if node.op != "Conv" or node.attrs.get("winograd") or len(node.inputs[0].shape) != 4:
        return False
    w = node.inputs[1]
    a = node.attrs
    return (min_channels > 0 and w.const is not None and not w.param and w.shape[2:] == (3, 3)
            and list(a.get("strides") or [1, 1]) == [1, 1] and list(a.get("dilations") or [1, 1]) == [1, 1]
            and a.get("group", 1) == 1 and min(w.shape[0], w.shape[1]) >= min_channels
            and winograd_tiles(node) >= min_tiles)


def transform_weights(w):
    """U = G w G^T [4, 4, K, C] of w [K, C, 3, 3], in float32 (G's rows are sums of three taps halved: each entry is
    within an ulp or two of the float64 product) and in a few passes over w, not an einsum's loop per entry."""
    def g(a):  # [3, ...] -> [4, ...]: G a
        s = a[0] + a[2]
        return np.stack([a[0], (s + a[1]) * np.float32(.5), (s - a[1]) * np.float32(.5), a[2]])
    t = g(np.asarray(w, np.float32).transpose(2, 3, 0, 1))          # [4 (G w), 3, K, C]
    return np.ascontiguousarray(g(t.transpose(1, 0, 2, 3)).transpose(1, 0, 2, 3))


def winograd_weights(graph, min_channels, min_tiles=0):
    changed = False
    for node in graph.nodes:
        if not winograd_eligible(node, min_channels, min_tiles):
            continue
        graph.set_input(node, 1, graph.constant(transform_weights(node.inputs[1].const)))
        node.attrs["winograd"] = 1
        changed = True
    return changed
