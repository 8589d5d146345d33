"""Losses built as IR on top of a model output, so autodiff differentiates them like any other node.

Class targets arrive as one-hot (smoothed) float rows the trainer makes on the host from integer labels.
"""
import numpy as np

from .errors import ConfigError

LOSSES = ("cross_entropy", "nll", "mse", "bce", "bce_with_logits")


def _mean_all(b, v):
    return b.op("Reduce", [v], {"mode": "mean", "axes": tuple(range(v.rank)), "keepdims": 0})


def _sum_rows_mean(b, v):
    """mean over the batch of the sum over the class axis"""
    s = b.op("Reduce", [v], {"mode": "sum", "axes": tuple(range(v.rank)), "keepdims": 0})
    return b.op("Mul", [s, b.const(np.asarray(1.0 / v.shape[0], v.dtype))])


def build_loss(b, kind, y, t):
    """y: model output; t: target (one-hot float for cross_entropy/nll, same shape as y otherwise)."""
    dt = y.dtype
    if kind == "cross_entropy":  # y: logits [N, C]
        logp = b.op("LogSoftmax", [y], {"axis": 1})
        return b.op("Neg", [_sum_rows_mean(b, b.op("Mul", [t, logp]))])
    if kind == "nll":  # y: log-probabilities [N, C]
        return b.op("Neg", [_sum_rows_mean(b, b.op("Mul", [t, y]))])
    if kind == "mse":
        d = b.op("Sub", [y, t])
        return _mean_all(b, b.op("Mul", [d, d]))
    if kind == "bce":  # y: probabilities; -(t log y + (1 - t) log(1 - y))
        one = b.const(np.ones((), dt))
        pos = b.op("Mul", [t, b.op("Log", [y])])
        neg = b.op("Mul", [b.op("Sub", [one, t]), b.op("Log", [b.op("Sub", [one, y])])])
        return b.op("Neg", [_mean_all(b, b.op("Add", [pos, neg]))])
    if kind == "bce_with_logits":  # y: logits; log(1 + e^y) - t y
        return _mean_all(b, b.op("Sub", [b.op("Softplus", [y]), b.op("Mul", [t, y])]))
    raise ConfigError(f"loss {kind!r}: expected one of {', '.join(LOSSES)}")


def host_target(kind, target, out_shape, label_smoothing=0.0, dtype=np.float32):
    """The target array the loss graph reads: smoothed one-hot rows for class losses, the array itself otherwise."""
    target = np.asarray(target)
    if kind in ("cross_entropy", "nll") and target.ndim == 1:
        n, c = out_shape[0], out_shape[1]
        q = np.full((n, c), label_smoothing / c, dtype)
        q[np.arange(n), target.astype(np.int64)] += 1.0 - label_smoothing
        return q
    return np.ascontiguousarray(target, dtype=dtype).reshape(out_shape)


def host_loss(kind, y, target, label_smoothing=0.0):
    """The same loss on the host in float64 (evaluation)."""
    y = y.astype(np.float64)
    t = host_target(kind, target, y.shape, label_smoothing, np.float64)  # float32 smoothing costs 1e-7
    if kind == "cross_entropy":
        m = y - y.max(axis=1, keepdims=True)
        logp = m - np.log(np.exp(m).sum(axis=1, keepdims=True))
        return float(-(t * logp).sum() / y.shape[0])
    if kind == "nll":
        return float(-(t * y).sum() / y.shape[0])
    if kind == "mse":
        return float(((y - t) ** 2).mean())
    if kind == "bce":
        return float(-(t * np.log(y) + (1 - t) * np.log(1 - y)).mean())
    return float((np.logaddexp(0, y) - t * y).mean())
