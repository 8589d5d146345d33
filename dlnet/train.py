"""Trainer: one graph holds forward, loss and backward; optimizer updates are launches appended to its plan.

Trainable weights stay in the plan's weight arena (they are `param` values: never folded) and the update kernels
write them in place, so a step is a loop of enqueues plus one small upload (the step's hyper-parameters) and one
download (the loss).
"""
import time

import numpy as np
from onnx import TensorProto

from . import allreduce, distributed, losses
from .errors import InputError, ModelError
from .graph.autodiff import gradients
from .graph.ir import Builder
from .graph.ops.grad_nn import batchnorm_global_count
from .kernels.families.attention import fused_grads
from .kernels.launch import Launch, chunk_table
from .kernels.runtime import cl, kernel_source
from .optim import SGD, LossScaler
from .pipeline import training_import, training_passes
from .plan import Plan
from .sync_bn import BatchNormSync

TARGET = "__target"
LOCAL = 256  # work-group size of the update kernels
CHUNK = 32 * LOCAL  # elements per work-group: thousands of groups for a ResNet-50, a few for a bias
LOSS_SCALE_AT = 15  # the loss scale's index in the hyper-parameter buffer (0 there: no loss scaling)
OPTIONS = (f"-DLOCAL={LOCAL}", f"-DLOSS_SCALE_AT={LOSS_SCALE_AT}")
SEED = "__dropout_seed"
LOSS_SCALE = "__loss_scale"
FLOAT_TENSORS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE)  # the dtypes a trained weight may have


