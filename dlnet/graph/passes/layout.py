"""Weight layout: constant Gemm weights used transposed are stored transposed once, so every kernel reads B
contiguous along the output columns (vector loads on CPUs, coalesced loads on GPUs) -- except in products of at
most `keep_rows` rows, which a GPU runs as gemv.cl: that reads B best as it comes, contiguous along k.

Constant convolution weights of KH x KW > 1 taps and a multiple of `multiple` channels go tap-major, [K, KH, KW, C]:
the GPU cores' depth (c, ky, kx) becomes (ky, kx, c), so a slice of depth is channels of one tap, whose window
position and padding test hold for the whole slice (gemm_fetch.cl's BC_STEP).

A product of a batch of row blocks by one matrix, [..., M, K] x [K, N] (every nn.Linear on a sequence or a
channels-last image), is one product of prod(...) * M rows: the batch of small products it was (M = 197 tokens, or
14 pixels of a row) wasted most of each tile."""
import numpy as np

from ..ir import Node


def pretranspose_weights(graph, keep_rows=0, along_k=None):
    """Constant B of a Gemm stored as its kernel reads it best: [K, N] (transB=0) for the GEMM cores; [N, K]
    (transB=1) for products of at most keep_rows rows of a 2-D output (gemv.cl streams B along k), and for those
    where along_k(M, N, K) says so (the device's ldmatrix core reads B's rows along k)."""
    changed = False
    for node in graph.nodes:
        if node.op != "Gemm":
            continue
        w, y = node.inputs[1], node.outputs[0]
        if w.const is None or w.param or w.rank != 2:
            continue
        nk = y.rank == 2 and y.shape[0] <= keep_rows
        if along_k is not None and y.rank == 2 and not node.attrs.get("transA", 0):
            nk = nk or along_k(y.shape[0], y.shape[1], w.shape[1] if node.attrs["transB"] else w.shape[0])
        if bool(node.attrs["transB"]) == nk:
            continue
        graph.set_input(node, 1, graph.constant(np.ascontiguousarray(w.const.T)))
        node.attrs["transB"] = int(nk)
        changed = True
    return changed


