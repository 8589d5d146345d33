"""LayerNorm with its statistics: LayerNormalization-17's optional Mean and InvStdDev outputs."""
import numpy as np

from .base import Op, register
from .nn import LayerNorm


@register
class LayerNormStats(LayerNorm):
    """y, mean, inv = LayerNorm(x, scale, bias) over the last axis, mean and 1 / sqrt(var + eps) of each row kept
    (float32, shape x.shape[:-1] + [1]); one kernel, as LayerNorm's. No gradient rule yet."""
    name = "LayerNormStats"

    def infer(self, node):
        (dtype, shape), = super().infer(node)
        stats = ("float32", shape[:-1] + (1,))
        return [(dtype, shape), stats, stats]

    def numpy(self, node, x, scale, bias):
        x32 = x.astype(np.float32)
        mean = x32.mean(axis=-1, keepdims=True)
        d = x32 - mean
        inv = 1 / np.sqrt((d * d).mean(axis=-1, keepdims=True) + np.float32(node.attrs["epsilon"]))
        return [(d * inv * scale + bias).astype(x.dtype), mean, inv]

    grad = Op.grad  # (not LayerNorm's, which knows nothing of the statistics outputs)
