"""Models with host steps: device graphs split at ONNX nodes that run on the host, each later part planned per shape.

A node whose output shapes depend on its input values (NonZero, Unique, NonMaxSuppression, ...) or that reads
strings cannot be planned ahead. The importer ends the graph before it (`graph.cut`); at run time the part before
runs on the device, the values the rest reads come back to the host, the node runs there through its ops' NumPy
forms (the code that folds them at load), and the rest of the model is imported from the next node with those
arrays as its inputs, planned once per set of shapes and cached like any plan. Every shape is a true one.
"""
import numpy as np

from .graph.memory import plan_memory
from .graph.passes import run_passes
from .kernels.lowering import device_passes
from .onnx.common import Cut  # noqa: F401  (re-exported: the importer makes Cuts, in onnx.common)


class StagedPlan:
    """A graph that ends in a cut: its device plan, then the host step, then the rest (a StagedPlan per set of
    run-time shapes; the last one's cut has no host step)."""

    def __init__(self, ctx, model, path, graph, input_names, output_names):
        from .net import Plan
        self.ctx, self.model, self.path = ctx, model, path
        self.graph = graph
        self.input_names, self.output_names = input_names, output_names
        self.head = Plan(ctx, graph) if graph.nodes else None
        self.memory = self.head.memory if self.head is not None else plan_memory(graph)
        self.launches = self.head.launches if self.head is not None else []
        self.rest = {}  # (name, dtype, shape) of the rest's inputs -> its plan

    def run(self, arrays):
        """Plan's contract: the model's inputs in order in, its outputs out."""
        env = dict(zip(self.input_names, arrays))
        self.run_env(env)
        return [np.asarray(env[n]) for n in self.output_names]

    def run_env(self, env):
        """Run this part and everything after it; `env` ({ONNX name: array}) gains every value they compute."""
        from .onnx.importer import Importer
        g, cut = self.graph, self.graph.cut
        if self.head is not None:
            env.update(zip(g.output_names, self.head.run([np.ascontiguousarray(env[v.name]) for v in g.inputs])))
        for name, src in cut.aliases.items():
            env[name] = env[src]
        env.update(cut.consts)
        if cut.index is None:
            return
        env.update(Importer(self.model, self.path).run_host(cut.index, env))
        later = _later_names(self.model, cut.index + 1)
        inputs = {n: env[n] for n in sorted(later) if n in env and n not in cut.consts}
        key = tuple((n, a.dtype.str, a.shape) for n, a in inputs.items())
        rest = self.rest.get(key)
        if rest is None:
            types = {n: (a.dtype, a.shape) for n, a in inputs.items()}
            consts = {n: a for n, a in cut.consts.items() if n in later}
            graph = Importer(self.model, self.path).build_stage(cut.index + 1, types, consts)
            device_passes(run_passes(graph), self.ctx)
            rest = StagedPlan(self.ctx, self.model, self.path, graph, list(inputs), self.output_names)
            self.rest[key] = rest
        rest.run_env(env)

    def release(self):
        if self.head is not None:
            self.head.release()
        for rest in self.rest.values():
            rest.release()
        self.rest = {}


def _later_names(model, start):
    from .onnx.importer import _names_read
    return _names_read(model.graph.node[start:]) | {o.name for o in model.graph.output}
