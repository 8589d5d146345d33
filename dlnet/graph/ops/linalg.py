"""Matrix products."""
import numpy as np

from .base import Op, register


@register
class Gemm(Op):
    """y = act(alpha * op(A) @ op(B) + beta * C), batched over leading dims with numpy broadcasting.

    op(X) = X^T when transA/transB; C (optional) broadcasts to the output. MatMul is Gemm without C.
    dA = dy @ B^T, dB = A^T @ dy (built by autodiff through this same op).
    """
    name = "Gemm"
    dtypes = ("float32",)
    attrs = {"transA": 0, "transB": 0, "alpha": 1.0, "beta": 1.0}
    pass_attrs = {"act": None}  # a fused unary epilogue (passes/fuse.py)

    def infer(self, node):
        a, b = node.inputs[0], node.inputs[1]
        ta, tb = node.attrs["transA"], node.attrs["transB"]
        m, ka = (a.shape[-1], a.shape[-2]) if ta else (a.shape[-2], a.shape[-1])
        kb, n = (b.shape[-1], b.shape[-2]) if tb else (b.shape[-2], b.shape[-1])
        if ka != kb:
            raise ValueError(f"inner dimensions differ: {list(a.shape)} x {list(b.shape)}"
                             f" (transA={ta}, transB={tb})")
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        shape = tuple(batch) + (m, n)
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            np.broadcast_shapes(node.inputs[2].shape, shape)
        return [(a.dtype, shape)]

    def numpy(self, node, a, b, c=None):
        if node.attrs.get("act"):
            return None
        a = np.swapaxes(a, -1, -2) if node.attrs["transA"] else a
        b = np.swapaxes(b, -1, -2) if node.attrs["transB"] else b
        y = node.attrs["alpha"] * np.matmul(a, b)
        if c is not None:
            y = y + node.attrs["beta"] * c
        return [y.astype(a.dtype)]

    def lower(self, node, lw):
        lw.gemm(node)

    def grad(self, b, node, dys):
        a, w = node.inputs[0], node.inputs[1]
        dy = dys[0]
        ta, tb = node.attrs["transA"], node.attrs["transB"]
        alpha = node.attrs["alpha"]
        # y = A' B' with A' = op(A), B' = op(B): dA' = dy B'^T, dB' = A'^T dy
        if ta:
            da = b.op("Gemm", [w, dy], {"transA": tb, "transB": 1, "alpha": alpha})
        else:
            da = b.op("Gemm", [dy, w], {"transA": 0, "transB": 1 - tb, "alpha": alpha})
        if tb:
            dw = b.op("Gemm", [dy, a], {"transA": 1, "transB": ta, "alpha": alpha})
        else:
            dw = b.op("Gemm", [a, dy], {"transA": 1 - ta, "transB": 0, "alpha": alpha})
        grads = [da, dw]
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            beta = node.attrs["beta"]
            grads.append(dy if beta == 1.0 else b.op("Mul", [dy, b.const(np.asarray(beta, dy.dtype))]))
        return grads


@register
class Det(Op):
    """y = det(x) over the last two (square) dims;  dx = dy cofactors(x)  (= dy y x^-T where x is invertible; the
    cofactors are dets of the minors, gathered from x, so a singular x has its exact gradient too)"""
    name = "Det"
    dtypes = ("float32",)
    MAX_N = 32  # the kernel holds one matrix in private memory

    def lower(self, node, lw):
        lw.det(node)

    def infer(self, node):
        x = node.inputs[0]
        if x.rank < 2 or x.shape[-1] != x.shape[-2]:
            raise ValueError(f"Det takes square matrices [..., M, M], got {list(x.shape)}")
        if x.shape[-1] > self.MAX_N:
            raise ValueError(f"Det on {x.shape[-1]}x{x.shape[-1]} matrices: at most {self.MAX_N}x{self.MAX_N}")
        return [(x.dtype, x.shape[:-2])]

    def numpy(self, node, x):
        return [np.asarray(np.linalg.det(x.astype(np.float64)), x.dtype)]

    def grad(self, b, node, dys):
        x = node.inputs[0]
        n, r = x.shape[-1], x.rank
        dy = b.op("Reshape", [dys[0]], {"shape": x.shape[:-2] + (1, 1)})
        if n == 1:
            return [dy]
        others = b.const(np.array([[k for k in range(n) if k != i] for i in range(n)], np.int64))
        rows = b.op("Gather", [x, others], {"axis": r - 2})  # [..., i, n - 1, n]
        minors = b.op("Gather", [rows, others], {"axis": r})  # [..., i, n - 1, j, n - 1]
        minors = b.op("Transpose", [minors], {"perm": tuple(range(r - 2)) + (r - 2, r, r - 1, r + 1)})
        signs = b.const(np.array([[(-1.0) ** (i + j) for j in range(n)] for i in range(n)], x.dtype))
        return [b.op("Mul", [dy, b.op("Mul", [b.op("Det", [minors]), signs])])]

