"""Layout copies that need not run.

ConvNeXt computes its depthwise convolutions channels-first (NCHW) and its LayerNorms and Linear layers channels-last,
so every block permutes its activations there and back, and every LayerNorm2d (stem, downsampling, head) permutes
around a LayerNorm: 80 Transpose copies in convnext_small. Here:

- `layernorm_layouts`: Transpose -> LayerNorm over the axis the Transpose moved last is one LayerNormAxis that reads
  x through strides (normalising x's axis) and writes the Transpose's layout; a Transpose after it that puts the axis
  back cancels into it (LayerNorm2d: one LayerNormAxis over NCHW's channels, no copy).
- `transposes_into_pointwise`: a Transpose whose only reader is a pointwise node or a Fused chain becomes that chain's
  first member: the generated kernel reads its input through the permuted strides (the block's way back to NCHW,
  read by its layer scale and residual Add).

Both leave the products (Linear layers) as they are: on [N*H*W, C] rows, the GEMM cores' best layout.

- `rows_in_input_order`: a Transpose that swaps leading axes and keeps the last (nn.MultiheadAttention's batch-first
  module runs sequence-first: [B, T, C] -> [T, B, C] before its projections, and back after them: 24 copies in
  ViT-B/16) feeds work done row by row (products on rows, views, pointwise nodes, attention through its layout) up
  to the Transposes that put the axes back: that work is done on the rows in the input's order instead, and both
  copies go.

- `transposes_into_products` (training graphs): a Gemm reading a 2-D Transpose (a Linear layer's weight as exporters
  write it, MatMul(x, Transpose(W))) reads the Transpose's input with transA / transB flipped: no copy of the weight
  each step, nor of its gradient back (the gradient of the Gemm is W's own layout).
- `transposes_into_product_views` (training graphs): a Transpose read by products alone (attention's gradient
  takes q, k, v and dy to [b, h, t, d]) is a TransposeView they read in place through its strides.
- `slice_grads_into_concat` (training graphs): the gradient of a Split (q, k and v of a packed projection) summed
  from its pieces' SliceGrads, each a zero-filled copy of the whole input, is one Concat of the pieces' gradients.
"""
import numpy as np

from ..ir import Node
from ..ops.normalization import channels_last


def _moved_last(perm):
    """The axis a Transpose of `perm` moves last keeping the others in order, or None."""
    perm = tuple(perm)
    return perm[-1] if perm and perm == channels_last(len(perm), perm[-1]) else None


def _moves_nothing(x, perm):
    """A Transpose that keeps the order of the axes longer than 1 is a view (layout.transposes_as_views)."""
    return [a for a in perm if x.shape[a] != 1] == [a for a in range(x.rank) if x.shape[a] != 1]


def _only_user(graph, v):
    users = [u for u in v.users if u in graph.nodes]
    return users[0] if len(users) == 1 and v not in graph.outputs else None


def layernorm_layouts(graph):
    """Transpose(x, perm) -> LayerNorm (last axis) -> [Transpose back] as one LayerNormAxis over x's axis."""
    changed = False
    for node in list(graph.nodes):
        if node.op != "Transpose" or node not in graph.nodes or node.inputs[0].const is not None:
            continue
        x, t = node.inputs[0], node.outputs[0]
        axis = _moved_last(node.attrs["perm"])
        ln = _only_user(graph, t)
        if axis is None or axis == x.rank - 1 or ln is None or ln.op != "LayerNorm" or ln.inputs[0] is not t:
            continue
        if all(d == 1 for d in x.shape[axis + 1:]):  # (a view: layout.transposes_as_views, the row kernels)
            continue
        y, perm = ln.outputs[0], channels_last(x.rank, axis)
        back = _only_user(graph, y)
        if back is not None and back.op == "Transpose" and \
                tuple(perm[p] for p in back.attrs["perm"]) == tuple(range(x.rank)):
            graph.remove_node(back)
            y, perm = back.outputs[0], ()
        at = graph.nodes.index(ln)
        graph.remove_node(ln)
        graph.remove_node(node)
        y.producer = None
        graph.add_node(Node("LayerNormAxis", [x] + ln.inputs[1:], [y],
                            {"epsilon": ln.attrs["epsilon"], "axis": axis, "perm": perm}, ln.name), at - 1)
        changed = True
    return changed