class _TrainPlan:
    """The planned training graph for one batch shape and the launches of its update step."""

    def __init__(self, trainer, shapes):
        net = trainer.net
        ctx = trainer.ctx
        g, imp = training_import(net.model, net.path, shapes, fused_grads(ctx.dev, ctx.options))
        if trainer.sync_bn and trainer.comm.size > 1:
            batchnorm_global_count(g, trainer.comm.size)
        if trainer.output not in g.output_names:
            raise ModelError(f"{net.path}: output {trainer.output!r} does not exist; outputs are {g.output_names}")
        out = g.outputs[g.output_names.index(trainer.output)]
        target = g.add_input(TARGET, "float32", out.shape)
        b = Builder(g)
        loss = losses.build_loss(b, trainer.loss, out, target)
        # fp16: the backward starts from loss * scale (a graph input the host moves: optim/scaler.py)
        scaled = loss if trainer.scaler is None else b.op("Mul", [loss, g.add_input(LOSS_SCALE, "float32", ())])
        state_ids = {s.id for s, _ in imp.state_updates}
        inits = {i.name for i in net.model.graph.initializer}
        named = [(n, v) for n, v in imp.values.items() if n in inits and v.param]
        trainable = [(n, v) for n, v in named if v.id not in state_ids and n not in trainer.frozen and
                     (trainer.params is None or n in trainer.params)]
        grads = gradients(g, scaled, [v for _, v in trainable])
        self.params = [(n, v, gv) for (n, v), gv in zip(trainable, grads) if gv is not None and gv.const is None]
        self.unused = [n for (n, v), gv in zip(trainable, grads) if gv is None]
        self.updates = imp.state_updates
        g.outputs = [loss, out] + [gv for _, _, gv in self.params] + [new for _, new in self.updates]
        g.output_names = ["loss", trainer.output] + [f"grad:{n}" for n, _, _ in self.params] + \
            [f"state:{i}" for i in range(len(self.updates))]
        training_passes(g, trainer.ctx)
        self.graph = g
        self.plan = Plan(trainer.ctx, g)
        # an initializer the graph read as a constant (Dropout's ratio) has no device copy: the model's stays true
        self.weights = [(n, v) for n, v in named if v.id in self.plan.memory.const_offsets]
        self.input_names = [v.name for v in g.inputs]
        self.out = out
        self._bind_updates(trainer)
        self.reducer = self.bn_sync = None
        if trainer.comm.size > 1:
            self._bind_buckets(trainer)

    def _bind_updates(self, trainer):
        """The update step: one optimizer launch per (weight buffer, gradient buffer) pair, which is one in
        practice, over a table of chunks of every trained tensor; with clipping a sum-of-squares launch per pair
        and one clip_scale before them; one copy of every running statistic."""
        ctx, lw, opt = trainer.ctx, self.plan.lowerer, trainer.optimizer
        options = OPTIONS + (("-DVEC8",) if ctx.dev.kind in ctx.options.optim_vectors else ())
        self.launches, self.tables = [], []
        state = trainer.state_arena([n for n, _, _ in self.params])
        groups = {}  # (weight buffer, gradient buffer) -> (buffers, table rows)
        for name, v, gv in self.params:
            (pbuf, poff), (gbuf, goff) = lw.loc(v), lw.loc(gv)
            key = (pbuf.int_ptr, gbuf.int_ptr)
            groups.setdefault(key, ((pbuf, gbuf), []))[1].append((poff, goff, state.layout[name][0], v.size))
        tables = [(pbuf, gbuf, len(rows), *self._table(ctx, rows)) for (pbuf, gbuf), rows in groups.values()]
        self.partial = None
        if opt.clip_norm or trainer.scaler is not None:  # (clip_scale also unscales, and finds inf / NaN)
            self.n_partial = sum(n_rows for *_, n_rows in tables)
            self.partial = ctx.alloc(4 * self.n_partial)
            base = 0
            for _, gbuf, _, table, n_rows in tables:
                k = ctx.kernel(kernel_source("optim"), "sumsq", options)
                k.set_args(gbuf, table, self.partial, np.int32(base))
                self.launches.append(Launch(k, (n_rows * LOCAL,), (LOCAL,), "sumsq"))
                base += n_rows
            k = ctx.kernel(kernel_source("optim"), "clip_scale", options)
            k.set_args(self.partial, np.int32(base), trainer.hp_buf, np.int32(opt.max_norm_at), state.scale)
            self.launches.append(Launch(k, (LOCAL,), (LOCAL,), "clip_scale"))
        for pbuf, gbuf, n_params, table, n_rows in tables:
            k = ctx.kernel(kernel_source("optim"), opt.kernel, options)
            slots = [state.buffers[s] for s in opt.slots] or [state.scale]  # sgd without momentum: unread
            k.set_args(pbuf, gbuf, *slots, trainer.hp_buf, state.scale, table)
            self.launches.append(Launch(k, (n_rows * LOCAL,), (LOCAL,), f"{opt.kernel} {n_params} parameters"))
        copies = {}
        for old, new in self.updates:
            (dbuf, doff), (sbuf, soff) = lw.loc(old), lw.loc(new)
            copies.setdefault((dbuf.int_ptr, sbuf.int_ptr), ((dbuf, sbuf), []))[1].append((doff, soff, 0, old.size))
        for (dbuf, sbuf), rows in copies.values():
            table, n_rows = self._table(ctx, rows)
            k = ctx.kernel(kernel_source("optim"), "copy_state", options)
            k.set_args(dbuf, sbuf, table)
            self.launches.append(Launch(k, (n_rows * LOCAL,), (LOCAL,), f"running statistics ({len(rows)})"))

    def _table(self, ctx, rows):
        """Rows (offsets..., elements) per tensor -> (device table of the same rows per chunk of CHUNK elements,
        its number of rows)."""
        table = chunk_table(rows, CHUNK)
        buf = ctx.alloc(table.nbytes)
        ctx.upload(buf, table)
        self.tables.append(buf)
        return buf, len(table)

    def _bind_buckets(self, trainer):
        """Data-parallel: the gradients in buckets, in the order the backward pass finishes them (the launch after
        which each is final), each with its host buffer in a GradientReducer."""
        index = {id(n): i for i, n in enumerate(self.graph.nodes)}
        end = len(self.plan.launches)
        grads = []
        for name, _, gv in self.params:
            if gv.dtype != "float32":
                raise ModelError(f"{trainer.net.path}: gradient of {name!r} is {gv.dtype}; data-parallel training "
                                 "averages float32 gradients")
            node = index.get(id(gv.producer))
            grads.append((name, gv.nbytes, self.plan.node_launches.get(node, (end, end))[1]))
        # (launches before it is ready, [(buffer, element offset, host offset, elements)], early): early where no
        # launch reads its gradients (they are only outputs), so the average may go up while the backward runs on
        self.buckets = []
        for members in distributed.make_buckets(grads, int(trainer.bucket_mb * 2 ** 20)):
            rows, at = [], 0
            for i in members:
                buf, off = self.plan.lowerer.loc(self.params[i][2])
                rows.append((buf, off, at, self.params[i][2].size))
                at += self.params[i][2].size
            early = all(not self.params[i][2].users for i in members)
            self.buckets.append((max(grads[i][2] for i in members), rows, early))
        sizes = [sum(r[3] for r in rows) for _, rows, _ in self.buckets]
        # the averages go up from page-locked host buffers (Context.pinned); ranks of one host exchange the
        # gradients through shared memory, others through MPI (allreduce.make_reducer)
        opts = trainer.ctx.options
        self.reducer = allreduce.make_reducer(trainer.comm, sizes, trainer.ctx, trainer.fp16_gradients,
                                              opts.gradient_transport, opts.reduce_threads)
        # the averages of buckets no launch reads go up on a queue of their own while the backward pass runs on
        self.upload_queue = cl.CommandQueue(trainer.ctx.cl, trainer.ctx.device)
        if trainer.sync_bn:
            self.bn_sync = BatchNormSync(trainer.comm, self.graph, self.plan)
        self.timing = {}

    def _start(self, trainer, arrays, hp):
        q = trainer.ctx.queue
        cl.enqueue_copy(q, trainer.hp_buf, hp, is_blocking=False)
        for (buf, off), a in zip(self.plan.input_locs, arrays):
            cl.enqueue_copy(q, buf, a, dst_offset=off * a.itemsize, is_blocking=False)

    def _enqueue(self, q, launches):
        for i, launch in enumerate(launches):
            launch.enqueue(q)
            if i % 16 == 0:
                q.flush()

    def run(self, trainer, arrays, hp):
        if self.reducer is not None:
            return self.run_data_parallel(trainer, arrays, hp)
        self._start(trainer, arrays, hp)
        self._enqueue(trainer.ctx.queue, self.plan.launches)
        return self._update(trainer)

    def _update(self, trainer, loss_read=None):
        """The update launches, then the loss (and with clipping the gradient's norm, with loss scaling the flag of
        a skipped step) back on the host."""
        q = trainer.ctx.queue
        for launch in self.launches:
            launch.enqueue(q)
        sums = flags = None
        if self.partial is not None and trainer.optimizer.clip_norm:  # the norm costs one small read
            sums = np.empty(self.n_partial, np.float32)
            cl.enqueue_copy(q, sums, self.partial, is_blocking=False)
        if trainer.scaler is not None:
            flags = np.empty(2, np.float32)
            cl.enqueue_copy(q, flags, trainer._state.scale, is_blocking=False)
        if loss_read is None:
            loss = np.empty((), np.float32)
            buf, off = self.plan.output_locs[0]
            cl.enqueue_copy(q, loss, buf, src_offset=off * 4, is_blocking=True)  # the queue is in order: sums too
        else:
            loss = loss_read
            q.finish()
        trainer.grad_norm = None if sums is None else float(np.sqrt(sums.sum(dtype=np.float64)))
        if flags is not None:  # (a skipped step has no norm: its gradients were inf or NaN)
            trainer.grad_norm = None if flags[1] else trainer.grad_norm and trainer.grad_norm / trainer.scaler.scale
            trainer.scaler.update(flags[1] != 0)
        return float(loss)

    def run_data_parallel(self, trainer, arrays, hp):
        """A step of one rank: forward and backward on its shard; each bucket's gradients go to the host on the
        copy queue as soon as the launch that finishes them has run, and its average over the ranks starts while
        the device goes on with the layers before; the averages go back up, then the update launches. Returns the
        loss averaged over the ranks. With sync_bn the launches stop at each BatchNorm point (_advance)."""
        ctx, reducer = trainer.ctx, self.reducer
        q, copy_q = ctx.queue, ctx.copy_queue
        t0 = time.perf_counter()
        self._start(trainer, arrays, hp)
        self.reads, self.started, done = [], 0, 0
        if self.bn_sync is not None:
            self.bn_sync.seconds = 0.0
        for k, (ready, rows, _) in enumerate(self.buckets):
            self._advance(q, done, ready)
            done = ready
            marker = cl.enqueue_marker(q)
            q.flush()
            for buf, off, at, n in rows:
                event = reducer.read(copy_q, k, at, buf, off, n, wait_for=[marker])
            copy_q.flush()
            self.reads.append(event)
        self._advance(q, done, len(self.plan.launches))
        loss = np.empty(1, np.float32)
        buf, off = self.plan.output_locs[0]
        loss_event = cl.enqueue_copy(q, loss, buf, src_offset=off * 4, is_blocking=False)
        q.flush()
        finished, early = [False] * len(self.reads), []

        def upload(k, queue):
            finished[k] = True
            event = reducer.write(k, self.buckets[k][1], queue)
            queue.flush()
            return event

        for k, event in enumerate(self.reads):
            if k >= self.started:
                _wait_polling(event, reducer if k else None)
                reducer.start(k)
            for j in range(k):  # averages already done go up on the upload queue while the backward runs on
                if not finished[j] and self.buckets[j][2] and reducer.done(j):
                    early.append(upload(j, self.upload_queue))
        loss_event.wait()
        backward = time.perf_counter() - t0
        for k in range(len(self.reads)):
            if not finished[k]:
                upload(k, q)
        if early:  # the update launches wait for the upload queue's averages
            cl.enqueue_barrier(q, wait_for=early[-1:])
        self._update(trainer, loss_read=loss[0])
        self.timing = {"forward_backward_s": backward, "step_s": time.perf_counter() - t0,
                       "bucket_s": list(reducer.seconds), "bucket_bytes": [4 * n for n in reducer.sizes],
                       "uploaded_early": len(early), "transport": reducer.transport}
        if self.bn_sync is not None:
            self.timing.update(sync_bn_s=self.bn_sync.seconds, sync_bn_points=len(self.bn_sync.points))
        return float(distributed.average(trainer.comm, loss)[0])

    def _advance(self, q, start, end):
        """Enqueue the launches [start, end). With sync_bn, stop at each BatchNorm point on the way: first start
        the reductions of the buckets whose reads are enqueued (in bucket order, so every rank starts its
        collectives in the same order, a function of the plan), then exchange the layer's statistics."""
        points = self.bn_sync.between(start, end) if self.bn_sync is not None else []
        for point in points:
            self._enqueue(q, self.plan.launches[start:point.at])
            start = point.at
            for k in range(self.started, len(self.reads)):
                _wait_polling(self.reads[k], self.reducer if k else None)
                self.reducer.start(k)
            self.started = len(self.reads)
            self.bn_sync.run(point, q, lambda event: _wait_polling(event, self.reducer if self.started else None))
        self._enqueue(q, self.plan.launches[start:end])

    def download(self, ctx, v):
        a = np.empty(v.shape, v.dtype)
        buf, off = self.plan.lowerer.loc(v)
        cl.enqueue_copy(ctx.queue, a, buf, src_offset=off * a.itemsize, is_blocking=True)
        return a

    def upload(self, ctx, v, array):
        buf, off = self.plan.lowerer.loc(v)
        a = np.ascontiguousarray(array, dtype=v.dtype).reshape(v.shape)
        cl.enqueue_copy(ctx.queue, buf, a, dst_offset=off * a.itemsize, is_blocking=True)

    def release(self, ctx):
        self.plan.release()
        for buf in self.tables:
            ctx.free(buf)
        self.tables = []
        if self.partial is not None:
            ctx.free(self.partial)
            self.partial = None
        if self.reducer is not None:
            self.reducer.close()
        self.reducer = None  # (its pinned buffers unmap as their arrays go)


