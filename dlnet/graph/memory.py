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
        for i, (_off, sz) in enumerate(self.free):
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

    def free_tail(self):
        """The free block that runs to the arena's end, or None."""
        if self.free and sum(self.free[-1]) == self.end:
            return self.free[-1]
        return None

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


def plan_memory(graph, inplace=True, keep=(), together=None, workspace=None, tie=()):
    """Assign every runtime value a byte offset. `keep`: value ids that must live to the end (training).
    `tie`: (output value id, input value id) pairs: the output takes the graph input's place where the node making it
    may write over that input and is its last reader (a kept KV cache then needs no copy to the next run's input).
    `together`: (start, stop, images), nodes[start:stop] run slice after slice of the batch, of at most `images`
    images each (lowering.chunked_prefix): every value they read or write then lives from the first to the last of
    them, and their outputs are placed before any of them runs, so that no workspace, split-K block or later output
    of theirs lands on one; the values that only they read take a block of one slice (plan.per_slice).
    `workspace(node)`: (bytes it could use, least bytes it needs) of scratch the backend's kernels want inside the
    arena while the node runs, or None (kernels/families/winograd.py's workspace)."""
    # workspaces may take as much as the plan without `together` would have had (its arena, which the values of one
    # slice no longer fill: resnet50 b16's first layer, 51 MB, left its Winograd layers short, in 47 more launches)
    room = plan_memory(graph, inplace, keep, workspace=workspace).act_bytes if together else 0
    return _Planner(graph, inplace, keep, together, room, workspace, tie).run()


def _concat_slices(graph):
    """value id -> (root value id, element offset) for each input a Concat writes straight into its slice of the
    output, where that slice is contiguous; chains of Concats resolved to the last one."""
    root = {}
    outputs = {v.id for v in graph.outputs}
    for node in graph.nodes:
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
    return root


