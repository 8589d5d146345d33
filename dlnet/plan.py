"""Plans: one graph planned for one set of input shapes, run as a loop of enqueues.

Plan: the device schedule (each node's algorithm), the memory plan (with the workspace each algorithm asks), the
lowering to launches bound once, and run(). StagedPlan: a model with host steps, its later parts planned per shape.

Models with host steps: device graphs split at ONNX nodes that run on the host, each later part planned per shape.

A node whose output shapes depend on its input values (NonZero, Unique, NonMaxSuppression, ...) or that reads
strings cannot be planned ahead. The importer ends the graph before it (`graph.cut`); at run time the part before
runs on the device, the values the rest reads come back to the host, the node runs there through its ops' NumPy
forms (the code that folds them at load), and the rest of the model is imported from the next node with those
arrays as its inputs, planned once per set of shapes and cached like any plan. Every shape is a true one.

A node whose shape is decided by a value computed on the device (a Reshape's shape from a ReduceMax, ...) stops the
graph the same way, but does not run on the host: the rest is imported from that node with the values it needs as
constants (`cut.needs`), planned once per value. Graph inputs that decide shapes are bound by the Net instead
(dlnet/net.py), so such a model stays one plan per value. Every cache of plans is a PlanCache.
"""
import math
import weakref
from collections import OrderedDict

import numpy as np

from .errors import InputError
from .graph.memory import plan_memory
from .kernels.families import winograd
from .kernels.launch import Deferred
from .kernels.lowering import Lowerer
from .kernels.persist import counters_bytes, persistent_launches
from .kernels.runtime import cl
from .kernels.schedule import chunked_prefix, schedule
from .kernels.tuner import Measured
from .onnx.importer import Importer, _names_read
from .pipeline import stage_graph

FLUSH_EVERY = 16  # launches
MAX_PLANS = 8  # plans a cache keeps (one per set of input shapes, values that decide shapes, choice of outputs)


class PlanCache(OrderedDict):
    """Plans by key, the least recently used released beyond `limit` (a Net's plans, a staged plan's later parts)."""

    def __init__(self, limit=MAX_PLANS):
        super().__init__()
        self.limit = max(int(limit), 1)

    def get_or_plan(self, key, make):
        plan = self.get(key)
        if plan is None:
            plan = make()
            self[key] = plan
            while len(self) > self.limit:
                _, evicted = self.popitem(last=False)
                evicted.release()
        self.move_to_end(key)
        return plan

    def release(self):
        for plan in self.values():
            plan.release()
        self.clear()


def value_key(arrays):
    """A cache key for arrays whose values (not only shapes) decide a plan."""
    return tuple((n, a.dtype.str, a.shape, a.tobytes()) for n, a in arrays.items())