def _wait_polling(event, reducer):
    """Wait for a device read, letting MPI move the reductions under way on meanwhile (None: nothing under way)."""
    if reducer is not None:
        while event.command_execution_status > 0:  # queued, submitted or running (complete is 0, errors < 0)
            reducer.poll()
            time.sleep(50e-6)
    event.wait()


def _own_initializers(net):
    """torch.onnx.export shares equal tensors through Identity nodes (a fresh BatchNorm's running_var is its
    weight); training updates them separately, so each Identity of an initializer becomes an initializer of its
    own. The inference maths is unchanged."""
    from onnx import numpy_helper
    g = net.model.graph
    inits = {i.name: i for i in g.initializer}
    for node in list(g.node):
        if node.op_type == "Identity" and node.input[0] in inits and node.output[0] not in inits:
            copy = numpy_helper.from_array(numpy_helper.to_array(inits[node.input[0]]).copy(), node.output[0])
            g.initializer.append(copy)
            inits[copy.name] = copy
            g.node.remove(node)
    net.release()


def _initializer_names(net, field, names):
    """The set of `names`, each a float initializer of net's model (else an InputError naming it)."""
    if isinstance(names, str):
        raise InputError(f"Trainer({field}=...): expected a list of initializer names, got the string {names!r}")
    floats = {i.name for i in net.model.graph.initializer if i.data_type in FLOAT_TENSORS}
    for name in names:
        if name not in floats:
            raise InputError(f"Trainer({field}=...): {name!r} is not a float initializer of {net.path}")
    return set(names)


