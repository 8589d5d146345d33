"""Fusion: Conv/Gemm epilogues (bias, residual Add, activation) and chains of elementwise ops."""
import numpy as np

from ..ir import Node

# unary pointwise ops a Conv/Gemm epilogue can apply (ACT(v) in the kernels)
EPILOGUE_ACTS = {"Relu", "LeakyRelu", "Clip", "Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Elu", "Selu",
                 "Softplus", "Celu", "Gelu", "GeluTanh"}


def _single_user(graph, v):
    return len(v.users) == 1 and v not in graph.outputs


def _absorb(graph, node, nxt):
    """`nxt` (the only reader of node's output) is done by `node` now: node writes nxt's output."""
    out = nxt.outputs[0]
    at = graph.nodes.index(nxt)
    graph.remove_node(nxt)
    graph.nodes.remove(node)  # node now runs where nxt ran: every input nxt read is defined by then
    graph.nodes.insert(at - 1, node)
    node.outputs[0].producer = None
    node.outputs = [out]
    out.producer = node


def _per_channel(v, y, y_shape=None):
    """A constant of shape [C,1,1] / [1,C,1,1] broadcasting along y's channel axis (or along axis 1 of y_shape)."""
    y_shape = tuple(y_shape if y_shape is not None else y.shape)
    if v.const is None or v.param or v.rank > len(y_shape):
        return False
    shape = (1,) * (len(y_shape) - v.rank) + tuple(v.shape)
    return shape[1] == y_shape[1] and all(d == 1 for i, d in enumerate(shape) if i != 1)


def _gemm_add(graph, node, add):
    """A Gemm without C absorbs the Add after it (MatMul + bias, as exporters write nn.Linear on more than 2 axes, or
    a residual Add) as its C: a constant broadcasting along the rows, or a value of the product's shape."""
    y = node.outputs[0]
    other = add.inputs[1] if add.inputs[0] is y else add.inputs[0]
    if len(node.inputs) != 2 or add.inputs.count(y) != 1 or other.dtype != y.dtype or add.outputs[0].shape != y.shape:
        return False
    row = other.const is not None and not other.param and other.rank <= y.rank and other.rank and \
        other.shape[-1] == y.shape[-1] and all(d == 1 for d in other.shape[:-1])
    if row:
        c = graph.constant(other.const.reshape(-1))
    elif other.shape == y.shape and other.const is None:
        c = other
    else:
        return False
    node.inputs.append(c)
    c.users.append(node)
    node.attrs["beta"] = 1.0
    _absorb(graph, node, add)
    return True


def fuse_epilogues(graph):
    changed = False
    for node in list(graph.nodes):
        if node.op not in ("Conv", "Gemm") or node not in graph.nodes:
            continue
        while True:
            y = node.outputs[0]
            if not _single_user(graph, y):
                break
            nxt = y.users[0]
            if node.attrs.get("act"):
                break
            if nxt.op == "Add" and node.op == "Conv":
                other = nxt.inputs[1] if nxt.inputs[0] is y else nxt.inputs[0]
                if len(node.inputs) == 2 and _per_channel(other, y):
                    node.inputs.append(graph.constant(other.const.reshape(-1).astype(y.dtype)))
                    node.inputs[-1].users.append(node)
                    _absorb(graph, node, nxt)
                    changed = True
                    continue
                if len(node.inputs) <= 3 and other.shape == y.shape and other.dtype == y.dtype and \
                        other.const is None and nxt.inputs.count(y) == 1:
                    if len(node.inputs) == 2:
                        node.inputs.append(graph.constant(np.zeros(y.shape[1], y.dtype)))
                        node.inputs[-1].users.append(node)
                    node.inputs.append(other)
                    other.users.append(node)
                    other.users.remove(nxt)
                    _absorb(graph, node, nxt)
                    changed = True
                    continue
                break
            if nxt.op == "Add" and node.op == "Gemm":
                if _gemm_add(graph, node, nxt):
                    changed = True
                    continue
                break
            if nxt.op in EPILOGUE_ACTS and nxt.outputs[0].shape == y.shape:
                node.attrs["act"] = (nxt.op, tuple(sorted(nxt.attrs.items())))
                _absorb(graph, node, nxt)
                changed = True
                continue
            break
    return changed


# nodes one generated kernel may fuse: real chains have a handful; a kernel of thousands of statements (a hostile
# model's) takes minutes to compile, and growing a group is quadratic in its size
MAX_FUSED = 64


