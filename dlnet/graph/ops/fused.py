"""A chain of pointwise nodes run as one generated kernel."""
from .base import REQUIRED, Op, register


@register
class Fused(Op):
    """y = f_n(...f_1(x...)) : the pointwise nodes in attrs['nodes'], in order; the last one's output is y"""
    name = "Fused"
    attrs = {"nodes": REQUIRED}
    inplace = True

    def infer(self, node):
        last = node.attrs["nodes"][-1].outputs[0]
        return [(last.dtype, last.shape)]

    def lower(self, node, lw):
        lw.pointwise(node.attrs["nodes"])
