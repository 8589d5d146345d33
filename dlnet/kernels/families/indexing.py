"""Indexing kernels: Gather and its gradient, Pad, GatherElements (and its gradient) and ScatterElements."""
import numpy as np

from ...errors import ModelError
from .. import half
from ..emitter import defines
from ..half import half_defines


class IndexFamily:
    HALF_IO = {"Gather": half.HalfIO((0,), True)}  # (gather.cl: the table and y; the indices are integers)

    def alias(self, y, x):
        pass  # a view: the memory plan gave y x's place, in the weight arena where x is a weight

    def gather(self, node):
        x, idx = node.inputs
        y = node.outputs[0]
        axis = node.attrs["axis"] % x.rank
        inner = int(np.prod(x.shape[axis + 1:], dtype=np.int64))
        args = self.args(y) + self.args(x) + self.args(idx) + [np.int64(max(idx.size, 1)), np.int64(x.shape[axis]),
                                                               np.int64(inner), np.int64(y.size)]
        halves = half_defines(X=x, Y=y)  # (precision "fp16": half loaded and stored, float in between)
        src = defines(halves) + self._typed("gather", "float32" if halves else x.dtype, idx.dtype)
        self.emit(src, "gather", args, (max(y.size, 1),), None, f"{node.name} Gather")

    def gather_grad(self, node):
        """dx[o, k, in] = the sum of dy[o, j, in] over the j with idx[j] == k, in increasing j (deterministic): each
        element scanning every index (gather_grad), or, where that costs 4x more than following each value's chain
        of occurrences, gather.cl's links, zero and sum kernels."""
        dy, idx = node.inputs
        dx = node.outputs[0]
        axis = node.attrs["axis"] % dx.rank
        inner = int(np.prod(dx.shape[axis + 1:], dtype=np.int64))
        n, axis_len = max(idx.size, 1), dx.shape[axis]
        src, label = self._typed("gather", dx.dtype, idx.dtype), f"{node.name} GatherGrad"
        head = self.args(dx) + self.args(dy) + self.args(idx) + [np.int64(n), np.int64(axis_len), np.int64(inner)]
        sums = dx.size // max(axis_len, 1) * n  # (o, j, in) work-items of gather_grad_sum
        if n < 2 or n * n + dx.size + sums >= dx.size * n / 4:
            self.emit(src, "gather_grad", head + [np.int64(dx.size)], (max(dx.size, 1),), None, label)
            return
        self.emit(src, "gather_grad_links", self.args(idx) + [np.int64(n), np.int64(axis_len)] + [self.dummy()[0]],
                  (n,), None, label + " links")
        self.use_scratch(self.launches[-1].kernel, 4, 8 * n, "gather")
        self.emit(src, "gather_grad_zero", self.args(dx) + [np.int64(dx.size)], (dx.size,), None, label + " zero")
        self.emit(src, "gather_grad_sum", head + [np.int64(sums), self.dummy()[0]], (sums,), None, label)
        self.use_scratch(self.launches[-1].kernel, len(head) + 1, 8 * n, "gather")

    def pad(self, node):
        x, y = node.inputs[0], node.outputs[0]
        pads = node.attrs["pads"]
        r = x.rank
        mode = {"constant": 0, "reflect": 1, "edge": 2, "wrap": 3}[node.attrs.get("mode", "constant")]
        if any(p < 0 for p in pads):
            raise ModelError(f"node {node.name} (Pad): negative pads are not supported")
        src = self._typed("pad", x.dtype).replace("#define T", f"#define MODE {mode}\n#define T", 1)
        value = np.asarray(node.attrs.get("value", 0)).astype(x.dtype if x.dtype != "bool" else "uint8")
        args = self.args(y) + self.args(x) + [self.meta(list(y.shape) + list(x.shape) + list(pads[:r])),
                                              np.int32(r), value[()] if value.ndim else value]
        if self.dev.is_cpu and r > 0 and y.size:
            rows = y.size // y.shape[-1]
            self.emit(src, "pad_rows", args + [np.int64(rows)], (rows,), None, f"{node.name} Pad")
        else:
            self.emit(src, "pad", args + [np.int64(y.size)], (max(y.size, 1),), None, f"{node.name} Pad")

    def _elements_meta(self, node, x, idx):
        return self.meta(list(idx.shape) + self.strides(x)), np.int32(x.rank), np.int32(node.attrs["axis"]), \
            np.int64(x.shape[node.attrs["axis"]])

    def gather_elements(self, node):
        x, idx = node.inputs
        y = node.outputs[0]
        if x.dtype == "float16":
            raise ModelError(f"node {node.name} ({node.op}): float16 is not supported")
        meta, rank, axis, n = self._elements_meta(node, x, idx)
        args = self.args(y) + self.args(x) + self.args(idx) + [meta, rank, axis, n, np.int64(y.size)]
        self.emit(self._typed("gather_elements", x.dtype, idx.dtype), "gather_elements", args, (max(y.size, 1),),
                  None, f"{node.name} {node.op}")

    def gather_elements_grad(self, node):
        dy, idx = node.inputs
        dx = node.outputs[0]
        if dx.dtype == "float16":
            raise ModelError(f"node {node.name} ({node.op}): float16 is not supported")
        args = self.args(dx) + self.args(dy) + self.args(idx) + [self.meta(list(dx.shape) + list(idx.shape)),
                                                                  np.int32(dx.rank), np.int32(node.attrs["axis"]),
                                                                  np.int64(dx.size)]
        self.emit(self._typed("gather_elements", dx.dtype, idx.dtype), "gather_elements_grad", args,
                  (max(dx.size, 1),), None, f"{node.name} {node.op}")

    def scatter_elements(self, node):
        x, idx, upd = node.inputs
        y = node.outputs[0]
        if x.dtype == "float16":
            raise ModelError(f"node {node.name} ({node.op}): float16 is not supported")
        ys = self.strides(y)
        self._elementwise(y, 0, ys, [(x, 0, ys)], "r0 = x0v;", f"{node.name} copy")
        meta, rank, axis, n = self._elements_meta(node, x, idx)
        red = node.attrs.get("reduction", "none")
        src = self._typed("gather_elements", x.dtype, idx.dtype)
        if red != "none":
            src = f"#define RED_{red.upper()} 1\n" + src
        args = self.args(y) + self.args(upd) + self.args(idx) + [meta, rank, axis, n, np.int64(idx.size)]
        self.emit(src, "scatter_elements", args, (1,), None, f"{node.name} {node.op}")
