"""Half storage for precision="fp16": which float32 values the arena (and which weights the weight arena) holds as
float16. The kernels still compute in float32 (they load half and store half); only the bytes change.

A value is stored in half when its producer's kernel writes half and every reader's kernel reads it in half; a weight
when every reader reads it in half. Values that share a buffer decide together (a reshape-like view and its input, a
Concat and the inputs written into its slices). Graph inputs and outputs stay float32 for the user, and so do
trainable parameters (the optimizer's float32 master weights) and values of one element. What each kernel reads and
writes comes from the caller (`io(node) -> HalfIO`: kernels/schedule.half_io, declared once per kernel family), so
this pass knows no kernel. The decision is written into the IR: the values' dtypes become float16 (printed f16) and
the weights' data is converted.
"""
import numpy as np

from ..ir import HALF_NOTE, Node


def _find(parent, i):
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i


def _groups(graph):
    """value id -> its group's id: views share their input's buffer, a Concat's inputs may be written in its slices."""
    parent = {v.id: v.id for v in graph.values()}
    for node in graph.nodes:
        if node.spec.kind == "alias" or node.op == "Concat":
            for v in node.inputs[:None if node.op == "Concat" else 1]:
                if v is not None:
                    parent[_find(parent, v.id)] = _find(parent, node.outputs[0].id)
    return {vid: _find(parent, vid) for vid in parent}


def store_half(graph, io):
    """Store in half every float32 value whose writer and readers all take half (io(node): the node's HalfIO).
    Returns the number of values stored in half."""
    group = _groups(graph)
    ok = {}  # group id -> may it be half
    members = {}
    boundary = {v.id for v in graph.inputs} | {v.id for v in graph.outputs}
    for v in graph.values():
        g = group[v.id]
        members.setdefault(g, []).append(v)
        # (a one-element value stays float32: half saves it no bandwidth, and in training the scalars are the loss and
        # its scaled gradient, which overflows half at GradScaler's first scale, 2**16)
        fine = v.dtype == "float32" and v.id not in boundary and not v.param and v.size > 1
        ok[g] = ok.get(g, True) and fine
    for node in graph.nodes:
        view = node.spec.kind == "alias" or node.op == "Concat"
        cap = io(node)
        if not view or node.op == "Concat":
            for i, v in enumerate(node.inputs):
                if v is not None and not cap.reads_input(i):
                    ok[group[v.id]] = False
            for i, v in enumerate(node.outputs):
                if not cap.writes_output(i):
                    ok[group[v.id]] = False
    stored = 0
    for g, values in members.items():
        if not ok[g] or all(v.const is None and v.producer is None for v in values):
            continue  # (a group with no writer and no weight: nothing to store)
        for v in values:
            v.dtype = "float16"
            if v.const is not None:
                v.const = np.asarray(v.const, np.float32).astype(np.float16)
            stored += 1
    if stored:
        graph.stored_half = True
        half_bytes = sum(v.nbytes for values in members.values() for v in values if v.dtype == "float16")
        graph.notes.append(f"{HALF_NOTE}{stored} values stored in half ({half_bytes / 2**20:.2f} MiB)")
    return stored


def half_weight_copies(graph, io):
    """Training graphs: each float32 parameter of two or more dims (a matrix, a convolution's kernel) that some kernel
    reads in half is read by those through a copy (a Cast node before the first of them, once per step), which
    store_half then stores in half: autocast's cast of the weights. The parameter stays the optimizer's float32
    master copy; products whose both operands are half may take a half core (gemm_ldsm.cl's f16 on NVIDIA). A vector
    (a bias, a norm's scale) is read as it is: its copy would cost a launch for nothing. Returns the copies made."""
    return _half_copies(graph, io, [v for v in graph.values() if v.param and v.dtype == "float32" and v.rank >= 2],
                        lambda node: node.spec.kind != "alias")


def half_input_copies(graph, io, takes):
    """Inference graphs: a float32 graph input (the boundary stays float32) that a product `takes` (node -> bool:
    one whose half operands run on a half core, as NVIDIA's tensor cores) reads in half is read by it through a copy
    that store_half stores in half, as half_weight_copies does for weights: a Linear layer on the input then runs
    on wgmma, not on the float core (4096^3 on an H200: 3.9 -> 0.26 ms). Returns the copies made."""
    inputs = [v for v in graph.inputs if v.dtype == "float32" and v.rank >= 2 and v.size > 1]
    return _half_copies(graph, io, inputs, lambda node: node.op == "Gemm" and takes(node))


def _half_copies(graph, io, values, reader):
    """Each of `values` read in half (io) by nodes that `reader` accepts: those read a Cast copy of it, made before
    the first of them. Returns the number of copies."""
    index = {id(n): i for i, n in enumerate(graph.nodes)}
    made = []
    for v in values:
        readers = [(n, i) for n in v.users if reader(n) for i, x in enumerate(n.inputs)
                   if x is v and io(n).reads_input(i)]
        if readers:
            made.append((min(index[id(n)] for n, _ in readers), v, readers))
    for at, v, readers in sorted(made, key=lambda m: -m[0]):  # (from the back: the indices before stay valid)
        copy = Node("Cast", [v], [graph.new_value("float32", v.shape, f"{v.name}_f16")], {"to": "float32"},
                    f"{v.name}_f16")
        graph.add_node(copy, at)
        for node, i in readers:
            graph.set_input(node, i, copy.outputs[0])
    return len(made)
