"""Winograd weights: a 3x3 stride-1 convolution that lowering will run as Winograd F(2x2, 3x3) (or F(4x4, 3x3))
gets its constant weights w [K, C, 3, 3] replaced by U = G w G^T [4, 4, K, C] ([6, 6, K, C]), so the planner stores
U instead of w. Device-dependent: Net runs it only where the lowering has a Winograd path (lowering.device_passes).
"""
import numpy as np

G = np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]])


def cook_toom(m, points):
    """(A^T, G, B^T) of Winograd F(m, 3) from m + 1 finite interpolation points and infinity (Lavin & Gray 2015):
    y = A^T [(G g) . (B^T d)] for a 3-tap filter g over m + 2 inputs d."""
    n = m + 2
    at, g, bt = np.zeros((m, n)), np.zeros((n, 3)), np.zeros((n, n))
    for j, p in enumerate(points):
        others = [q for q in points if q != p]
        at[:, j] = [p ** i for i in range(m)]
        g[j] = [p ** k / np.prod([p - q for q in others]) for k in range(3)]
        bt[j, :n - 1] = _from_roots(others)
    at[m - 1, n - 1] = g[n - 1, 2] = 1
    bt[n - 1] = _from_roots(points)
    return at, g, bt


def _from_roots(roots):
    """Coefficients, lowest power first, of prod (x - r) (numpy.polynomial's polyfromroots; importing that package
    took 0.04 s of a warm start)."""
    c = np.ones(1)
    for r in roots:
        c = np.concatenate([[0.0], c]) - r * np.concatenate([c, [0.0]])
    return c


# F(4x4, 3x3) on the points 0, 1, -1, 1/2, -2 (winograd.cl's wino_input4 / wino_output4 spell out A^T and B^T): with
# tf32 products its error per layer is 2.0e-3 against 3.1e-3 on Lavin & Gray's 0, +-1, +-2 (numpy model, 256
# random channels; F(2x2, 3x3) 4.9e-4, the direct product 2.9e-4)
AT4, G4, BT4 = cook_toom(4, (0, 1, -1, .5, -2))


def winograd_tiles(y_shape, m=2):
    """m x m output tiles of a convolution's output y: the N of its (m + 2)^2 Winograd products."""
    n, _, oh, ow = y_shape
    return n * -(-oh // m) * -(-ow // m)


def f4_pays(y_shape, ratio=0.8):
    """F(4x4, 3x3) does at most `ratio` of F(2x2, 3x3)'s multiplications on this output (ragged edges waste some)."""
    return 36 * winograd_tiles(y_shape, 4) <= ratio * 16 * winograd_tiles(y_shape, 2)


def _geometry(node, w_shape, min_channels, min_tiles, y_shape=None):
    """A 2-D 3x3 stride-1 undilated ungrouped convolution (or its dX, or its dW with y_shape dy's) wide and large
    enough for Winograd."""
    a = node.attrs
    y_shape = y_shape or node.outputs[0].shape
    return (min_channels > 0 and len(y_shape) == 4 and tuple(w_shape[2:]) == (3, 3)
            and list(a["strides"]) == [1, 1] and list(a["dilations"]) == [1, 1]
            and a["group"] == 1 and min(w_shape[0], w_shape[1]) >= min_channels
            and all(0 <= p <= 2 for p in a["pads"])
            and winograd_tiles(y_shape) >= min_tiles)


def winograd_eligible(node, min_channels, min_tiles=0):
    """Inference: constant weights, transformed here once."""
    if node.op != "Conv" or node.attrs.get("winograd"):
        return False
    w = node.inputs[1]
    return w.const is not None and not w.param and _geometry(node, w.shape, min_channels, min_tiles)


def winograd_on_device(graph, min_channels, min_tiles=0, weight_grads=True):
    """Training: convolutions whose weights change every step, and their input gradients (dX is a 3x3 stride-1
    convolution of dy with the filters flipped and transposed, pads 2 - p), run as Winograd with U made on the
    device each step (attr winograd=2); so do their weight gradients (weight_grads: dW = G^T [sum over tiles of
    (A dY A^T) . V] G)."""
    changed = False
    for node in graph.nodes:
        if node.attrs.get("winograd"):
            continue
        if node.op == "ConvGradW":
            ok = weight_grads and _geometry(node, node.attrs["w_shape"], min_channels, min_tiles,
                                            node.inputs[0].shape)
        else:
            ok = node.op in ("Conv", "ConvGradX") and \
                _geometry(node, node.inputs[1].shape, min_channels, min_tiles) and \
                (node.op == "ConvGradX" or node.inputs[1].const is None or node.inputs[1].param)
        if ok:
            node.attrs["winograd"] = 2
            changed = True
    return changed


def transform_weights(w, m=2):
    """U = G w G^T [m + 2, m + 2, K, C] of w [K, C, 3, 3], in float32. F(2x2, 3x3): G's rows are sums of three taps
    halved, each entry within an ulp or two of the float64 product, in a few passes over w, not an einsum's loop per
    entry; F(4x4, 3x3): in float64, then rounded."""
    if m == 4:
        return np.einsum("ai,kcij,bj->abkc", G4, np.asarray(w, np.float64), G4).astype(np.float32)

    def g(a):  # [3, ...] -> [4, ...]: G a
        s = a[0] + a[2]
        return np.stack([a[0], (s + a[1]) * np.float32(.5), (s - a[1]) * np.float32(.5), a[2]])
    t = g(np.asarray(w, np.float32).transpose(2, 3, 0, 1))          # [4 (G w), 3, K, C]
    return np.ascontiguousarray(g(t.transpose(1, 0, 2, 3)).transpose(1, 0, 2, 3))


def winograd_weights(graph, min_channels, min_tiles=0, m=2, f4_min_tiles=0):
    """m = 4: F(4x4, 3x3) where it pays (f4_pays) on at least f4_min_tiles 4x4 tiles, F(2x2, 3x3) elsewhere."""
    changed = False
    for node in graph.nodes:
        if not winograd_eligible(node, min_channels, min_tiles):
            continue
        y_shape = node.outputs[0].shape
        mn = 4 if m == 4 and f4_pays(y_shape) and winograd_tiles(y_shape, 4) >= f4_min_tiles else 2
        graph.set_input(node, 1, graph.constant(transform_weights(node.inputs[1].const, mn)))
        node.attrs["winograd"] = 1
        changed = True
    return changed
