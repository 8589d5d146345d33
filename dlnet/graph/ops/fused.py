"""A chain of pointwise nodes run as one generated kernel."""
from .base import REQUIRED, Op, register


@register
class Fused(Op):
    """y = f_n(...f_1(x...)) : the pointwise nodes in attrs['nodes'], in order; the last one's output is y (a
    Transpose member reads its input through permuted strides: passes/transposes.py)"""
    name = "Fused"
    attrs = {"nodes": REQUIRED}
    inplace = True

    def infer(self, node):
        last = node.attrs["nodes"][-1].outputs[0]
        return [(last.dtype, last.shape)]

    def writes_over(self, node, index):  # (not over an input read transposed: other indices than y's)
        x = node.inputs[index]
        return not any(m.op == "Transpose" and m.inputs[0] is x for m in node.attrs["nodes"])

    def lower(self, node, lw):
        lw.pointwise(node.attrs["nodes"])