def fuse_pointwise(graph):
    """Merge each pointwise node into its pointwise readers once every one of them is in the same group (a gradient
    rule's DAG, its intermediates read twice, is one kernel), as long as shapes broadcast to the group's output.
    Each Fused node takes its last member's place; the node list is rebuilt once (linear in the graph's size)."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    gone, fused_at = set(), {}
    for node in reversed(list(graph.nodes)):  # readers first, so each group grows from its last node
        if node.spec.kind != "pointwise" or node in gone:
            continue
        members, inside = [node], {node}
        # pull in producers: pointwise, their result read only inside the group
        grew = True
        while grew and len(members) < MAX_FUSED:
            grew = False
            for v in list(_inputs_of(members)):
                p = v.producer
                if p is None or p.spec.kind != "pointwise" or p not in order or p in gone or p in inside or \
                        len(members) >= MAX_FUSED or v in graph.outputs or not all(u in inside for u in v.users):
                    continue
                if len(v.shape) > len(node.outputs[0].shape) or any(
                        a != b and a != 1 for a, b in zip(v.shape[::-1], node.outputs[0].shape[::-1])):
                    continue
                members.insert(0, p)
                inside.add(p)
                grew = True
        if len(members) == 1:
            continue
        members.sort(key=order.__getitem__)  # topological order
        ext = list(_inputs_of(members))
        out = node.outputs[0]
        fused = Node("Fused", ext, [], {"nodes": members}, node.name)
        for m in members:  # (Graph.remove_node, but the node list is rebuilt once, below)
            for v in m.inputs:
                if v is not None and m in v.users:
                    v.users.remove(m)
        gone |= inside
        for v in ext:
            v.users.append(fused)
        out.producer = None
        fused.outputs = [out]
        out.producer = fused
        fused_at[node] = fused
    if fused_at:
        graph.nodes = [fused_at.get(n, n) for n in graph.nodes if n not in gone or n in fused_at]
    return bool(fused_at)


def _inputs_of(members):
    inside = {n.outputs[0].id for n in members}
    seen = []
    for n in members:
        for v in n.inputs:
            if v is not None and v.id not in inside and v not in seen:
                seen.append(v)
    return seen


def broadcast_expands(graph):
    """Drop an Expand whose readers are all pointwise and broadcast its input to the same output shape anyway: the
    readers read the small input (autodiff's ReduceMean/ReduceSum gradients, BatchNormalization's backward), so
    the full-size copy and its memory traffic go, and fuse_pointwise can pull the input's producer in."""
    changed = False
    for node in list(graph.nodes):
        if node.op != "Expand" or node.outputs[0] in graph.outputs:
            continue
        x, y = node.inputs[0], node.outputs[0]
        readers = set(y.users)
        if not readers or any(r.spec.kind != "pointwise" for r in readers):
            continue
        if any(_broadcast([x.shape if v is y else v.shape for v in r.inputs if v is not None]) != r.outputs[0].shape
               for r in readers):
            continue
        graph.replace_all_uses(y, x)
        graph.remove_node(node)
        changed = True
    return changed


def _broadcast(shapes):
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        return None


def fuse_reduce_prologues(graph):
    """Fold a pointwise node (or Fused chain) that only a Reduce reads into the Reduce: each element is computed as
    it is reduced (BatchNormalization's squared deviations, the products its backward sums), so the full-size
    value is never stored and its kernel never launched."""
    changed = False
    for node in list(graph.nodes):
        if node.op != "Reduce" or "prologue" in node.attrs:
            continue
        x = node.inputs[0]
        p = x.producer
        if p is None or (p.op != "Fused" and p.spec.kind != "pointwise") or not _single_user(graph, x):
            continue
        if p not in graph.nodes or len(p.outputs) != 1:
            continue
        members = p.attrs["nodes"] if p.op == "Fused" else [p]
        inputs = []
        for v in p.inputs:
            if v is not None and v not in inputs:
                inputs.append(v)
        if any(len(v.shape) > len(x.shape) for v in inputs):
            continue
        graph.remove_node(p)
        x.users.remove(node)
        node.inputs = inputs
        for v in inputs:
            v.users.append(node)
        node.attrs = dict(node.attrs, prologue=members)
        changed = True
    return changed


