"""The op registry. Each op is one class: inputs/attributes, type inference, numpy folding, lowering, gradient."""
from ...errors import ModelError

OPS = {}


class Op:
    """Base of every op. Subclasses set `name` (registry key) and override what they support."""
    name = None
    kind = "kernel"  # "pointwise" (fusable elementwise), "alias" (reshape-like view), "kernel"
    numpy = None  # (node, *arrays) -> list of arrays: folding at build time; None = never folded
    inplace = False  # reads every same-shaped input at the output's own index: may write over it
    dtypes = None  # dtypes of the first input its kernels take (None: any); checked when the node is built

    def infer(self, node):
        """[(dtype, shape)] of the outputs."""
        raise NotImplementedError

    def workspace(self, node):
        """(bytes it could use, least bytes it needs) of scratch the node's kernels want inside the activation
        arena while it runs, or None. The planner gives it all where a free block holds it, else what fits."""
        return None

    def writes_over(self, node, index):
        """May the output be written over input `index` (same shape; the planner checks that)?"""
        return self.inplace

    def lower(self, node, lw):
        raise ModelError(f"node {node.name} ({node.op}): no kernel lowering")

    def grad(self, b, node, dys):
        """Gradient nodes built with Builder `b`: a list with one value (or None) per input."""
        return None


def register(cls):
    inst = cls()
    OPS[cls.name or cls.__name__] = inst
    return cls


def get_op(name):
    op = OPS.get(name)
    if op is None:
        raise ModelError(f"unknown IR op {name!r}")
    return op


def _load_families():
    # registration side effects
    from . import elementwise, shape, nn, linalg, reduce, fused, grad_nn, host  # noqa: F401


_load_families()
