"""GridSample's kernels (gridsample.cl): the forward and its gradient."""
import numpy as np

from ..emitter import defines
from ..runtime import kernel_source

MODES = {"nearest": 0, "linear": 1, "cubic": 2}
PADDING = {"zeros": 0, "border": 1, "reflection": 2}


class SamplingFamily:
    def gridsample(self, node):
        x, grid = node.inputs
        y, a = node.outputs[0], node.attrs
        r = x.rank - 2
        src = defines({"R": r, "MODE": MODES[a["mode"]], "PAD": PADDING[a["padding_mode"]],
                       "ALIGN": int(bool(a["align_corners"]))}) + kernel_source("gridsample")
        args = self.args(x) + self.args(grid) + self.args(y) + [
            self.meta(list(x.shape[2:]) + list(y.shape[2:]), np.int32), np.int32(x.shape[1]), np.int64(y.size)]
        self.emit(src, "gridsample", args, (max(y.size, 1),), None, f"{node.name} GridSample")

    def gridsample_grad(self, node):
        dy, x, grid = node.inputs
        dx, dgrid = node.outputs
        a = node.attrs
        src = defines({"R": x.rank - 2, "MODE": MODES[a["mode"]], "PAD": PADDING[a["padding_mode"]],
                       "ALIGN": int(bool(a["align_corners"]))}) + kernel_source("gridsample")
        self.fill(dx, 0)
        positions = grid.size // max(grid.shape[-1], 1)
        args = self.args(dy) + self.args(x) + self.args(grid) + self.args(dx) + self.args(dgrid) + [
            self.meta(list(x.shape[2:]) + list(dy.shape[2:]), np.int32), np.int32(x.shape[1]), np.int64(positions)]
        self.emit(src, "gridsample_grad", args, (max(positions, 1),), None, f"{node.name} GridSampleGrad")
