"""The memory planner: one activation arena and one weight arena, offsets assigned by liveness.

A value's block is free after its last reader; reshape-like ops alias their input (in the weight arena where the
input is a weight); an elementwise op writes in place over an input that dies there and is read with the output's
own indexing.
"""
from dataclasses import dataclass, field

import numpy as np

ALIGN = 256


def _align(n):
    return (int(n) + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class MemoryPlan:
    act_offsets: dict = field(default_factory=dict)    # root value id -> byte offset in the activation arena
    const_offsets: dict = field(default_factory=dict)  # const value id -> byte offset in the weight arena
    alias_of: dict = field(default_factory=dict)       # value id -> (root value id, element offset)
    const_alias: dict = field(default_factory=dict)    # view of a weight (Reshape of a trained one) -> its value id
    act_bytes: int = 0
    const_bytes: int = 0
    naive_act_bytes: int = 0  # one buffer per value
    temps: dict = field(default_factory=dict)  # node output id -> (byte offset, bytes) of the node's workspace
    # node output id -> [(byte offset, bytes)] of the arena free while that node runs (its outputs and workspace
    # placed); the last block runs to the arena's end (bytes None): the lowering puts split-K partials there
    free_at: dict = field(default_factory=dict)
    # values that nodes run slice after slice of the batch (`together`) write and only they read: a block of one
    # slice, which every slice uses in turn
    per_slice: set = field(default_factory=set)

    def __str__(self):
        mib = 2 ** 20
        return (f"activations {self.act_bytes / mib:.2f} MiB planned (one buffer per value: "
                f"{self.naive_act_bytes / mib:.2f} MiB), weights {self.const_bytes / mib:.2f} MiB")


@dataclass
class MemoryReport:
    activations: int
    weights: int
    naive_activations: int
    workspace: int = 0  # scratch buffers (split-K partials, Winograd tiles) and tables the launches read

    @property
    def total(self):
        return self.activations + self.weights + self.workspace

    def __str__(self):
        mib = 2 ** 20
        return (f"activations {self.activations / mib:.2f} MiB (one buffer per value would take "
                f"{self.naive_activations / mib:.2f} MiB), weights {self.weights / mib:.2f} MiB"
                + (f", workspace {self.workspace / mib:.2f} MiB" if self.workspace else ""))


def _inplace_candidate(node, index, y):
    """y may be written over input `index` when that input is read only at y's own indices (elementwise nodes, a
    convolution's residual)."""
    x = node.inputs[index]
    return x.shape == y.shape and x.dtype == y.dtype and node.spec.writes_over(node, index)


class _Arena:
    def __init__(self):
        self.free = []  # (offset, size), sorted by offset
        self.end = 0

    def alloc(self, size):
        best = None
        for i, (off, sz) in enumerate(self.free):
            if sz >= size and (best is None or sz < self.free[best][1]):
                best = i
        if best is not None:
            off, sz = self.free.pop(best)
            if sz > size:
                self.free.append((off + size, sz - size))
                self.free.sort()
            return off
        if self.free and self.free[-1][0] + self.free[-1][1] == self.end:  # grow the last free block
            off, _ = self.free.pop()
            self.end = off + size
            return off
        off = self.end
        self.end += size
        return off

    def largest_free(self):
        """The largest block alloc() can hand out without growing the arena."""
        return max((sz for _, sz in self.free), default=0)

    def release(self, off, size):
        self.free.append((off, size))
        self.free.sort()
        merged = []
        for o, s in self.free:
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + s)
            else:
                merged.append((o, s))
        self.free = merged