def transposes_into_pointwise(graph):
    """Transpose -> its only reader, pointwise or Fused: a Fused chain whose first member is the Transpose (the
    chain's kernel reads the Transpose's input through permuted strides; elementwise.py)."""
    changed = False
    for node in list(graph.nodes):
        if node.op != "Transpose" or node not in graph.nodes or node.inputs[0].const is not None:
            continue
        x, t = node.inputs[0], node.outputs[0]
        user = _only_user(graph, t)
        if _moves_nothing(x, node.attrs["perm"]) or user is None or len(user.outputs) != 1 or \
                (user.op != "Fused" and user.spec.kind != "pointwise"):
            continue
        members = user.attrs["nodes"] if user.op == "Fused" else [user]
        inputs = []  # (x also read as it is stays one operand: the kernel reads it both ways, elementwise.py)
        for v in [v for v in user.inputs if v is not t] + [x]:
            if v is not None and v not in inputs:
                inputs.append(v)
        at = graph.nodes.index(user)
        graph.remove_node(user)
        graph.remove_node(node)
        out = user.outputs[0]
        out.producer = None
        graph.add_node(Node("Fused", inputs, [out], {"nodes": [node] + members}, user.name), at - 1)
        changed = True
    return changed


def _row_form(v, lead, rows):
    """("split", tail) where v is [*lead, *tail], ("rows", tail) where it is [rows, *tail], else None; the tail is
    never empty (a product's K, a row's elements)."""
    n = len(lead)
    if v.rank > n and v.shape[:n] == tuple(lead):
        return "split", v.shape[n:]
    if v.rank > 1 and v.shape[0] == rows:
        return "rows", v.shape[1:]
    return None


def _row_region(graph, t, lead, inv):
    """The nodes that read rows of `t` (a [*lead, C] Transpose output) and the row forms of the values they make
    ({value id: (value, _row_form)}), up to Transposes of perm inv + (last,) (back to the input's order): (nodes,
    forms, those Transposes), or None where some reader works across rows or a value leaves the region otherwise."""
    rows = int(np.prod(lead))
    forms, nodes, backs, todo = {}, [], [], [t]
    while todo:  # (the closure first: a node's other operands may join the region later)
        v = todo.pop()
        form = _row_form(v, lead, rows)
        if v in graph.outputs or form is None:
            return None
        forms[v.id] = (v, form)
        for u in [u for u in v.users if u in graph.nodes and u not in nodes and u not in backs]:
            if u.op == "Transpose":
                if tuple(u.attrs["perm"]) != inv + (len(lead),) or v.rank != len(lead) + 1:
                    return None
                backs.append(u)
                continue
            nodes.append(u)
            todo += u.outputs
    for u in nodes:
        ins = [i for i, x in enumerate(u.inputs) if x is not None and x.id in forms]
        y = u.outputs[0]
        tail = len(forms[y.id][1][1])
        if u.op in ("Reshape", "ColumnView"):
            ok = True
        elif u.spec.kind == "pointwise":  # (the others broadcast along the rows)
            ok = all(u.inputs[i].shape == y.shape for i in ins) and all(
                all(d == 1 for d in x.shape[:max(x.rank - tail, 0)])
                for i, x in enumerate(u.inputs) if x is not None and i not in ins)
        elif u.op == "Gemm":  # (A's rows by a matrix; a bias, or a C of the same rows)
            c = u.inputs[2] if len(u.inputs) > 2 else None
            ok = ins[0] == 0 and 1 not in ins and not u.attrs.get("transA") and u.inputs[1].rank == 2 and \
                (c.shape == y.shape if 2 in ins else c is None or all(d == 1 for d in c.shape[:-1]))
        elif u.op == "Attention":  # (q's rows, k's and v's where they are rows too: each through its layout)
            ok = 0 in ins and 3 not in ins and len(u.outputs) == 1 and all(
                forms[x.id][1][0] == "split" and x.rank == 4 for x in u.inputs[:3] + [y] if x.id in forms)
        else:
            ok = False
        if not ok:
            return None
    return nodes, forms, backs


def rows_in_input_order(graph):
    """Transpose(x, perm) keeping the last axis -> row-wise work -> Transpose back: the work on x's rows (module
    docstring); the shapes and views between take x's order, Attention's layouts the swapped axes."""
    changed = False
    for node in list(graph.nodes):
        if node.op != "Transpose" or node not in graph.nodes or node.inputs[0].const is not None:
            continue
        x, t, perm = node.inputs[0], node.outputs[0], tuple(node.attrs["perm"])
        if x.rank < 3 or perm[-1] != x.rank - 1 or _moves_nothing(x, perm):
            continue
        lead, inv = t.shape[:-1], tuple(int(i) for i in np.argsort(perm[:-1]))
        region = _row_region(graph, t, lead, inv)
        if region is None or not region[2]:
            continue
        nodes, forms, backs = region
        n = len(lead)
        split = {vid for vid, (_, (kind, _)) in forms.items() if kind == "split"}
        for vid in split:  # [*lead, *tail] -> [*x's lead, *tail]; rows stay rows (now in x's order)
            v = forms[vid][0]
            v.shape = x.shape[:-1] + v.shape[n:]
        for u in nodes:
            if u.op in ("Reshape", "ColumnView"):
                u.attrs["shape"] = u.outputs[0].shape
            if u.op == "Attention":  # (stored axis j holds what axis inv[j] held)
                u.attrs["layout"] = tuple("".join(lay[inv[j]] for j in range(n)) + lay[n:] if v.id in split else lay
                                          for lay, v in zip(u.attrs["layout"], u.inputs[:3] + u.outputs[:1]))
        graph.replace_all_uses(t, x)
        graph.remove_node(node)
        for back in backs:
            graph.replace_all_uses(back.outputs[0], back.inputs[0])
            graph.remove_node(back)
        changed = True
    return changed