class _Planner:
    """One run of plan_memory, in phases that share the values' roots, their lifetimes and the activation arena."""

    def __init__(self, graph, inplace, keep, together, room, workspace=None, tie=()):
        self.graph, self.nodes = graph, graph.nodes
        self.workspace = workspace or (lambda node: None)
        self.inplace, self.keep, self.room = inplace, keep, room
        self.start, self.stop, self.images = together or (0, 0, 0)
        self.plan = MemoryPlan()
        self.weight_views = self.plan.const_alias
        self.root = {}  # value id -> (root value id, element offset)
        self.last, self.size = {}, {}  # root id -> index of the last node that reads it, bytes
        self.pinned = set()  # roots that live to the end
        self.tie, self.tied = tuple(tie), {}  # tied output id -> the input root it is written over
        self.offsets = {}  # root id -> byte offset in the activation arena
        self.arena = _Arena()

    def run(self):
        self.root = _concat_slices(self.graph)
        self.share_alias_outputs()
        self.place_constants()
        self.find_lifetimes()
        self.slice_together()
        views = {n.outputs[0].id for n in self.nodes if n.spec.kind == "alias"}
        self.plan.naive_act_bytes = sum(_align(v.nbytes) for v in self.graph.values()
                                        if v.const is None and v.id not in views)
        self.place_activations()
        return self.plan

    def find(self, v):
        """(root value id, element offset) of the buffer v lives in."""
        r = self.root.get(v.id)
        return r if r is not None else (v.id, 0)

    def in_arena(self, v):
        """v is a value of the activation arena: neither a weight nor a view of one."""
        return v is not None and v.const is None and v.id not in self.weight_views

    def share_alias_outputs(self):
        """Outputs of alias ops share their input's root, or are views of a weight."""
        weight_views = self.weight_views
        for node in self.nodes:
            if node.spec.kind == "alias":
                src = node.inputs[0]
                if src.const is not None or src.id in weight_views:
                    weight_views[node.outputs[0].id] = weight_views.get(src.id, src.id)
                else:
                    rid, off = self.find(src)
                    self.root[node.outputs[0].id] = (rid, off + node.spec.view_offset(node))
        self.plan.alias_of = dict(self.root)

    def place_constants(self):
        """The weight arena: the constants read at run time, in order of first use."""
        const_off = 0
        for node in self.nodes:
            for v in node.inputs:
                if v is not None and v.const is not None and v.id not in self.plan.const_offsets:
                    self.plan.const_offsets[v.id] = const_off
                    const_off += _align(v.nbytes)
        self.plan.const_bytes = const_off

    def find_lifetimes(self):
        """Size and last reader of each root; the graph's inputs, outputs and `keep` live to the end."""
        graph, find, last, size = self.graph, self.find, self.last, self.size
        tied_inputs = {x for _, x in self.tie}
        self.pinned = {find(v)[0] for v in graph.inputs if v.id not in tied_inputs}
        self.pinned |= {find(v)[0] for v in graph.outputs if v.const is None and v.id not in self.weight_views}
        self.pinned |= set(self.keep)
        for v in graph.inputs:
            rid = find(v)[0]
            last[rid], size[rid] = -1, v.nbytes
        for i, node in enumerate(self.nodes):
            for v in node.outputs:
                rid = find(v)[0]
                if rid == v.id and v.id not in self.weight_views:
                    size[rid] = v.nbytes
                    last.setdefault(rid, i)
            for v in node.inputs:
                if self.in_arena(v):
                    rid = find(v)[0]
                    last[rid] = max(last.get(rid, i), i)
        self.tie_outputs()
        for rid in self.pinned:
            last[rid] = len(self.nodes)

    def tie_outputs(self):
        """Each tied output whose node may write over its input, and reads it last, takes it over; other tied
        inputs stay pinned."""
        made_at = {y.id: (i, node) for i, node in enumerate(self.nodes) for y in node.outputs}
        inputs = {v.id: v for v in self.graph.inputs}
        for y_id, x_id in self.tie:
            i, node = made_at.get(y_id, (None, None))
            x = inputs.get(x_id)
            y = next((o for o in node.outputs if o.id == y_id), None) if node is not None else None
            if (y is not None and x is not None and self.find(x) == (x_id, 0) and self.find(y) == (y_id, 0)
                    and self.last.get(x_id) == i and node.inputs.count(x) == 1 and x_id not in self.tied.values()
                    and _inplace_candidate(node, node.inputs.index(x), y)):
                self.tied[y_id] = x_id
            elif x is not None:
                self.pinned.add(x_id)

    def slice_together(self):
        """The nodes run slice after slice: the values only they read take one slice's bytes, and every value they
        touch lives to the last of them."""
        start, stop = self.start, self.stop
        for node in self.nodes[start:stop]:
            for v in node.outputs:
                if (self.find(v)[0] == v.id and v.id not in self.weight_views and v.id not in self.pinned
                        and self.last.get(v.id, -1) < stop):
                    self.size[v.id] = v.nbytes // v.shape[0] * self.images
                    self.plan.per_slice.add(v.id)
        for node in self.nodes[start:stop]:
            for v in node.inputs + node.outputs:
                if self.in_arena(v):
                    rid = self.find(v)[0]
                    self.last[rid] = max(self.last.get(rid, stop - 1), stop - 1)

    def place_activations(self):
        """Walk the nodes in order: place each output, then the node's workspace, note the arena's free blocks while
        it runs, then free the workspace and the roots that die at the node."""
        dies_at = {}
        for rid, i in self.last.items():
            dies_at.setdefault(i, []).append(rid)
        for v in self.graph.inputs:
            rid = self.find(v)[0]
            if rid not in self.offsets:
                self.offsets[rid] = self.arena.alloc(_align(self.size[rid]))
        for i, node in enumerate(self.nodes):
            if i == self.start < self.stop:
                self.place_together_outputs()
            self.place_outputs(i, node)
            temp = self.place_workspace(node)
            if node.outputs:
                self.plan.free_at[node.outputs[0].id] = self.free_blocks()
            if temp:
                self.arena.release(*temp)
            for rid in dies_at.get(i, []):
                if self.last.get(rid) == i and rid in self.offsets:
                    self.arena.release(self.offsets[rid], _align(self.size[rid]))
        self.plan.act_offsets = self.offsets
        self.plan.act_bytes = self.arena.end

    def place_together_outputs(self):
        """Every output of the nodes run slice after slice, before the first of them runs."""
        for y in [y for n in self.nodes[self.start:self.stop] for y in n.outputs]:
            if y.id not in self.root and y.id not in self.weight_views and y.id not in self.offsets:
                self.offsets[y.id] = self.arena.alloc(_align(self.size[y.id]))

    def place_outputs(self, i, node):
        """Node i's outputs: over an input that dies here where the op allows it, else in a new block."""
        for y in node.outputs:
            rid = self.find(y)[0]
            if rid != y.id and rid not in self.offsets and rid in self.size:  # the first slice of a Concat's output
                self.offsets[rid] = self.arena.alloc(_align(self.size[rid]))
            if y.id in self.root or y.id in self.offsets or y.id in self.weight_views:
                continue
            x_id = self.tied.get(y.id)
            if x_id is not None and self.last.get(x_id) == i:  # (not where slice_together made it live longer)
                self.offsets[y.id] = self.offsets[x_id]
                self.last[x_id] = -2
                continue
            donor = self.inplace_donor(i, node, y) if self.inplace and y.id not in self.pinned else None
            if donor is not None:
                self.offsets[y.id] = self.offsets[donor]
                self.last[donor] = -2  # handed over: not released twice
            else:
                self.offsets[y.id] = self.arena.alloc(_align(y.nbytes))

    def inplace_donor(self, i, node, y):
        """The root of an input of node i that dies there and that y may be written over, or None."""
        for index, x in enumerate(node.inputs):
            if not self.in_arena(x):
                continue
            rid = self.find(x)[0]
            if (self.last.get(rid) == i and rid not in self.pinned and rid in self.offsets and self.find(x)[1] == 0
                    and _align(self.size[rid]) == _align(y.nbytes) and _inplace_candidate(node, index, y)
                    and rid not in [self.find(o)[0] for o in node.outputs]):
                return rid
        return None

    def place_workspace(self, node):
        """Scratch for this node alone, as (byte offset, bytes), or None: all of it where a free block holds it, else
        what fits (>= least), the arena's tail growing up to `room`."""
        need = self.workspace(node)
        if not need:
            return None
        full, least = need
        arena = self.arena
        tail = arena.free_tail()
        room_left = self.room - (arena.end - (tail[1] if tail else 0))
        nbytes = _align(full if arena.largest_free() >= full else
                        min(full, max(least, arena.largest_free(), room_left)))
        self.plan.temps[node.outputs[0].id] = (arena.alloc(nbytes), nbytes)
        return self.plan.temps[node.outputs[0].id]

    def free_blocks(self):
        """The arena's free blocks now; the last runs to the arena's end (bytes None)."""
        tail = self.arena.free_tail()
        tail_offset = tail[0] if tail else self.arena.end
        return [b for b in self.arena.free if b[0] < tail_offset] + [(tail_offset, None)]