def affine_chain(members, shape):
    """(x, scale, shift, relu) where the pointwise nodes `members` compute relu?(x * scale[c] + shift[c]) of one
    value x of `shape` (per-channel constants along axis 1, Relu only last; float64), else None."""
    x = prev = None
    channels = shape[1]
    scale, shift, relu = np.ones(channels), np.zeros(channels), False
    for m in members:
        if relu:
            return None
        if m.op == "Relu":
            relu, v = True, m.inputs[0]
        elif m.op in ("Mul", "Add") and len(m.inputs) == 2:
            v, c = m.inputs if m.inputs[1].const is not None else m.inputs[::-1]
            if c.const is None or c.param or v.const is not None:
                return None
            if not _per_channel(c, None, shape):
                return None
            k = np.asarray(c.const, np.float64).reshape(-1)
            scale, shift = (scale * k, shift * k) if m.op == "Mul" else (scale, shift + k)
        else:
            return None
        if prev is None:
            x = v
        elif v is not prev:
            return None
        prev = m.outputs[0]
    return (x, scale, shift, relu) if x is not None and tuple(x.shape) == tuple(shape) else None


def fuse_conv_prologues(graph, max_channels):
    """CPU devices: a 1x1 stride-1 unpadded Conv whose input only a per-channel affine + Relu chain produces
    (densenet's BatchNorm + Relu before each 1x1 layer: 62 kernels of their own) takes that chain as its prologue
    (attr prologue: the member nodes), applied as conv_cpu.cl packs each panel; up to max_channels input channels."""
    changed = False
    for node in list(graph.nodes):
        a = node.attrs
        if node.op != "Conv" or "prologue" in a or node.inputs[0].rank != 4 or \
                tuple(node.inputs[1].shape[2:]) != (1, 1) or any(s != 1 for s in a["strides"]) or \
                any(a["pads"]) or a.get("tap_major") or a.get("winograd") or \
                node.inputs[0].shape[1] > max_channels:
            continue
        x = node.inputs[0]
        p = x.producer
        if p is None or p not in graph.nodes or len(p.outputs) != 1 or not _single_user(graph, x) or \
                p.op != "Fused" and p.spec.kind != "pointwise":
            continue
        members = p.attrs["nodes"] if p.op == "Fused" else [p]
        chain = affine_chain(members, x.shape)
        if chain is None:
            continue
        graph.remove_node(p)
        x.users.remove(node)
        node.inputs = [chain[0]] + node.inputs[1:]
        chain[0].users.append(node)
        node.attrs = dict(a, prologue=members)
        changed = True
    return changed


class ChannelMap(tuple):
    """A Conv's in_perm (fold_channel_shuffles): input channel c is channel map[c] of the Conv's input value."""

    def ir_str(self):
        return f"{len(self)} channels"


def fold_channel_shuffles(graph):
    """CPU devices: a channel shuffle (Reshape -> Transpose -> Reshape that only reorders channels: shufflenet's,
    before each depthwise layer) read only by a Conv that copies its input into padded planes anyway (depthwise, or
    more than one tap) becomes that copy's channel map (attr in_perm): no launch of its own."""
    changed = False
    for node in list(graph.nodes):
        w = node.inputs[1] if node.op == "Conv" and len(node.inputs) > 1 else None
        if w is None or node.inputs[0].rank != 4 or node.attrs.get("in_perm") is not None or \
                node.attrs.get("tap_major") or node.attrs.get("winograd") or node.attrs.get("prologue"):
            continue
        x = node.inputs[0]
        depthwise = node.attrs["group"] == x.shape[1] > 1 and w.shape[1] == 1
        if not depthwise and int(np.prod(w.shape[2:])) == 1:
            continue
        chain, v = [], x
        while v.producer is not None and v.producer in graph.nodes and _single_user(graph, v) and \
                (v.producer.op == "Transpose" or v.producer.spec.kind == "alias") and len(chain) < 8:
            chain.insert(0, v.producer)
            v = v.producer.inputs[0]
        if not any(n.op == "Transpose" for n in chain) or tuple(v.shape) != tuple(x.shape) or v.const is not None:
            continue
        idx = np.arange(v.size, dtype=np.int64).reshape(v.shape)
        for n in chain:
            idx = n.spec.numpy(n, idx)[0]
        n_, c, h, w_ = x.shape
        perm = idx[0, :, 0, 0] // (h * w_)
        want = (np.arange(n_).reshape(-1, 1, 1, 1) * c + perm.reshape(1, -1, 1, 1)) * h * w_ + \
            np.arange(h * w_).reshape(1, 1, h, w_)
        if not np.array_equal(idx, want):
            continue
        for n in reversed(chain):
            graph.remove_node(n)
        node.inputs = [v] + node.inputs[1:]
        v.users.append(node)
        node.attrs = dict(node.attrs, in_perm=ChannelMap(int(i) for i in perm))
        changed = True
    return changed