def transposes_into_products(graph):
    """Gemm(.., Transpose(w, perm=(1, 0)), ..) -> Gemm reading w with its trans flag flipped (either operand of 2-D
    w); the Transpose goes where nothing else reads it."""
    changed = False
    for node in list(graph.nodes):
        if node.op != "Gemm":
            continue
        for i, flag in ((0, "transA"), (1, "transB")):
            t = node.inputs[i]
            tr = t.producer
            if tr is None or tr.op != "Transpose" or tr not in graph.nodes or t.rank != 2 or \
                    tuple(tr.attrs["perm"]) != (1, 0) or t in graph.outputs or (i == 0 and node.outputs[0].rank != 2):
                continue
            graph.set_input(node, i, tr.inputs[0])
            node.attrs[flag] = 1 - node.attrs.get(flag, 0)
            if not [u for u in t.users if u in graph.nodes]:
                graph.remove_node(tr)
            changed = True
    return changed


def _add_tree(graph, node):
    """(leaves, Add nodes) of the tree of Adds rooted at `node` whose inner sums have no other reader."""
    leaves, adds = [], [node]
    for v in node.inputs:
        p = v.producer
        if p is not None and p.op == "Add" and p in graph.nodes and _only_user(graph, v) is node:
            more, inner = _add_tree(graph, p)
            leaves += more
            adds += inner
        else:
            leaves.append(v)
    return leaves, adds


def _slice_axis(sg):
    """The one axis a unit-step SliceGrad's slice does not cover whole, and its start, or None."""
    a = sg.attrs
    part = [d for d, (s, c, n) in enumerate(zip(a["starts"], a["counts"], a["in_shape"])) if s != 0 or c != n]
    if len(part) != 1 or any(st != 1 for st in a["steps"]):
        return None
    return part[0], a["starts"][part[0]]


def slice_grads_into_concat(graph):
    """Add(SliceGrad(d0), SliceGrad(d1), ...) whose unit-step slices tile one axis of the input, each read by the sum
    alone -> Concat(d0, d1, ...) along that axis."""
    changed = False
    for node in list(graph.nodes):
        if node.op != "Add" or node not in graph.nodes:
            continue
        user = _only_user(graph, node.outputs[0])
        if user is not None and user.op == "Add":  # (an inner sum: its root takes the tree)
            continue
        leaves, adds = _add_tree(graph, node)
        sgs = [v.producer for v in leaves]
        if any(p is None or p.op != "SliceGrad" or p not in graph.nodes or _only_user(graph, v) is None
               for p, v in zip(sgs, leaves)):
            continue
        cuts = [_slice_axis(p) for p in sgs]
        if None in cuts or len({axis for axis, _ in cuts}) != 1:
            continue
        axis = cuts[0][0]
        order = sorted(range(len(sgs)), key=lambda i: cuts[i][1])
        ends = [cuts[i][1] + sgs[i].attrs["counts"][axis] for i in order]
        if [cuts[i][1] for i in order] != [0] + ends[:-1] or ends[-1] != node.outputs[0].shape[axis]:
            continue
        at = graph.nodes.index(node)
        for n in adds + sgs:
            graph.remove_node(n)
        out = node.outputs[0]
        out.producer = None
        graph.add_node(Node("Concat", [sgs[i].inputs[0] for i in order], [out], {"axis": axis}, node.name),
                       at - len(adds) - len(sgs) + 1)
        changed = True
    return changed


def transposes_into_product_views(graph):
    """Transpose -> TransposeView where every reader is a Gemm reading it as A or B and the input's last axis stays
    one of the last two (so that the product's rows or columns are contiguous: the tensor cores' layouts)."""
    changed = False
    for node in list(graph.nodes):
        if node.op != "Transpose" or node.inputs[0].const is not None:
            continue
        t, perm = node.outputs[0], tuple(node.attrs["perm"])
        users = [u for u in t.users if u in graph.nodes]
        if t in graph.outputs or not users or t.rank < 2 or t.rank - 1 not in perm[-2:] or \
                any(u.op != "Gemm" or t not in u.inputs[:2] or t in u.inputs[2:] for u in users):
            continue
        at = graph.nodes.index(node)
        graph.remove_node(node)
        t.producer = None
        graph.add_node(Node("TransposeView", [node.inputs[0]], [t], {"perm": perm}, node.name), at)
        changed = True
    return changed
