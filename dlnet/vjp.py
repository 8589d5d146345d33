"""Forward and backward of a model in one plan, for callers that bring their own loss and optimizer (the PyTorch
bridge's Function and torch.compile backend).

The training form of the model's graph (batch statistics, active Dropout, its float initializers as parameters) gets
one more input per output, dy, and the backward graph of sum(y * dy) with respect to the inputs and parameters asked
for: its gradients are the vector-Jacobian products. One Plan holds both halves, so the activations the backward
half reads stay on the device: `forward` uploads the inputs and runs the launches before the first one that reads a
dy; `backward` uploads the dys and runs the rest.
"""
import numpy as np

from .errors import InputError
from .graph.autodiff import gradients
from .graph.ir import Builder
from .kernels.families.attention import fused_grads
from .kernels.tuner import tune_layers
from .pipeline import training_import, training_passes
from .plan import Plan


class VJPPlan:
    """model (an onnx ModelProto) planned for `shapes` ({input name: shape}); grads for the inputs named in
    `wrt_inputs` and the parameters (float initializers) named in `params` (None: every parameter)."""

    def __init__(self, ctx, model, path, shapes, wrt_inputs=(), params=None):
        g, imp = training_import(model, path, shapes, fused_grads(ctx.dev, ctx.options))
        n_in, n_out = len(g.inputs), len(g.outputs)
        self.input_names, self.output_names = [v.name for v in g.inputs], list(g.output_names)
        unknown = [n for n in wrt_inputs if n not in self.input_names]
        if unknown:
            raise InputError(f"{path}: no input {unknown[0]!r}; the inputs are {self.input_names}")
        values = {n: v for n, v in imp.values.items() if hasattr(v, "const")}  # (not load-time sequences)
        named = {n: v for n, v in values.items() if v.const is not None and v.param}
        self.param_names = [n for n in (named if params is None else params) if n in named]
        b = Builder(g)
        total = None
        for i, y in enumerate(list(g.outputs)):
            dy = g.add_input(f"__dy{i}", y.dtype, y.shape)
            term = b.op("Reduce", [b.op("Mul", [y, dy])], {"mode": "sum", "axes": tuple(range(y.rank)), "keepdims": 0})
            total = term if total is None else b.op("Add", [total, term])
        wrt = [g.inputs[self.input_names.index(n)] for n in wrt_inputs] + [named[n] for n in self.param_names]
        self.wrt_names = list(wrt_inputs) + self.param_names
        grads = gradients(g, total, wrt)
        self.grad_index = {}  # wrt name -> output index (none where the outputs do not depend on it)
        outs, names = list(g.outputs), list(g.output_names)
        for name, gv in zip(self.wrt_names, grads):
            if gv is not None:
                self.grad_index[name] = len(outs)
                outs.append(gv)
                names.append(f"grad:{name}")
        by_id = {v.id: n for n, v in values.items()}
        self.state_names = [by_id.get(s.id) for s, _ in imp.state_updates]  # (running statistics' initializers)
        self.state_values = {n: s for n, (s, _) in zip(self.state_names, imp.state_updates) if n is not None}
        for _, new in imp.state_updates:
            outs.append(new)
            names.append("state")
        g.outputs, g.output_names = outs, names
        self.n_in, self.n_out, self.n_states = n_in, n_out, len(imp.state_updates)
        self.shapes = {v.name: v.shape for v in g.inputs[:n_in]}
        self.grad_shapes = {n: v.shape for n, v in zip(self.wrt_names, wrt)}
        training_passes(g, ctx)
        self.params = {n: named[n] for n in self.param_names}  # (device copies: set_param)
        if ctx.options.tune_layers == "1":  # (DLNET_TUNE_LAYERS=1: each product's tile measured once, kept on disk)
            self.plan, self.plan.tuning = tune_layers(ctx, lambda: Plan(ctx, g, chunk_inputs=False))
        else:
            self.plan = Plan(ctx, g, chunk_inputs=False)
        self.split = self._split(g)

    def _split(self, g):
        """The first launch of a node that reads a dy (directly or not): the forward half ends there."""
        dys = {v.id for v in g.inputs[self.n_in:]}
        reached = set(dys)
        first = None
        for i, node in enumerate(g.nodes):
            if any(v is not None and v.id in reached for v in node.inputs):
                reached |= {v.id for v in node.outputs}
                if first is None:
                    first = i
        if any(v.id in reached for v in g.outputs[:self.n_out]):
            raise InputError("vjp: an output depends on its own gradient input")
        start = self.plan.node_launches[first][0] if first is not None else len(self.plan.launches)
        # every output of the forward half is computed before the split (graph order is topological)
        late = [i for i, node in enumerate(g.nodes) if i >= (first or len(g.nodes)) and
                any(o in g.outputs[:self.n_out] for o in node.outputs)]
        return start if not late else None

    def constant(self, name):
        """The graph value of a parameter or a running statistic, by initializer name."""
        return self.params[name] if name in self.params else self.state_values[name]

    def set_param(self, name, array):
        """A parameter's or running statistic's device copy from a host array (the caller changed it: an optimizer
        step, or the statistics this plan's last backward gave)."""
        self.plan.upload_const(self.constant(name), array)

    def forward(self, arrays):
        """The outputs for these inputs (host arrays in input order), computing what backward needs on the way."""
        for i, a in enumerate(arrays):
            self.plan.upload(i, np.ascontiguousarray(a, dtype=self.plan.graph.inputs[i].dtype))
        if self.split is None:  # (an output computed after a backward node: everything runs in backward)
            self._pending = arrays
            zeros = [np.zeros(v.shape, v.dtype) for v in self.plan.graph.inputs[self.n_in:]]
            return self._run_all(arrays, zeros)[:self.n_out]
        self.plan.run_launches(0, self.split)
        return [self.plan.download(i) for i in range(self.n_out)]

    def _run_all(self, arrays, dys):
        for i, a in enumerate(list(arrays) + list(dys)):
            self.plan.upload(i, np.ascontiguousarray(a, dtype=self.plan.graph.inputs[i].dtype))
        self.plan.run_launches(0, len(self.plan.launches))
        return [self.plan.download(i) for i in range(len(self.plan.graph.outputs))]

    def backward(self, dys):
        """({wrt name: gradient}, [new running statistics]) for output gradients dys (host arrays, output order);
        a name the outputs do not depend on gets zeros."""
        if self.split is None:
            outs = self._run_all(self._pending, dys)
        else:
            for i, dy in enumerate(dys):
                v = self.plan.graph.inputs[self.n_in + i]
                self.plan.upload(self.n_in + i, np.ascontiguousarray(dy, dtype=v.dtype))
            self.plan.run_launches(self.split, len(self.plan.launches))
            outs = {i: self.plan.download(i) for i in range(self.n_out, len(self.plan.graph.outputs))}
        grads = {n: outs[self.grad_index[n]] if n in self.grad_index else np.zeros(self.grad_shapes[n], np.float32)
                 for n in self.wrt_names}
        first_state = len(self.plan.graph.outputs) - self.n_states
        return grads, [outs[i] for i in range(first_state, len(self.plan.graph.outputs))]

    def release(self):
        self.plan.release()