def tf32(array):
    """float32 `array` rounded to the nearest tf32 value (10 mantissa bits; ties away from zero): mma_tf32.cl's
    TF32_BITS, then the tensor cores' truncation."""
    bits = np.ascontiguousarray(array, np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def tf32_exact(array):
    """Is every element of float32 `array` a tf32 value already?"""
    return array.dtype == np.float32 and not (np.ascontiguousarray(array).view(np.uint32) & np.uint32(0x1FFF)).any()


def tf32_weights(graph, rounds):
    """Constant B [N, K] of the Gemms where rounds(M, N, K) holds (products whose kernel reads floats as tf32 and would
    drop their low bits: gemm_wgmma.cl) stored rounded to the nearest tf32, once, so that the kernel rounds A alone."""
    changed = False
    for node in graph.nodes:
        w, y = node.inputs[1] if node.op == "Gemm" else None, node.outputs[0]
        if w is None or w.const is None or w.param or w.rank != 2 or w.dtype != "float32" or y.rank != 2 or \
                not node.attrs["transB"] or node.attrs.get("transA", 0) or not rounds(*y.shape, w.shape[1]):
            continue
        if not tf32_exact(w.const):
            graph.set_input(node, 1, graph.constant(tf32(w.const)))
            changed = True
    return changed


def transposes_as_views(graph):
    """A Transpose that keeps the order of the axes longer than 1 ([1, T, H, D] -> [1, H, T, D] at T = 1: a decode
    step's heads) moves no element: a Reshape (a view) instead."""
    changed = False
    for i, node in enumerate(graph.nodes):
        if node.op != "Transpose":
            continue
        x, y = node.inputs[0], node.outputs[0]
        perm = node.attrs["perm"] or tuple(reversed(range(x.rank)))
        if [a for a in perm if x.shape[a] != 1] != [a for a in range(x.rank) if x.shape[a] != 1]:
            continue
        graph.remove_node(node)
        y.producer = None
        graph.add_node(Node("Reshape", [x], [y], {"shape": y.shape}, node.name), i)
        changed = True
    return changed


def tap_major_weights(graph, multiple):
    changed = False
    for node in graph.nodes:
        if node.op != "Conv" or node.attrs.get("winograd") or node.attrs.get("tap_major"):
            continue
        w = node.inputs[1]
        if w.const is None or w.param or w.rank != 4 or w.shape[2] * w.shape[3] == 1 or w.shape[1] % multiple or \
                node.attrs["group"] != 1:
            continue
        graph.set_input(node, 1, graph.constant(np.ascontiguousarray(w.const.transpose(0, 2, 3, 1))))
        node.attrs["tap_major"] = 1
        changed = True
    return changed


def gemm_rows(node):
    """(rows, C's row stride, C's column stride) of a Gemm whose output's leading axes flatten into one matrix of
    rows: A not transposed, C (if any) broadcast alike along all those rows or laid out along them as y is; None
    where they do not."""
    y = node.outputs[0]
    c = node.inputs[2] if len(node.inputs) > 2 else None
    if y.rank > 2 and node.attrs.get("transA", 0):
        return None
    rows = int(np.prod(y.shape[:-1], dtype=np.int64))
    if c is None:
        return rows, 0, 0
    shape = (1,) * (y.rank - c.rank) + tuple(c.shape)  # C's element strides as it is read at y's indices
    cs = [0 if d == 1 and o != 1 else int(np.prod(shape[i + 1:], dtype=np.int64))
          for i, (d, o) in enumerate(zip(shape, y.shape))]
    # each row axis of C steps by the rows inside it (0 where C repeats along them); axes of one row do not count
    # (ViT at batch 1: y [197, 1, 2304], C [2304]; C's stride along the 1 is no step)
    axes = [(o, s) for o, s in zip(y.shape[:-1], cs[:-1]) if o != 1]
    if any(s != s_in * o_in for (_, s), (o_in, s_in) in zip(axes, axes[1:])):
        return None
    return rows, axes[-1][1] if axes else 0, cs[-1]


def slice_view_offset(node):
    """The element offset in its input at which a Slice's or Gather's output lies whole and contiguous (every axis
    before the one it cuts of size 1, every axis after it whole, steps of 1), or None."""
    x = node.inputs[0]
    if node.op == "Gather":
        idx, axis = node.inputs[1], node.attrs["axis"] % x.rank
        if idx.const is None or idx.size != 1:
            return None
        starts = [0] * x.rank
        starts[axis] = int(idx.const.reshape(-1)[0]) % x.shape[axis]
        counts, steps = [1 if d == axis else x.shape[d] for d in range(x.rank)], [1] * x.rank
    else:
        starts, counts, steps = node.attrs["starts"], node.attrs["counts"], node.attrs["steps"]
    cut = [d for d in range(x.rank) if counts[d] != x.shape[d]]
    if any(st != 1 for c, st in zip(counts, steps) if c > 1) or len(cut) > 1 or \
            (cut and any(x.shape[d] != 1 for d in range(cut[0]))):
        return None
    return int(starts[cut[0]]) * int(np.prod(x.shape[cut[0] + 1:], dtype=np.int64)) if cut else 0


def slices_as_views(graph, align=256):
    """A Slice or Gather of an activation whose result is one contiguous range of its input (ViT's q, k, v taken from
    the packed projection by index) moves no element: a SliceView at that offset instead, where the offset keeps
    the arena's alignment (`align` bytes) that kernels' vector loads rely on. Inference only (views of weights being
    trained are not views: their updates would need a scatter)."""
    changed = False
    for i, node in enumerate(graph.nodes):
        if node.op not in ("Slice", "Gather") or node.inputs[0].const is not None or node.inputs[0].param:
            continue
        offset = slice_view_offset(node)
        if offset is None or offset * np.dtype(node.inputs[0].dtype).itemsize % align:
            continue
        x, y = node.inputs[0], node.outputs[0]
        graph.remove_node(node)
        y.producer = None
        graph.add_node(Node("SliceView", [x], [y], {"offset": offset, "shape": y.shape}, node.name), i)
        changed = True
    return changed


def flatten_gemm_rows(graph):
    """Gemm [..., M, K] x [K, N] (C flattening alike: gemm_rows) -> Reshape to [R, K], one Gemm of R = prod(...) * M
    rows, Reshape back. Reshapes of contiguous values are views: nothing is copied."""
    changed = False
    for node in list(graph.nodes):
        if node.op != "Gemm":
            continue
        a, b, y = node.inputs[0], node.inputs[1], node.outputs[0]
        c = node.inputs[2] if len(node.inputs) > 2 else None
        flat = gemm_rows(node) if y.rank > 2 and b.rank == 2 and a.shape[:-1] == y.shape[:-1] else None
        if flat is None:
            continue
        rows, scm, scn = flat
        at = graph.nodes.index(node)
        graph.remove_node(node)
        flat_a = graph.new_value(a.dtype, (rows, a.shape[-1]))
        new = [Node("Reshape", [a], [flat_a], {"shape": flat_a.shape}, node.name)]
        inputs = [flat_a, b]
        if c is not None:
            c_shape = (rows if scm else 1, y.shape[-1] if scn else 1)
            flat_c = c if c.rank <= 1 and not scm else graph.new_value(c.dtype, c_shape)
            if flat_c is not c:
                new.append(Node("Reshape", [c], [flat_c], {"shape": flat_c.shape}, node.name))
            inputs.append(flat_c)
        flat_y = graph.new_value(y.dtype, (rows, y.shape[-1]))
        y.producer = None
        new.append(Node("Gemm", inputs, [flat_y], node.attrs, node.name, node.schedule))
        new.append(Node("Reshape", [flat_y], [y], {"shape": y.shape}, node.name))
        for i, n in enumerate(new):
            graph.add_node(n, at + i)
        changed = True
    return changed