class _StateArena:
    """One device buffer per optimizer slot (exp_avg, exp_avg_sq, momentum_buffer) holding every parameter's
    state at layout[name] = (element offset, elements), and the clipping factor."""

    def __init__(self, ctx, slots, sizes):
        self.ctx = ctx
        self.layout, self.total = {}, 0
        for name, size in sizes.items():
            self.layout[name] = (self.total, size)
            self.total += size
        self.buffers = {}
        for slot in slots:
            buf = ctx.alloc(4 * self.total)
            cl.enqueue_fill_buffer(ctx.queue, buf, np.float32(0), 0, 4 * max(self.total, 1))
            self.buffers[slot] = buf
        self.scale = ctx.alloc(8)  # the gradients' factor, and the flag of a step to skip (optim.cl clip_scale)
        ctx.upload(self.scale, np.array([1, 0], np.float32))

    def release(self):
        for buf in self.buffers.values():
            self.ctx.free(buf)
        self.ctx.free(self.scale)
        self.buffers = {}


class Trainer:
    """trainer = Trainer(net, loss="cross_entropy", optimizer=optim.Adam(lr=1e-3)); trainer.step(feeds) -> loss.

    feeds: the model's input(s) by name and "target" (class indices for cross_entropy/nll, else an array shaped as
    the output). The device copy of the weights is the truth while training; net.state_dict(), net.save_onnx()
    and evaluate() read it back. A step whose loss or grad_norm is NaN or Inf has already applied its update: the
    weights are lost, so a caller stops and goes back to saved ones.

    Which initializers train: `params` (names) if given, else every float initializer that feeds a differentiable
    path to the loss (not BatchNormalization's running statistics; not one read only through integer, boolean or
    piecewise constant ops such as Floor); less those in `frozen`. Exporters make constants (a Pow exponent, an
    epsilon) initializers too: name the weights in `params`, or the constants in `frozen`. An unknown or non-float
    name in either is an InputError.

    Data-parallel (one process per device): `comm=dlnet.distributed.MPI()` in every process of an `mpirun -np N`
    job. Rank 0's weights go to every rank here; each step() takes the rank's shard of the global batch, averages
    the gradients over the ranks in buckets of `bucket_mb` MiB (fp16 on the wire with `fp16_gradients`), applies
    the same update on every rank and returns the loss averaged over the ranks. BatchNormalization normalises by
    each rank's own batch statistics; with `sync_bn=True` by the global batch's, as torch.nn.SyncBatchNorm does
    (its forward statistics and its backward's two per-channel sums exchanged over the ranks: dlnet/sync_bn.py),
    so N ranks on equal shards train as one process on the global batch. check_weights() compares every rank's
    weights with rank 0's.
    """

    def __init__(self, net, loss="cross_entropy", optimizer=None, label_smoothing=0.0, frozen=(), output=None,
                 seed=0, params=None, comm=None, bucket_mb=distributed.BUCKET_MB, fp16_gradients=False,
                 sync_bn=False, loss_scaler=None):
        if loss not in losses.LOSSES:
            raise InputError(f"loss {loss!r}: expected one of {', '.join(losses.LOSSES)}")
        if net.model is None:
            raise ModelError("Trainer(net): load a model first (net.load_onnx)")
        net._check_open()
        _own_initializers(net)
        # (a net of a torch module freezes what the module does not train: dlnet/torch.py from_module)
        self.frozen = _initializer_names(net, "frozen", frozen) | set(getattr(net, "frozen_default", ()))
        self.params = None if params is None else _initializer_names(net, "params", params)
        self.net = net
        self.ctx = net.ctx
        self.loss = loss
        self.optimizer = optimizer if optimizer is not None else SGD(lr=0.01)
        self.label_smoothing = float(label_smoothing)
        self.output = output or net.outputs[0].name
        self.seed = int(seed)
        self.comm = comm if comm is not None else distributed.Single()
        self.bucket_mb, self.fp16_gradients, self.sync_bn = float(bucket_mb), bool(fp16_gradients), bool(sync_bn)
        # fp16 training's dynamic loss scale (a LossScaler; by default on in precision "fp16", False: off)
        self.scaler = loss_scaler or (LossScaler() if loss_scaler is None and self.ctx.dev.half_storage else None)
        self.step_count = 0
        # the gradient's global L2 norm in the last step where clip_norm is set (clipping computes it), else None;
        # with the loss, what tells a diverging run (NaN or Inf) from a healthy one
        self.grad_norm = None
        self.hp_buf = self.ctx.alloc(4 * 16)
        self._state = None  # _StateArena: the optimizer's slots of every trained parameter
        self._pending = {}  # optimizer state loaded before the arena existed
        self._plans = {}
        self._active = None
        self._dirty = False
        self._closed = False
        net._trainer = self
        if self.comm.size > 1:  # every rank starts from rank 0's weights
            weights = self.comm.bcast(net.state_dict() if self.comm.rank == 0 else None)
            if self.comm.rank != 0:
                net.load_state_dict(weights)

    # lifetime ------------------------------------------------------------------------------------------------
    def close(self):
        """Copy the trained weights into the net's model, then release this trainer's device memory (its training
        plans, the optimizer state, the hyper-parameter buffer). Idempotent. The net stays usable (net.run,
        save_onnx); step() and evaluate() raise InputError afterwards."""
        if self._closed:
            return
        self.sync()
        for plan in self._plans.values():
            plan.release(self.ctx)
        self._plans.clear()
        self._active = None
        if self._state is not None:
            self._state.release()
            self._state = None
        self.ctx.free(self.hp_buf)
        self.hp_buf = None
        self._closed = True
        if getattr(self.net, "_trainer", None) is self:
            self.net._trainer = None

    @property
    def closed(self):
        return self._closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _check_open(self):
        if self._closed:
            raise InputError(f"{self.net.path}: this Trainer is closed (close() or its with block released it); "
                             "make a new Trainer to train again")

    # state ---------------------------------------------------------------------------------------------------
    def state_arena(self, names):
        """The optimizer's state (one device buffer per slot, zero at first) with room for every parameter in
        `names`; a parameter keeps its place while the arena lives, so every plan's update launch shares it."""
        arena = self._state
        if arena is not None and all(n in arena.layout for n in names):
            return arena
        keep = self.optimizer_state()
        sizes = {n: size for n, (_, size) in arena.layout.items()} if arena is not None else {}
        inits = {i.name: int(np.prod(i.dims, dtype=np.int64)) for i in self.net.model.graph.initializer}
        for name in names:
            sizes[name] = inits[name]
        if arena is not None:
            arena.release()
        arena = self._state = _StateArena(self.ctx, self.optimizer.slots, sizes)
        self._pending = {}
        self.load_optimizer_state(keep)
        return arena

    def _activate(self, key, shapes):
        plan = self._plans.get(key)
        if plan is None:
            plan = _TrainPlan(self, shapes)
            self._plans[key] = plan
        if self._active is not None and self._active is not plan:
            weights = self._weights_from(self._active)
            for name, v in plan.weights:
                if name in weights:
                    plan.upload(self.ctx, v, weights[name])
        self._active = plan
        return plan

    def _weights_from(self, plan):
        return {name: plan.download(self.ctx, v) for name, v in plan.weights}

    def sync(self):
        """Copy the device weights into the net's model (after training steps)."""
        if self._dirty and self._active is not None:
            self._dirty = False
            self.net.load_state_dict(self._weights_from(self._active), _from_trainer=True)

    def load_weights(self, weights):
        """Upload {name: array} into the device copy (called by net.load_state_dict)."""
        if self._active is not None:
            for name, v in self._active.weights:
                if name in weights:
                    self._active.upload(self.ctx, v, weights[name])

    def optimizer_state(self):
        """{"param/slot": float32 array} of every trained parameter (what load_optimizer_state takes)."""
        out = dict(self._pending)
        arena = self._state
        if arena is None:
            return out
        for slot, buf in arena.buffers.items():
            a = np.empty(max(arena.total, 1), np.float32)
            cl.enqueue_copy(self.ctx.queue, a, buf, is_blocking=True)
            for name, (off, size) in arena.layout.items():
                out[f"{name}/{slot}"] = a[off:off + size].copy()
        return out

    def load_optimizer_state(self, state):
        """Upload what optimizer_state returned; kept on the host until the state arena exists."""
        arena = self._state
        for key, a in state.items():
            name, slot = key.rsplit("/", 1)
            if arena is None or slot not in arena.buffers or name not in arena.layout:
                self._pending[key] = a
                continue
            off, size = arena.layout[name]
            a = np.ascontiguousarray(a, np.float32).reshape(-1)
            if a.size != size:
                raise InputError(f"optimizer state {key}: {a.size} values, the parameter has {size}")
            cl.enqueue_copy(self.ctx.queue, arena.buffers[slot], a, dst_offset=4 * off, is_blocking=True)

    # steps ---------------------------------------------------------------------------------------------------
    def _split(self, feeds):
        if "target" not in feeds:
            raise InputError("trainer feeds need 'target' besides the model's inputs")
        inputs = {k: v for k, v in feeds.items() if k != "target"}
        arrays, shapes = self.net._check_feeds(inputs)
        return arrays, shapes, feeds["target"]

    def step(self, feeds):
        """One optimizer step on one batch; returns the loss (float) of the batch before the update."""
        self._check_open()
        arrays, shapes, target = self._split(feeds)
        key = tuple(shapes[i.name] for i in self.net.inputs)
        plan = self._activate(key, shapes)
        t = losses.host_target(self.loss, target, plan.out.shape, self.label_smoothing)
        by_name = dict(zip([i.name for i in self.net.inputs], arrays))
        by_name[TARGET] = t
        rank = self.comm.rank * 104729  # (0 on one process) each rank's own dropout masks
        by_name[SEED] = np.array([(self.seed * 1000003 + self.step_count * 7919 + 1 + rank) & 0xFFFFFFFF], np.uint32)
        # a step the loss scaler skipped does not count for the optimizer (Adam's t), only for the schedule (torch's)
        h = self.optimizer.hyper(self.step_count - (self.scaler.skipped if self.scaler else 0))
        hp = np.zeros(16, np.float32)
        hp[:len(h)], hp[0] = h, self.optimizer.lr_at(self.step_count)
        if self.scaler is not None:
            hp[LOSS_SCALE_AT] = self.scaler.scale
            by_name[LOSS_SCALE] = np.array(self.scaler.scale, np.float32)
        ordered = [by_name[n] for n in plan.input_names]
        loss = plan.run(self, ordered, hp)
        self.step_count += 1
        self._dirty = True
        return loss

    def check_weights(self, where=None):
        """Data-parallel: raise distributed.RanksDiverged (a DeviceError, on every rank) where some rank's trained
        weights differ from rank 0's; nothing on one process."""
        if self.comm.size == 1:
            return
        self._check_open()
        self.sync()
        names = self._active.params if self._active is not None else []
        weights = self.net.state_dict()
        distributed.check_same(self.comm, {n: weights[n] for n, _, _ in names},
                               where or f"{self.net.path}, step {self.step_count}")

    def evaluate(self, feeds, batch_size=256):
        """{"input": x, "target": y} -> {"loss": mean loss, "accuracy": fraction (class losses)} in inference
        mode (BatchNormalization on running statistics, Dropout off)."""
        self._check_open()
        self.sync()
        name = self.net.inputs[0].name
        x, y = np.asarray(feeds[name]), np.asarray(feeds["target"])
        total, correct, count = 0.0, 0, 0
        for s in range(0, len(x), batch_size):
            xb, yb = x[s:s + batch_size], y[s:s + batch_size]
            out = self.net.run({name: xb})[self.output]
            total += losses.host_loss(self.loss, out, yb, self.label_smoothing) * len(xb)
            if self.loss in ("cross_entropy", "nll") and yb.ndim == 1:
                correct += int((out.argmax(axis=1) == yb).sum())
            count += len(xb)
        result = {"loss": total / max(count, 1)}
        if self.loss in ("cross_entropy", "nll"):
            result["accuracy"] = correct / max(count, 1)
        return result
