"""Net: load an ONNX model, plan it per input shape, run it as a loop of enqueues."""
from dataclasses import dataclass

import numpy as np

from .errors import InputError, ModelError
from .graph.memory import MemoryReport, plan_memory
from .graph.printer import format_graph
from .kernels.runtime import Context
from .kernels.schedule import schedule
from .kernels.tuner import tune_layers
from .onnx.common import ONNX_DTYPES
from .onnx.importer import BindInputs, check_supported, graph_io
from .onnx.validate import read_model
from .pipeline import inference_graph
from .plan import MAX_PLANS, Kept, Plan, PlanCache, StagedPlan, value_key


@dataclass
class TensorInfo:
    name: str
    shape: tuple  # ints, or names for symbolic dims
    dtype: str

    def __repr__(self):
        return f"{self.name}: {self.dtype}[{','.join(str(d) for d in self.shape)}]"


class Net:
    """A loaded model. `Net(ctx).load_onnx(path)` then `net.run({name: array})`; `close()` (or the end of a `with`
    block) releases its device memory. max_plans: how many plans (input shapes x values of the inputs that decide
    shapes x output choices) stay on the device; planning one more releases the least recently used."""

    def __init__(self, ctx=None, max_plans=MAX_PLANS):
        self.ctx = ctx if ctx is not None else Context()
        self.path = None
        self.model = None
        self.plans = PlanCache(max_plans)
        self.max_plans = self.plans.limit
        self.value_inputs = set()  # inputs whose values decide shapes: bound as constants, one plan per value
        self._last = None
        self.bound = {}  # symbolic dims bound at load (batch=): the shapes planned at load and input_array's default
        self.tune = False
        self._closed = False
        self.kept = {}  # {input name: Kept value (or a host array, for a model with host steps)}: run(keep=...)

    # loading ------------------------------------------------------------------
    def load_onnx(self, path, batch=None, constants=None, tune=None, base_dir=None):
        """path: a file (str or pathlib.Path), the model's bytes, or an onnx.ModelProto. A model is untrusted: it is
        checked before anything is allocated (dlnet/onnx/validate.py, the caps in dlnet/limits.py), and its external
        data is read only from inside one folder: the file's own, or `base_dir` for bytes or a ModelProto (required
        when it has external data; a name in the model is never a path).
        constants: {input name: array} binds those inputs at load (shapes, axes, pads a model takes as inputs); an
        input left unbound that decides a shape is planned per value it takes at run time (Net._plan).
        tune: measure each layer's GEMM tile on this device when a shape is first planned, where no earlier run
        measured it (tuner.tune_layers; seconds, once: the choices are kept on disk for every later plan);
        "again": measure every layer anew; None: the environment's DLNET_TUNE_LAYERS=1 says so."""
        self.tune = tune if tune is not None else self.ctx.options.tune_layers == "1"
        model, self.path, self._read_files = read_model(path, base_dir)
        if batch is not None and (isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1):
            raise InputError(f"{self.path}: batch={batch!r}: expected an integer >= 1")
        if constants:
            model = _bind_inputs(model, constants, self.path)
        check_supported(model, self.path)
        self.model = model
        ins, outs = graph_io(model, self.path)
        self.inputs = [TensorInfo(n, tuple(s), d) for n, s, d in ins]
        self.outputs = [TensorInfo(n, tuple(s), d) for n, s, d in outs]
        if batch is not None:
            for info in self.inputs:
                if info.shape and isinstance(info.shape[0], str):
                    self.bound[info.shape[0]] = int(batch)
        shapes = self._static_shapes()
        if shapes is not None:
            self._plan(shapes)
        return self

    def _static_shapes(self):
        shapes = {}
        for info in self.inputs:
            dims = [self.bound.get(d, d) if isinstance(d, str) else d for d in info.shape]
            if any(isinstance(d, str) for d in dims):
                return None
            shapes[info.name] = tuple(dims)
        return shapes

    def build_graph(self, shapes, passes=True, outputs=None, values=None):
        return inference_graph(self.model, self.path, shapes, self.ctx, passes, outputs, values)

    def _plan(self, shapes, outputs=None, feeds=None, tie=()):
        """The plan for these input shapes, computing only `outputs` (a tuple of output names in model order, a
        strict subset) or every output (None), with the (output, input) pairs of run(keep=...) tied in memory (`tie`):
        from the cache, else planned now, releasing the least recently used plan beyond max_plans. feeds ({name:
        array}; None at load): the values of the inputs that decide shapes, bound as constants of the plan and part
        of its key; an input found to decide one is added to value_inputs and the plan made again (at load, with no
        values, nothing is planned: None)."""
        self._check_open()
        while True:
            if self.value_inputs and feeds is None:
                return None
            values = {n: feeds[n] for n in sorted(self.value_inputs)} if feeds is not None else None
            key = tuple(shapes[i.name] for i in self.inputs) + value_key(values or {})
            if outputs is not None:
                key = (key, outputs)
            if tie:
                key = (key, "tie", tie)
            try:
                plan = self.plans.get_or_plan(key, lambda: self._new_plan(shapes, outputs, values, tie))
            except BindInputs as e:
                self.value_inputs |= e.names
                continue
            except ModelError as e:
                if not values:
                    raise
                raise InputError(f"{e} (with the values given to input(s) {', '.join(sorted(values))})") from None
            self._last = plan
            return plan

    def _new_plan(self, shapes, outputs, values, tie=()):
        graph = self.build_graph(shapes, outputs=outputs, values=values if values is not None else {})
        if graph.cut is None and self.tune:
            plan, tuning = tune_layers(self.ctx, lambda: Plan(self.ctx, graph, tie=tie), again=self.tune == "again")
            plan.tuning = tuning
            return plan
        if graph.cut is None:
            return Plan(self.ctx, graph, tie=tie)
        # a node runs on the host: the rest is planned at run time, per shape (dlnet/plan.py); every output is made
        return StagedPlan(self.ctx, self.model, self.path, graph,
                          [i.name for i in self.inputs if values is None or i.name not in values],
                          [o.name for o in self.outputs], self.max_plans)

    # running ------------------------------------------------------------------
    def _check_feeds(self, feeds):
        """(arrays in input order, {input name: shape}). A symbolic dim takes the size the feeds give it, the same
        in every input; a batch bound at load is only the default (another batch plans another shape)."""
        self._check_open()
        if not isinstance(feeds, dict):
            raise InputError(f"{self.path}: run() takes a dict {{input name: array}}, got {type(feeds).__name__}")
        names = [i.name for i in self.inputs]
        unknown = [k for k in feeds if k not in names]
        if unknown:
            raise InputError(f"{self.path}: unknown input {unknown[0]!r}; the model's inputs are {names}")
        feeds = {**{n: k for n, k in self.kept.items() if n not in feeds}, **feeds}
        missing = [n for n in names if n not in feeds]
        if missing:
            raise InputError(f"{self.path}: missing input {missing[0]!r}; the model's inputs are {names}")
        arrays, shapes, binding = [], {}, {}
        for info in self.inputs:
            a = feeds[info.name] if isinstance(feeds[info.name], Kept) else np.asarray(feeds[info.name])
            if info.dtype == "object" and a.dtype.kind == "U":  # a string input: numpy's str arrays are fine too
                a = a.astype(object)
            if a.dtype != np.dtype(info.dtype):
                if a.dtype.kind == np.dtype(info.dtype).kind == "f" or (a.dtype.kind in "iu" and
                                                                        np.dtype(info.dtype).kind in "iu"):
                    raise InputError(f"{self.path}: input {info.name!r} has dtype {a.dtype}, expected {info.dtype} "
                                     f"(convert with .astype(np.{info.dtype}))")
                raise InputError(f"{self.path}: input {info.name!r} has dtype {a.dtype}, expected {info.dtype}")
            where = " (kept on the device from an earlier run)" if isinstance(a, Kept) else ""
            if a.ndim != len(info.shape):
                raise InputError(f"{self.path}: input {info.name!r}{where} has shape {list(a.shape)}, expected rank "
                                 f"{len(info.shape)} {list(info.shape)}")
            for d, want in zip(a.shape, info.shape):
                if isinstance(want, str):
                    binding.setdefault(want, d)
                    if binding[want] != d:
                        raise InputError(f"{self.path}: dimension {want!r} is {binding[want]} in one input and {d} "
                                         f"in {info.name!r}{where}")
                elif d != want:
                    raise InputError(f"{self.path}: input {info.name!r}{where} has shape {list(a.shape)}, expected "
                                     f"{list(info.shape)}")
            # (ascontiguousarray makes a 0-d array 1-d)
            arrays.append(a if isinstance(a, Kept) or a.flags.c_contiguous else a.copy())
            shapes[info.name] = a.shape
        return arrays, shapes

    def input_array(self, name, shape=None):
        """A zeroed host array for input `name` in pinned (page-locked) memory: fill it, pass it to run(), and its
        copy to the device runs at the bus's full speed (Context.pinned). `shape` is needed only where the input
        has dimensions that are neither fixed nor bound at load."""
        self._check_open()
        info = next((i for i in self.inputs if i.name == name), None)
        if info is None:
            raise InputError(f"{self.path}: input_array: unknown input {name!r}; the model's inputs are "
                             f"{[i.name for i in self.inputs]}")
        if shape is None:
            shape = tuple(self.bound.get(d, d) if isinstance(d, str) else d for d in info.shape)
            if any(isinstance(d, str) for d in shape):
                raise InputError(f"{self.path}: input_array: input {name!r} has shape {list(info.shape)}; pass "
                                 f"shape= with the symbolic dimensions filled in")
        shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in shape) or len(shape) != len(info.shape):
            raise InputError(f"{self.path}: input_array: input {name!r} cannot have shape {list(shape)} (expected "
                             f"{len(info.shape)} dims >= 0, {list(info.shape)})")
        return self.ctx.pinned(shape, info.dtype)

    def run(self, feeds, outputs=None, keep=None):
        """{input name: ndarray} -> {output name: ndarray}, in graph-output order; with `outputs` (output names),
        those only, in that order: their plan drops the work only the other outputs need and copies back only these
        (a model with host steps computes every output). Arrays from input_array() upload fastest.

        keep: {output name: input name}: those outputs stay on the device, in `net.kept[input name]`, and a later
        run that is not given that input reads them there, copied device to device, never through the host (a KV
        cache from one decoding step to the next). A kept output is not downloaded unless `outputs` names it. A kept
        value feeds one run (given the input, a run drops it); `drop_kept()` releases them all. The plan of a run with
        `keep` computes each kept output over its input's place where its node may write over it (elementwise), so the
        next run of that plan copies nothing."""
        if self.model is None:
            raise ModelError("run() before load_onnx()")
        self._check_open()
        every = [o.name for o in self.outputs]
        keep = self._check_keep(keep, every)
        wanted = self._wanted(outputs, every)
        arrays, shapes = self._check_feeds(feeds)
        self.drop_kept([n for n in feeds if n in self.kept])  # given anew (before the run, which would move them)
        used = list(self.kept)
        wanted_here = wanted if wanted is not None else [n for n in every if n not in keep]
        subset = tuple(n for n in every if n in wanted_here or n in keep)
        names = [i.name for i in self.inputs]
        plan = self._plan(shapes, subset if len(subset) < len(every) else None, dict(zip(names, arrays)),
                          tuple(sorted(keep.items())))
        made = every if isinstance(plan, StagedPlan) else subset
        given = [a for n, a in zip(names, arrays) if n not in self.value_inputs]  # (the rest are the plan's constants)
        if isinstance(plan, StagedPlan):  # (host steps: values cross the host anyway; kept ones are kept there)
            outs = dict(zip(made, plan.run([a.numpy() if isinstance(a, Kept) else a for a in given])))
        else:
            outs = dict(zip(made, plan.run(given, keep={made.index(n) for n in keep})))
        self.drop_kept(used)
        for out_name, in_name in keep.items():
            self.kept[in_name] = outs[out_name]
        return {n: outs[n].numpy() if isinstance(outs[n], Kept) else outs[n] for n in wanted_here}

    def _check_keep(self, keep, every):
        """run()'s `keep` checked: {output name: input name of the same dtype}, each input named once."""
        if not keep:
            return {}
        if not isinstance(keep, dict):
            raise InputError(f"{self.path}: run(keep=...) takes a dict {{output name: input name}}, got "
                             f"{type(keep).__name__}")
        ins = {i.name: i for i in self.inputs}
        outs = {o.name: o for o in self.outputs}
        for out_name, in_name in keep.items():
            if out_name not in outs:
                raise InputError(f"{self.path}: run(keep=...): unknown output {out_name!r}; the model's outputs are "
                                 f"{every}")
            if in_name not in ins:
                raise InputError(f"{self.path}: run(keep=...): output {out_name!r} is kept for unknown input "
                                 f"{in_name!r}; the model's inputs are {list(ins)}")
            if outs[out_name].dtype != ins[in_name].dtype:
                raise InputError(f"{self.path}: run(keep=...): output {out_name!r} is {outs[out_name].dtype}, input "
                                 f"{in_name!r} expects {ins[in_name].dtype}")
        if len(set(keep.values())) < len(keep):
            raise InputError(f"{self.path}: run(keep=...): an input is named twice in {keep}")
        return dict(keep)

    def drop_kept(self, names=None):
        """Release kept values: those for these input names, or all."""
        for name in list(self.kept) if names is None else names:
            k = self.kept.pop(name, None)
            if isinstance(k, Kept):
                k.release()

    def _wanted(self, outputs, every):
        """run()'s `outputs` checked: None, or a list of the model's output names (duplicates dropped)."""
        if outputs is None:
            return None
        if isinstance(outputs, str):
            outputs = [outputs]
        wanted = list(dict.fromkeys(outputs))
        unknown = [n for n in wanted if n not in every]
        if unknown:
            raise InputError(f"{self.path}: run(outputs=...): unknown output {unknown[0]!r}; the model's outputs are "
                             f"{every}")
        return wanted

    # inspection ---------------------------------------------------------------
    @property
    def graph(self):
        """The typed IR after passes (of the last plan; unbound dims shown with size 1)."""
        if self._last is not None:
            return _Printable(self._last.graph, self._last.memory)
        shapes = {i.name: tuple(1 if isinstance(d, str) else d for d in i.shape) for i in self.inputs}
        g = schedule(self.build_graph(shapes), self.ctx)  # (each node's algorithm; tiles are chosen when planned)
        g.notes.append("symbolic dims unbound: shown with size 1")
        return _Printable(g, None)

    @property
    def launches(self):
        """The bound kernel launches of the last plan, in order (each has .label, .layer and .enqueue(queue))."""
        return list(self._last.launches) if self._last is not None else []

    @property
    def memory(self):
        if self._last is None:
            shapes = {i.name: tuple(1 if isinstance(d, str) else d for d in i.shape) for i in self.inputs}
            mem = plan_memory(self.build_graph(shapes))
        else:
            mem = self._last.memory
        lw = getattr(self._last, "lowerer", None)
        work = sum(b.size for b in list(lw.scratch.values()) + lw.keepalive) if lw is not None else 0
        return MemoryReport(mem.act_bytes, mem.const_bytes, mem.naive_act_bytes, work)

    def release(self):
        """Release every plan's device memory; the net stays usable and plans again on the next run."""
        self.plans.release()
        self._last = None

    def close(self):
        """Release this net's device memory for good: its plans and a Trainer's (which first copies its weights into
        the model). Idempotent. The model stays on the host (inputs, outputs, state_dict(), save_onnx()); run(),
        input_array() and Trainer(net) raise InputError afterwards."""
        trainer = getattr(self, "_trainer", None)
        if trainer is not None:
            trainer.close()
        self.drop_kept()
        self.release()
        self._closed = True

    @property
    def closed(self):
        return self._closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _check_open(self):
        if self._closed:
            raise InputError(f"{self.path}: this Net is closed (close() or its with block released it); load the "
                             "model into a new Net to run it")

    # weights ------------------------------------------------------------------
    def state_dict(self):
        """{initializer name: numpy array}: the current weights (a trainer's device copy when one trains them)."""
        from onnx import numpy_helper
        trainer = getattr(self, "_trainer", None)
        if trainer is not None:
            trainer.sync()
        return {i.name: numpy_helper.to_array(i).copy() for i in self.model.graph.initializer}

    def load_state_dict(self, weights, _from_trainer=False):
        """Replace initializers by name (shapes must match); plans are rebuilt on the next run. Takes arrays or torch
        tensors; a net of a torch module (dlnet.torch.from_module) skips the module's entries the export dropped
        (BatchNorm's num_batches_tracked)."""
        from onnx import numpy_helper
        inits = {i.name: i for i in self.model.graph.initializer}
        torch_names = getattr(self, "torch_params", None)
        loaded = {}
        for name, a in weights.items():
            if name not in inits:
                if torch_names is not None:
                    continue
                raise InputError(f"{self.path}: load_state_dict: no initializer {name!r}")
            old = numpy_helper.to_array(inits[name])
            a = np.asarray(a.detach().cpu()) if hasattr(a, "detach") else np.asarray(a)
            if a.shape != old.shape:
                raise InputError(f"{self.path}: load_state_dict: {name!r} has shape {list(a.shape)}, "
                                 f"expected {list(old.shape)}")
            inits[name].CopyFrom(numpy_helper.from_array(a.astype(old.dtype), name))
            loaded[name] = a
        self.release()
        trainer = getattr(self, "_trainer", None)
        if trainer is not None and not _from_trainer:
            trainer.load_weights(loaded)

    def save_onnx(self, path):
        """Write the model with the current weights as a standard ONNX inference model: to a temp file beside `path`,
        then renamed into place (removed on any error). Never over a file the model was read from."""
        import os
        import secrets

        import onnx
        if self.model is None:
            raise ModelError("save_onnx() before load_onnx()")
        path = os.fspath(path)
        if os.path.realpath(path) in getattr(self, "_read_files", ()):
            raise InputError(f"{path}: save_onnx will not write over the file the model was read from")
        self.state_dict()
        folder, base = os.path.split(os.path.abspath(path))
        tmp = os.path.join(folder, f".{base}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except OSError as e:
            raise InputError(f"{path}: cannot write in {folder} ({e.strerror})") from None
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(self.model.SerializeToString())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException as e:
            os.unlink(tmp)
            if isinstance(e, OSError):
                raise InputError(f"{path}: could not be written ({e.strerror or e})") from None
            if isinstance(e, ValueError):  # protobuf: one message holds less than 2 GiB
                raise ModelError(f"{path}: the model cannot be written as one ONNX file ({e})") from None
            raise
        return onnx.load(path) is not None


def _bind_inputs(model, constants, path):
    """A copy of `model` whose inputs named in `constants` are initializers holding those arrays (each of the
    input's declared dtype)."""
    from onnx import ModelProto, numpy_helper
    if not isinstance(constants, dict):
        raise InputError(f"{path}: constants must be a dict {{input name: array}}, got {type(constants).__name__}")
    names = {i.name for i in model.graph.input}
    unknown = [k for k in constants if k not in names]
    if unknown:
        raise InputError(f"{path}: constants names unknown input {unknown[0]!r}; "
                         f"the model's inputs are {sorted(names)}")
    bound = ModelProto()
    bound.CopyFrom(model)
    kept = [i for i in bound.graph.input if i.name not in constants]
    del bound.graph.input[:]
    bound.graph.input.extend(kept)
    inits = [i for i in bound.graph.initializer if i.name not in constants]
    del bound.graph.initializer[:]
    bound.graph.initializer.extend(inits)
    declared = {i.name: ONNX_DTYPES.get(i.type.tensor_type.elem_type) for i in model.graph.input}
    for name, array in constants.items():
        a = np.asarray(array)
        if declared[name] not in (None, "object") and a.dtype != np.dtype(declared[name]):
            raise InputError(f"{path}: constants: input {name!r} is {declared[name]}, given {a.dtype}")
        try:
            bound.graph.initializer.append(numpy_helper.from_array(a, name))
        except Exception as e:  # (a dtype ONNX has no type for)
            raise InputError(f"{path}: constants: input {name!r} cannot be stored ({e})") from None
    return bound


class _Printable:
    """The graph, printed with its memory plan."""

    def __init__(self, graph, plan):
        self.ir = graph
        self.plan = plan

    def __getattr__(self, name):
        return getattr(self.ir, name)

    def __str__(self):
        return format_graph(self.ir, self.plan)

    __repr__ = __str__