class Plan:
    """One graph planned for one set of input shapes: buffers, bound launches, output locations."""

    def __init__(self, ctx, graph, chunk_inputs=True, tie=()):
        """tie: (output name, input name) pairs of values kept from run to run (Net.run(keep=...)): the output is
        computed over the input's place where its node allows (graph/memory.py), so the next run needs no copy."""
        self.ctx = ctx
        self.graph = graph
        schedule(graph, ctx)  # each node's algorithm, before memory is planned
        # nodes run slice after slice of the batch while it goes up (not in plans run in parts: vjp.py)
        self.prefix = chunked_prefix(ctx, graph) if chunk_inputs else None
        pre = self.prefix
        together = (pre.start, pre.stop, max(nb for _, nb in pre.chunks)) if pre else None
        outs = dict(zip(graph.output_names, graph.outputs))
        ins = {v.name: v for v in graph.inputs}
        tied = [(outs[o].id, ins[i].id) for o, i in tie if o in outs and i in ins]
        self.memory = plan_memory(graph, together=together, tie=tied,
                                  workspace=lambda node: winograd.workspace(node, ctx.options))
        # a DeviceError before anything is allocated where the arenas cannot fit the device; each buffer is
        # committed when allocated (Context.alloc), so running out is an error here, never a crash in run()
        ctx.check_room([self.memory.act_bytes, self.memory.const_bytes], f"{graph.name}: planned device memory")
        self.act_buf = self.const_buf = None
        self.lowerer = None
        self.tuning = None  # what tuner.tune_layers measured for this plan, where it did
        self.issued = weakref.WeakSet()  # Kept values this plan's runs left in its arena
        self.host_uploads = self.device_binds = 0  # inputs copied up from the host / bound from a Kept value
        try:
            # Lowered first, with the arenas named but not yet allocated: on a fresh Context the device's context is
            # still opening on its thread meanwhile. Then the weights go up without waiting while the programs build.
            act = Deferred(lambda: ctx.alloc(self.memory.act_bytes))
            const = Deferred(lambda: ctx.alloc(self.memory.const_bytes))
            lw = Lowerer(ctx, graph, self.memory, act, const, Measured(ctx))
            self.lowerer = lw
            lw.lower(graph, self.prefix)
            self.act_buf = lw.act_buf = act.get()
            self.const_buf = lw.const_buf = const.get()
            for v in self._consts():
                ctx.upload(self.const_buf, v.const, self.memory.const_offsets[v.id], wait=False)
            lw.finish()
            self.launches = lw.launches
            self.run_list = self.launches  # what run() enqueues: on CPUs, runs of launches as persistent kernels
            self.runs, self.counters = 0, None
            nbytes = counters_bytes(ctx, self.launches)
            if nbytes:  # (allocated with the plan: a later run copies nothing more than its inputs and outputs)
                self.counters = lw.scratch["persistent"] = ctx.alloc(nbytes)
                cl.enqueue_fill_buffer(ctx.queue, self.counters, np.int32(0), 0, nbytes)
            self.node_launches = lw.node_launches  # node index -> (first launch, end)
            self.input_locs = [lw.loc(v) for v in graph.inputs]
            self._dests = None  # (input_locs as byte ranges, made by the first _bind_kept)
            self._clobbers = {}  # _clobbered's answers, per place of a kept value and the input it feeds
            self.input_chunks = lw.input_chunks  # {input index: [(first, end) element of each chunk]}
            self.output_locs = [None if v.const is not None else lw.loc(v) for v in graph.outputs]
            self.staging = {}  # output index -> its pinned host array (_staged_download)
            ctx.finish()
        except Exception:
            self.release()
            raise

    def _consts(self):
        seen = {}
        for n in self.graph.nodes:
            for v in n.inputs:
                if v is not None and v.const is not None:
                    seen[v.id] = v
        return seen.values()

    def release(self):
        self.staging = {}  # (the pinned arrays unmapped as they go)
        for k in list(getattr(self, "issued", ())):
            if k.owner is self:  # kept values move out of the arena before it goes
                k.materialize()
        scratch = list(self.lowerer.scratch.values()) if self.lowerer is not None else []
        for b in [self.act_buf, self.const_buf] + scratch:
            if b is not None:
                self.ctx.free(b)
        self.act_buf = self.const_buf = None
        if self.lowerer is not None:
            self.lowerer.scratch = {}

    # parts of a run (vjp.py runs a forward and a backward half of one plan) ----------------------------------------
    def upload(self, index, array):
        """Graph input `index` from a contiguous host array (not waiting)."""
        buf, off = self.input_locs[index]
        if array.size:
            cl.enqueue_copy(self.ctx.queue, buf, array, dst_offset=off * array.itemsize, is_blocking=False)

    def upload_const(self, value, array):
        """A constant's device copy (a weight the caller changed) from a host array, waiting."""
        a = np.ascontiguousarray(array, dtype=value.dtype).reshape(value.shape)
        self.ctx.upload(self.const_buf, a, self.memory.const_offsets[value.id])

    def run_launches(self, start, stop):
        q = self.ctx.queue
        for i, launch in enumerate(self.launches[start:stop]):
            launch.enqueue(q)
            if i % FLUSH_EVERY == 0:
                q.flush()

    def download(self, index):
        """Graph output `index` as a new host array (waiting)."""
        v, loc = self.graph.outputs[index], self.output_locs[index]
        if loc is None:
            return np.array(v.const)
        y = np.empty(v.shape, v.dtype)
        if y.size:
            cl.enqueue_copy(self.ctx.queue, y, loc[0], src_offset=loc[1] * y.itemsize, is_blocking=True)
        return y

    def _persistent(self):
        """On a CPU device of several workers, from run Options.cpu_persistent_after on, run() enqueues runs of
        launches as persistent kernels (kernels/persist.py), their programs built here: a plan run once (most of
        the tests' plans) builds none."""
        if self.counters is not None and self.runs == self.ctx.options.cpu_persistent_after:
            self.run_list = persistent_launches(self.ctx, self.launches, self.counters)
        self.runs += 1

    def run(self, arrays, keep=()):
        """Inputs in graph order (host arrays, or Kept values on the device), outputs in graph order: host arrays,
        except the output indices in `keep`, which stay where this run computed them, as Kept values."""
        self._persistent()
        ctx, q = self.ctx, self.ctx.queue
        kept_in = {i: a for i, a in enumerate(arrays) if isinstance(a, Kept)}
        copied = self._bind_kept(kept_in)
        events = {}
        for i, ((buf, off), a) in enumerate(zip(self.input_locs, arrays)):
            if i in kept_in:
                continue
            chunks = self.input_chunks.get(i)
            if chunks and a.size:  # in chunks on the copy queue, each awaited by its chunk's launches
                if copied:  # (the copy queue is not ordered after the main queue's copies of kept values)
                    q.finish()
                    copied = False
                flat = a.reshape(-1)
                for c, (lo, hi) in enumerate(chunks):
                    events[i, c] = cl.enqueue_copy(ctx.copy_queue, buf, flat[lo:hi], dst_offset=(off + lo) * a.itemsize,
                                                   is_blocking=False)
                ctx.copy_queue.flush()
            elif a.size:
                cl.enqueue_copy(q, buf, a, dst_offset=off * a.itemsize, is_blocking=False)
                self.host_uploads += 1
        # flushes hand the device its work while the host still enqueues the rest (NVIDIA's driver holds commands
        # back otherwise: vgg16 at batch 1, whose 87 launches take 0.8 ms to enqueue, 2.63 -> 2.31 ms)
        q.flush()
        for i, launch in enumerate(self.run_list):
            launch.enqueue(q, events)
            if i % FLUSH_EVERY == 0:
                q.flush()
        outs, events, staged = [], [], []
        lo, hi, chunk = ctx.options.download_staging
        for index, (v, loc) in enumerate(zip(self.graph.outputs, self.output_locs)):
            if loc is None:
                outs.append(np.array(v.const))
                continue
            if index in keep:
                outs.append(Kept(ctx, v.shape, v.dtype, loc[0], loc[1] * np.dtype(v.dtype).itemsize, self))
                self.issued.add(outs[-1])
                continue
            y = np.empty(v.shape, v.dtype)
            if not ctx.is_cpu and lo <= y.nbytes <= hi and y.size:
                staged.append(self._staged_download(index, y, loc, chunk))
            elif y.size:
                events.append(cl.enqueue_copy(q, y, loc[0], src_offset=loc[1] * y.itemsize, is_blocking=False))
            outs.append(y)
        for y, pinned, parts in staged:  # (each chunk into y as its copy lands, while the next ones still run)
            flat = y.reshape(-1)
            for (a, b), event in parts:
                event.wait()
                flat[a:b] = pinned[a:b]
        cl.wait_for_events(events) if events else ctx.finish()
        if ctx.options.debug_bounds:
            ctx.check_guards(self.graph.name)
        return outs

    def _staged_download(self, index, y, loc, chunk):
        """Enqueue output `index`'s copy into this plan's pinned array for it (made on first use), in chunks of about
        `chunk` bytes: (y, the pinned array flat, [((first, end) element, the chunk's event), ...])."""
        if index not in self.staging:
            self.staging[index] = self.ctx.pinned((y.size,), y.dtype)
        pinned, step = self.staging[index], max(1, chunk // y.itemsize)
        parts = []
        for a in range(0, y.size, step):
            b = min(y.size, a + step)
            parts.append(((a, b), cl.enqueue_copy(self.ctx.queue, pinned[a:b], loc[0],
                                                  src_offset=(loc[1] + a) * y.itemsize, is_blocking=False)))
        self.ctx.queue.flush()
        return y, pinned, parts

    def _bind_kept(self, kept_in):
        """Copy the Kept inputs into their places in the arena, device to device, before anything else this run
        writes there. A value this plan kept from an earlier run is still in this arena: where a place some input
        of this run is written to overlaps it, or this run does not read it, it first moves to its own buffer (the
        launches would overwrite it). Returns whether a copy was enqueued."""
        item = {i: np.dtype(v.dtype).itemsize for i, v in enumerate(self.graph.inputs)}
        if self._dests is None:  # (once: a decode step binds dozens of values)
            self._dests = [(buf, off * item[i], off * item[i] + _nbytes(v)) for i, ((buf, off), v)
                           in enumerate(zip(self.input_locs, self.graph.inputs))]
        dests = self._dests
        own = {id(k): i for i, k in kept_in.items()}  # (where a value already lies in its input's place: no copy)
        copied = False
        for k in list(self.issued):
            i = own.get(id(k))
            if k.owner is self and (i is None or self._clobbered(k, i, dests)):
                k.materialize()
                copied = True
        for i, k in kept_in.items():
            k.check_live(self.graph.inputs[i].name)
            buf, off = self.input_locs[i]
            if k.nbytes and not (k.buf is buf and k.offset == off * item[i]):
                cl.enqueue_copy(self.ctx.queue, buf, k.buf, byte_count=k.nbytes, src_offset=k.offset,
                                dst_offset=off * item[i])
                copied = True
            self.device_binds += 1
        for k in kept_in.values():
            if k.owner is self:  # this run's launches overwrite it: consumed
                k.consume()
        return copied

    def _clobbered(self, k, i, dests):
        """Whether a place this run's inputs are written to, other than input i's own where k already lies there,
        overlaps kept value k (in this plan's arena). The places are the plan's, so the answer is kept per (k's place,
        i): a decode step asks it of each of its cached keys and values against each input (24 x 26 pairs for a
        12-layer decoder, 0.46 ms of a step's host time under cProfile)."""
        key = (id(k.buf), k.offset, k.nbytes, i)
        hit = self._clobbers.get(key)
        if hit is None:
            hit = self._clobbers[key] = any(_overlaps(d, k) for j, d in enumerate(dests) if j != i or not _same(d, k))
        return hit


class StagedPlan:
    """A graph that ends in a cut: its device plan, then the host step, then the rest (a StagedPlan per set of
    run-time shapes; the last one's cut has no host step)."""

    def __init__(self, ctx, model, path, graph, input_names, output_names, max_plans=MAX_PLANS):
        self.ctx, self.model, self.path = ctx, model, path
        self.graph = graph
        self.input_names, self.output_names = input_names, output_names
        self.head = Plan(ctx, graph) if graph.nodes else None
        self.memory = self.head.memory if self.head is not None else plan_memory(graph)
        self.launches = self.head.launches if self.head is not None else []
        self.rest = PlanCache(max_plans)  # (name, dtype, shape) of the rest's inputs (and needed values) -> its plan

    def run(self, arrays):
        """Plan's contract: the model's inputs in order in, its outputs out."""
        env = dict(zip(self.input_names, arrays))
        self.run_env(env)
        return [np.asarray(env[n]) for n in self.output_names]

    def run_env(self, env):
        """Run this part and everything after it; `env` ({ONNX name: array}) gains every value they compute."""
        g, cut = self.graph, self.graph.cut
        if self.head is not None:
            env.update(zip(g.output_names, self.head.run([np.require(env[v.name], requirements="C")
                                                            for v in g.inputs])))
        for name, src in cut.aliases.items():
            env[name] = env[src]
        env.update(cut.consts)
        if cut.index is None:
            return
        start = cut.index
        needed = {n: np.asarray(env[n]) for n in cut.needs}
        if not cut.needs:  # the node runs on the host; the rest starts after it
            env.update(Importer(self.model, self.path).run_host(cut.index, env))
            start += 1
        later = _later_names(self.model, start)
        inputs = {n: env[n] for n in sorted(later) if n in env and n not in cut.consts and n not in needed}
        key = tuple((n, a.dtype.str, a.shape) for n, a in inputs.items()) + value_key(needed)

        def plan_rest():
            types = {n: (a.dtype, a.shape) for n, a in inputs.items()}
            consts = {n: a for n, a in cut.consts.items() if n in later}
            consts.update(needed)
            graph = stage_graph(self.model, self.path, start, types, consts, self.ctx)
            return StagedPlan(self.ctx, self.model, self.path, graph, list(inputs), self.output_names,
                              self.rest.limit)
        self.rest.get_or_plan(key, plan_rest).run_env(env)

    def release(self):
        if self.head is not None:
            self.head.release()
        self.rest.release()


def _later_names(model, start):
    return _names_read(model.graph.node[start:]) | {o.name for o in model.graph.output}


class Kept:
    """A run's output kept on the device for a later run's input (onnxruntime's IO binding idea): `shape`, `dtype`,
    and where it lies. Left in the arena of the plan that computed it (`owner`) for as long as nothing else would
    write there; it moves to a buffer of its own (materialize) before that plan runs again without reading it, is
    released, or writes over it in a way a copy cannot follow. A plan run that reads it from its own arena consumes
    it."""

    def __init__(self, ctx, shape, dtype, buf, offset, owner=None):
        self.ctx, self.shape, self.dtype = ctx, tuple(shape), np.dtype(dtype)
        self.buf, self.offset, self.owner = buf, offset, owner  # offset in bytes; owner None: buf is its own
        self.own = owner is None and buf is not None
        self.state = "live"
        self.nbytes = _nbytes(self)

    @property
    def ndim(self):
        return len(self.shape)

    def __repr__(self):
        return f"Kept({self.dtype}[{','.join(map(str, self.shape))}], {self.state})"

    def check_live(self, where):
        if self.state != "live":
            raise InputError(f"input {where!r}: this kept value was {self.state} (a kept value feeds one run)")

    def materialize(self):
        """Move into a buffer of its own (device to device); the arena it was in may then be overwritten."""
        if self.owner is None:
            return
        buf = self.ctx.alloc(self.nbytes)
        if self.nbytes:
            cl.enqueue_copy(self.ctx.queue, buf, self.buf, byte_count=self.nbytes, src_offset=self.offset)
        self.buf, self.offset, self.owner, self.own = buf, 0, None, True

    def consume(self):
        self.owner, self.buf, self.state = None, None, "consumed"

    def numpy(self):
        """The value as a new host array (waiting)."""
        self.check_live("(download)")
        y = np.empty(self.shape, self.dtype)
        if y.size:
            cl.enqueue_copy(self.ctx.queue, y, self.buf, src_offset=self.offset, is_blocking=True)
        return y

    def release(self):
        """Its own buffer back to the device (a value still in a plan's arena just stops being kept)."""
        if self.own and self.buf is not None:
            self.ctx.free(self.buf)
        if self.owner is not None:
            self.owner.issued.discard(self)
        self.buf, self.owner, self.own, self.state = None, None, False, "released"


def _nbytes(v):
    return math.prod(v.shape) * np.dtype(v.dtype).itemsize


def _same(dest, k):
    return dest[0] is k.buf and dest[1] == k.offset


def _overlaps(dest, k):
    buf, lo, hi = dest
    return buf is k.buf and lo < k.offset + k.nbytes and k.offset < hi and hi > lo
