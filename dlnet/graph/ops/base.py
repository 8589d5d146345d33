"""The op registry's base: Op (inputs, attributes with defaults, inference, folding, gradient), register, get_op."""
from ...errors import ModelError

OPS = {}


class _Required:
    def __repr__(self):
        return "REQUIRED"


REQUIRED = _Required()  # an attribute with no default: whoever builds the node gives it


def ones(nsp):
    """One per spatial axis: the default strides and dilations."""
    return (1,) * nsp


def zero_pads(nsp):
    """Zero begins then zero ends, one per spatial axis: the default pads."""
    return (0,) * (2 * nsp)


class Op:
    """Base of every op. Subclasses set `name` (registry key) and override what they support."""
    name = None
    # every attribute -> its default, filled into a node where absent when the node is made (ir.Node), so that code
    # reads node.attrs["strides"] directly (onnx's reference evaluator's _load_attributes). A default is a value, a
    # function of the node's spatial rank (its first input's rank - 2: ones, zero_pads), or REQUIRED.
    attrs = {}
    # attributes passes add (a fused epilogue, a weight layout, ...) -> what their absence means. Never filled: the
    # printer and the passes tell a set one from an absent one, so they are read with .get().
    pass_attrs = {}
    kind = "kernel"  # "pointwise" (fusable elementwise), "alias" (reshape-like view), "kernel"
    numpy = None  # (node, *arrays) -> list of arrays: folding at build time; None = never folded
    inplace = False  # reads every same-shaped input at the output's own index: may write over it
    dtypes = None  # dtypes of the first input its kernels take (None: any); checked when the node is built
    # False: piecewise constant (Floor, Sign, ...): its gradient is zero wherever it exists, as PyTorch gives, so
    # autodiff does not follow a path through it (a weight read only there feeds no differentiable path)
    differentiable = True

    def filled_attrs(self, attrs, inputs):
        """A copy of `attrs` with every declared default that is absent filled in."""
        out = dict(attrs)
        for key, default in self.attrs.items():
            if key in out or default is REQUIRED:
                continue
            if callable(default):
                if not inputs or inputs[0] is None:
                    continue  # no spatial rank to size it by
                default = default(inputs[0].rank - 2)
            out[key] = default
        return out

    def infer(self, node):
        """[(dtype, shape)] of the outputs."""
        raise NotImplementedError

    def writes_over(self, node, index):
        """May the output be written over input `index` (same shape; the planner checks that)?"""
        return self.inplace

    def view_offset(self, node):
        """An alias op's output: the element of its input it starts at (SliceView's offset, ColumnView's column; 0
        for a Reshape)."""
        return 0

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
