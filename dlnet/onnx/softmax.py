"""Softmax, LogSoftmax and Hardmax per op-set, and the losses built on them: NegativeLogLikelihoodLoss,
SoftmaxCrossEntropyLoss (composed)."""
import numpy as np

from .common import handler, norm_axis, reshape, widen_float16


def _softmax_legacy(imp, node, xs, at, op):
    # op-sets < 13: the input is flattened to 2-D at `axis` and normalised over the whole second dim
    x = xs[0]
    axis = norm_axis(at.get("axis", 1), x.rank)
    outer = int(np.prod(x.shape[:axis], dtype=np.int64))
    flat = reshape(imp.b, x, (outer, x.size // outer if outer else 0))
    y = imp.b.op(op, [flat], {"axis": 1})
    return [reshape(imp.b, y, x.shape)]


@handler("Softmax", 1, 11)
@widen_float16
def _softmax_1(imp, node, xs, at):
    return _softmax_legacy(imp, node, xs, at, "Softmax")


@handler("LogSoftmax", 1, 11)
@widen_float16
def _logsoftmax_1(imp, node, xs, at):
    return _softmax_legacy(imp, node, xs, at, "LogSoftmax")


@handler("Softmax", 13)
@handler("LogSoftmax", 13)
@widen_float16
def _softmax_13(imp, node, xs, at):  # op-set 13: one axis, default -1
    x = xs[0]
    return [imp.b.op(node.op_type, [x], {"axis": norm_axis(at.get("axis", -1), x.rank)})]


def _hardmax(imp, x, axis):
    b = imp.b
    arg = b.op("ArgReduce", [x], {"mode": "max", "axis": axis, "keepdims": 1})
    ids = b.const(np.arange(x.shape[axis], dtype=np.int64).reshape((-1,) + (1,) * (x.rank - axis - 1)))
    return b.op("Cast", [b.op("Equal", [arg, ids])], {"to": x.dtype})


@handler("Hardmax", 1, 11)
def _hardmax_1(imp, node, xs, at):  # op-sets < 13: flattened to 2-D at `axis`, as Softmax
    x = xs[0]
    axis = norm_axis(at.get("axis", 1), x.rank)
    outer = int(np.prod(x.shape[:axis], dtype=np.int64))
    flat = reshape(imp.b, x, (outer, x.size // outer if outer else 0))
    return [reshape(imp.b, _hardmax(imp, flat, 1), x.shape)]


@handler("Hardmax", 13)
def _hardmax_13(imp, node, xs, at):
    x = xs[0]
    return [_hardmax(imp, x, norm_axis(at.get("axis", -1), x.rank))]


# ---------------------------------------------------------------- losses, composed --------------------------------
def _nll(imp, logp, target, weight, at):
    """loss[n, d..] = -logp[n, target, d..] * w[target] (0 where target == ignore_index), then the reduction."""
    b = imp.b
    C = logp.shape[1]
    t = b.op("Reshape", [target], {"shape": (target.shape[0], 1) + target.shape[1:]})
    ids = b.const(np.arange(C, dtype=target.dtype).reshape((1, C) + (1,) * (logp.rank - 2)))
    onehot = b.op("Cast", [b.op("Equal", [t, ids])], {"to": logp.dtype})
    wsel = onehot if weight is None else b.op("Mul", [onehot, reshape(b, weight, (1, C) + (1,) * (logp.rank - 2))])
    w = b.op("Reduce", [wsel], {"mode": "sum", "axes": (1,), "keepdims": 0})
    if "ignore_index" in at:
        keep = b.op("Not", [b.op("Equal", [target, b.const(np.asarray(at["ignore_index"], target.dtype))])])
        w = b.op("Mul", [w, b.op("Cast", [keep], {"to": logp.dtype})])
    picked = b.op("Reduce", [b.op("Mul", [onehot, logp])], {"mode": "sum", "axes": (1,), "keepdims": 0})
    loss = b.op("Neg", [b.op("Mul", [picked, w])])
    reduction = at.get("reduction", "mean")
    every = tuple(range(loss.rank))
    if reduction == "none":
        return loss
    total = b.op("Reduce", [loss], {"mode": "sum", "axes": every, "keepdims": 0})
    if reduction == "sum":
        return total
    return b.op("Div", [total, b.op("Reduce", [w], {"mode": "sum", "axes": every, "keepdims": 0})])


@handler("NegativeLogLikelihoodLoss", 12, 13, 22)
def _nll_loss(imp, node, xs, at):
    weight = xs[2] if len(xs) > 2 else None
    return [_nll(imp, xs[0], xs[1], weight, at)]


@handler("SoftmaxCrossEntropyLoss", 12, 13)
def _sce_loss(imp, node, xs, at):
    x = xs[0]
    logp = imp.b.op("LogSoftmax", [x], {"axis": 1})
    weight = xs[2] if len(xs) > 2 else None
    return [_nll(imp, logp, xs[1], weight, at), logp]
