"""GridSample: interpolation at positions a grid gives (op-sets 16 and 20), one kernel (gridsample.cl)."""
from .base import REQUIRED, Op, register


@register
class GridSample(Op):
    """y[n, c, o] = x[n, c] interpolated (nearest, linear, cubic) at grid[n, o] (normalised to [-1, 1], innermost
    spatial dim first), padding zeros / border / reflection; no gradient rule yet"""
    name = "GridSample"
    dtypes = ("float32",)
    attrs = {"mode": REQUIRED, "padding_mode": "zeros", "align_corners": 0}  # mode: nearest, linear or cubic

    def infer(self, node):
        x, grid = node.inputs
        r = x.rank - 2
        if not 1 <= r <= 3 or grid.rank != r + 2 or grid.shape[0] != x.shape[0] or grid.shape[-1] != r:
            raise ValueError(f"GridSample takes x [N, C, {r} spatial dims] (1 to 3) and grid [N, ..., {r}], got "
                             f"{list(x.shape)} and {list(grid.shape)}")
        return [(x.dtype, x.shape[:2] + grid.shape[1:-1])]

    def lower(self, node, lw):
        lw.gridsample(node)