def plan_memory(graph, inplace=True, keep=(), together=None, workspace=None):
    """Assign every runtime value a byte offset. `keep`: value ids that must live to the end (training).
    `together`: (start, stop, images), nodes[start:stop] run slice after slice of the batch, of at most `images`
    images each (lowering.chunked_prefix): every value they read or write then lives from the first to the last of
    them, and their outputs are placed before any of them runs, so that no workspace, split-K block or later output
    of theirs lands on one; the values that only they read take a block of one slice (plan.per_slice).
    `workspace(node)`: (bytes it could use, least bytes it needs) of scratch the backend's kernels want inside the
    arena while the node runs, or None (kernels/families/winograd.py's workspace)."""
    plan = MemoryPlan()
    nodes = graph.nodes
    # workspaces may take as much as the plan without `together` would have had (its arena, which the values of one
    # slice no longer fill: resnet50 b16's first layer, 51 MB, left its Winograd layers short, in 47 more launches)
    room = plan_memory(graph, inplace, keep, workspace=workspace).act_bytes if together else 0
    end = len(nodes)
    # aliases: outputs of alias ops share their input's root
    root = {}

    def find(v):
        r = root.get(v.id)
        return r if r is not None else (v.id, 0)

    outputs = {v.id for v in graph.outputs}
    for node in nodes:  # Concat: inputs written straight into their slice of the output, where it is contiguous
        if node.op != "Concat" or any(d != 1 for d in node.outputs[0].shape[:node.attrs["axis"]]):
            continue
        y, axis, start = node.outputs[0], node.attrs["axis"], 0
        inner = int(np.prod(y.shape[axis + 1:], dtype=np.int64))
        for x in node.inputs:
            p = x.producer
            # x may have other readers: it stays a slice of y's buffer, never written again (its root outlives
            # them, so none takes it over in place); densenet's blocks: each layer's Concat extends the last one, 58
            # copies of ever longer prefixes otherwise
            if (p is not None and p.spec.kind != "alias" and [u for u in x.users if u.op == "Concat"] == [node]
                    and x.id not in outputs and x.const is None and node.inputs.count(x) == 1):
                root[x.id] = (y.id, start * inner)
            start += x.shape[axis]
    for vid in list(root):  # chains of Concats: each value at its offset in the last one
        rid, off = root[vid]
        while rid in root:
            rid, more = root[rid]
            off += more
        root[vid] = (rid, off)
    weight_views = plan.const_alias
    for node in nodes:
        if node.spec.kind == "alias":
            src = node.inputs[0]
            if src.const is not None or src.id in weight_views:
                weight_views[node.outputs[0].id] = weight_views.get(src.id, src.id)
            else:
                rid, off = find(src)
                root[node.outputs[0].id] = (rid, off)
    plan.alias_of = dict(root)
    # constants read at run time
    const_off = 0
    for node in nodes:
        for v in node.inputs:
            if v is not None and v.const is not None and v.id not in plan.const_offsets:
                plan.const_offsets[v.id] = const_off
                const_off += _align(v.nbytes)
    plan.const_bytes = const_off
    # lifetimes per root
    first, last, size = {}, {}, {}
    pinned = {find(v)[0] for v in graph.inputs}
    pinned |= {find(v)[0] for v in graph.outputs if v.const is None and v.id not in weight_views}
    pinned |= {find_id for find_id in keep}
    for v in graph.inputs:
        rid = find(v)[0]
        first[rid], last[rid], size[rid] = -1, -1, v.nbytes
    for i, node in enumerate(nodes):
        for v in node.outputs:
            rid = find(v)[0]
            if rid == v.id and v.id not in weight_views:
                first[rid], size[rid] = i, v.nbytes
                last.setdefault(rid, i)
        for v in node.inputs:
            if v is not None and v.const is None and v.id not in weight_views:
                rid = find(v)[0]
                last[rid] = max(last.get(rid, i), i)
    for rid in pinned:
        last[rid] = end
    start, stop, images = together or (0, 0, 0)
    for node in nodes[start:stop]:
        for v in node.outputs:
            if find(v)[0] == v.id and v.id not in weight_views and v.id not in pinned and last.get(v.id, -1) < stop:
                size[v.id] = v.nbytes // v.shape[0] * images
                plan.per_slice.add(v.id)
    for node in nodes[start:stop]:
        for v in node.inputs + node.outputs:
            if v is not None and v.const is None and v.id not in weight_views:
                rid = find(v)[0]
                last[rid] = max(last.get(rid, stop - 1), stop - 1)
    views = {n.outputs[0].id for n in nodes if n.spec.kind == "alias"}
    plan.naive_act_bytes = sum(_align(v.nbytes) for v in graph.values() if v.const is None and v.id not in views)
    dies_at = {}
    for rid, i in last.items():
        dies_at.setdefault(i, []).append(rid)
    arena = _Arena()
    offsets = {}
    for v in graph.inputs:
        rid = find(v)[0]
        if rid not in offsets:
            offsets[rid] = arena.alloc(_align(size[rid]))
    for i, node in enumerate(nodes):
        for y in [y for n in nodes[start:stop] for y in n.outputs] if i == start < stop else []:
            if y.id not in root and y.id not in weight_views and y.id not in offsets:
                offsets[y.id] = arena.alloc(_align(size[y.id]))
        for y in node.outputs:
            rid = find(y)[0]
            if rid != y.id and rid not in offsets and rid in size:  # the first slice of a Concat's output
                offsets[rid] = arena.alloc(_align(size[rid]))
            if y.id in root or y.id in offsets or y.id in weight_views:
                continue
            donor = None
            if inplace and y.id not in pinned:
                for index, x in enumerate(node.inputs):
                    if x is None or x.const is not None or x.id in weight_views:
                        continue
                    rid = find(x)[0]
                    if (last.get(rid) == i and rid not in pinned and rid in offsets and find(x)[1] == 0
                            and _align(size[rid]) == _align(y.nbytes) and _inplace_candidate(node, index, y)
                            and rid not in [find(o)[0] for o in node.outputs]):
                        donor = rid
                        break
            if donor is not None:
                offsets[y.id] = offsets[donor]
                last[donor] = -2  # handed over: not released twice
            else:
                offsets[y.id] = arena.alloc(_align(y.nbytes))
        need = workspace(node) if workspace is not None else None
        if need:  # scratch for this node alone: all of it where a free block holds it, else what fits (>= least),
            full, least = need  # the arena's tail growing up to `room`
            tail = arena.free[-1][1] if arena.free and sum(arena.free[-1]) == arena.end else 0
            room_left = room - (arena.end - tail)
            nbytes = _align(full if arena.largest_free() >= full else
                            min(full, max(least, arena.largest_free(), room_left)))
            plan.temps[node.outputs[0].id] = (arena.alloc(nbytes), nbytes)
        if node.outputs:
            tail = arena.free[-1][0] if arena.free and sum(arena.free[-1]) == arena.end else arena.end
            plan.free_at[node.outputs[0].id] = [b for b in arena.free if b[0] < tail] + [(tail, None)]
        if need:
            arena.release(*plan.temps[node.outputs[0].id])
        for rid in dies_at.get(i, []):
            if last.get(rid) == i and rid in offsets:
                arena.release(offsets[rid], _align(size[rid]))
    plan.act_offsets = offsets
    plan.act_bytes = arena.end
    return plan
