"""Linear algebra: Gemm, MatMul (1-D operands as in numpy), Det."""
from ..errors import ModelError
from .common import handler, reshape, widen_float16


@handler("Gemm", 1, 6, 7, 9, 11, 13)
@widen_float16
def _gemm(imp, node, xs, at):
    # op-set < 7: `broadcast` attr; < 11: C required. Same maths.
    a, bm = xs[0], xs[1]
    c = xs[2] if len(xs) > 2 and xs[2] is not None else None
    attrs = {"transA": at.get("transA", 0), "transB": at.get("transB", 0), "alpha": at.get("alpha", 1.0),
             "beta": at.get("beta", 1.0)}
    if c is not None and attrs["beta"] == 0.0:
        c = None
    return [imp.b.op("Gemm", [a, bm] + ([c] if c is not None else []), attrs)]


@handler("MatMul", 1, 9, 13)
@widen_float16
def _matmul(imp, node, xs, at):
    a, bm = xs
    if a.rank == 0 or bm.rank == 0:
        raise ModelError("MatMul of a scalar")
    a2 = reshape(imp.b, a, (1,) + a.shape) if a.rank == 1 else a
    b2 = reshape(imp.b, bm, bm.shape + (1,)) if bm.rank == 1 else bm
    y = imp.b.op("Gemm", [a2, b2], {})
    shape = list(y.shape)
    if bm.rank == 1:
        shape.pop(-1)
    if a.rank == 1:
        shape.pop(-2 if bm.rank != 1 else -1)
    return [reshape(imp.b, y, shape)]


@handler("Det", 11, 22)  # 22 adds types
def _det(imp, node, xs, at):
    return [imp.b.op("Det", [xs[0]])]
