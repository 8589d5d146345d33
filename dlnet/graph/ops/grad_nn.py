"""Training-only ops: Conv and pooling gradients (hand-written kernels), Dropout, and BatchNormalization in
training form (batch statistics: three kernels forward, three backward)."""
import numpy as np

from .base import REQUIRED, Op, register
from .nn import CONV_PASS_ATTRS, AveragePool, Conv


@register
class ConvGradX(Op):
    """dx = conv_transpose(dy, w)  (inputs dy, w; attrs of the Conv plus x_shape)"""
    name = "ConvGradX"
    attrs = dict(Conv.attrs, x_shape=REQUIRED)
    pass_attrs = CONV_PASS_ATTRS

    def infer(self, node):
        return [(node.inputs[0].dtype, tuple(node.attrs["x_shape"]))]

    def lower(self, node, lw):
        lw.conv_grad(node, "dx")


@register
class ConvGradW(Op):
    """dw = sum over batch and pixels of x (shifted per tap) * dy  (inputs dy, x; attrs of the Conv plus w_shape)"""
    name = "ConvGradW"
    attrs = dict(Conv.attrs, w_shape=REQUIRED)
    pass_attrs = CONV_PASS_ATTRS

    def infer(self, node):
        return [(node.inputs[0].dtype, tuple(node.attrs["w_shape"]))]

    def lower(self, node, lw):
        lw.conv_grad(node, "dw")


@register
class PoolGrad(Op):
    """dx[i] = sum over windows covering i of dy * (i is the window's argmax)  or  dy / cell count (average)

    inputs dy, x; attrs of the pool plus mode ("max" or "avg")."""
    name = "PoolGrad"
    attrs = dict(AveragePool.attrs, mode=REQUIRED)

    def lower(self, node, lw):
        lw.pool_grad(node)

    def infer(self, node):
        return [(node.inputs[1].dtype, node.inputs[1].shape)]

@register
class Dropout(Op):
    """y = x * mask / (1 - ratio), mask ~ Bernoulli(1 - ratio) from a hash of (seed, salt, i);  dx = same on dy

    inputs x (float32) and seed (uint32[1], rewritten by the trainer every step); attrs ratio, salt."""
    name = "Dropout"
    attrs = {"ratio": REQUIRED, "salt": REQUIRED}

    def lower(self, node, lw):
        lw.dropout(node)

    def infer(self, node):
        return [(node.inputs[0].dtype, node.inputs[0].shape)]

    def grad(self, b, node, dys):
        return [b.op("Dropout", [dys[0], node.inputs[1]], dict(node.attrs)), None]


def batchnorm_training(b, x, scale, bias, mean, var, epsilon, momentum, updates):
    """The ONNX BatchNormalization handler's training form: BatchNormTrain, plus the running statistics (ONNX, every
    op-set: running = running * momentum + batch * (1 - momentum); the running variance takes the unbiased batch
    variance, as PyTorch does) appended to `updates` as (state, new value)."""
    y, mu, v = b.op("BatchNormTrain", [x, scale, bias], {"epsilon": float(epsilon)}, n_out=3)
    count = x.size // x.shape[1]
    dt = x.dtype
    m = b.const(np.asarray(momentum, dt))
    m1 = b.const(np.asarray(1.0 - momentum, dt))
    unbias = b.const(np.asarray(count / max(count - 1, 1) * (1.0 - momentum), dt))
    new_mean = b.op("Add", [b.op("Mul", [mean, m]), b.op("Mul", [b.op("Reshape", [mu], {"shape": mean.shape}), m1])])
    new_var = b.op("Add", [b.op("Mul", [var, m]), b.op("Mul", [b.op("Reshape", [v], {"shape": var.shape}), unbias])])
    updates += [(mean, new_mean), (var, new_var)]
    return y


def batchnorm_global_count(graph, ranks):
    """Synchronised BatchNorm over `ranks` equal shards (dlnet/sync_bn.py): the running variance's unbiasing
    factor of each BatchNormTrain that batchnorm_training made counts the global batch (ranks x the shard's
    elements per channel), as torch's SyncBatchNorm does; each is marked exchanged (its gradient copies the attrs).
    Returns how many factors changed."""
    changed = 0
    for node in graph.nodes:
        if node.op != "BatchNormTrain":
            continue
        node.attrs["exchanged"] = 1  # (its statistics and its gradient's sums cross the host between two launches)
        x = node.inputs[0]
        count = x.size // x.shape[1]
        total = count * ranks
        for reshape in [u for u in node.outputs[2].users if u.op == "Reshape"]:
            for mul in [u for u in reshape.outputs[0].users if u.op == "Mul" and u.inputs[1].const is not None]:
                factor = np.asarray(mul.inputs[1].const, np.float64) / (count / max(count - 1, 1))
                new = factor * (total / max(total - 1, 1))
                graph.set_input(mul, 1, graph.constant(new.astype(mul.inputs[1].dtype)))
                changed += 1
    return changed


@register
class BatchNormTrain(Op):
    """y = (x - m) / sqrt(v + eps) * scale + bias with m, v the mean and (biased) variance over all axes but 1;
    outputs y, m [C], v [C].  dx = scale / sqrt(v + eps) * (dy - mean(dy) - xhat * mean(dy * xhat)),
    dscale = sum(dy * xhat), dbias = sum(dy)  (BatchNormTrainGrad)"""
    name = "BatchNormTrain"
    dtypes = ("float32",)
    # exchanged: sync_bn exchanges the statistics (and the backward's sums) between ranks before the normalisation
    attrs = {"epsilon": REQUIRED, "exchanged": 0}

    def lower(self, node, lw):
        lw.batchnorm_train(node)

    def infer(self, node):
        x, scale, bias = node.inputs
        C = x.shape[1]
        if scale.shape != (C,) or bias.shape != (C,):
            raise ValueError(f"scale {list(scale.shape)} and bias {list(bias.shape)} must be [{C}]")
        return [(x.dtype, x.shape), (x.dtype, (C,)), (x.dtype, (C,))]

    def numpy(self, node, x, scale, bias):
        axes = (0,) + tuple(range(2, x.ndim))
        cs = (1, -1) + (1,) * (x.ndim - 2)
        m = x.mean(axis=axes)
        v = ((x - m.reshape(cs)) ** 2).mean(axis=axes)
        y = (x - m.reshape(cs)) / np.sqrt(v.reshape(cs) + node.attrs["epsilon"]) * scale.reshape(cs) + \
            bias.reshape(cs)
        return [y.astype(x.dtype), m.astype(x.dtype), v.astype(x.dtype)]

    def grad(self, b, node, dys):
        x, scale, _ = node.inputs
        _, mean, var = node.outputs
        dx, dscale, dbias = b.op("BatchNormTrainGrad", [dys[0], x, scale, mean, var], dict(node.attrs), n_out=3)
        return [dx, dscale, dbias]


@register
class BatchNormTrainGrad(Op):
    """dx, dscale, dbias of BatchNormTrain (inputs dy, x, scale, its batch mean and variance)"""
    name = "BatchNormTrainGrad"
    dtypes = ("float32",)
    attrs = {"epsilon": REQUIRED, "exchanged": 0}

    def lower(self, node, lw):
        lw.batchnorm_train_grad(node)

    def infer(self, node):
        dy, x, scale = node.inputs[:3]
        return [(x.dtype, x.shape), (scale.dtype, scale.shape), (scale.dtype, scale.shape)]

def dropout_training(imp, node, xs, at):
    """The ONNX Dropout handler's training form: ratio is an attribute before op-set 12 and an input from 12."""
    x = xs[0]
    ratio = at.get("ratio", 0.5)
    if len(xs) > 1 and xs[1] is not None:
        ratio = float(np.asarray(xs[1].const).reshape(()))
    if len(xs) > 2 and xs[2] is not None and not bool(np.asarray(xs[2].const).reshape(())):
        ratio = 0.0  # training_mode input false: identity
    if ratio <= 0.0:
        return [x]
    if imp.dropout_seed is None:
        imp.dropout_seed = imp.graph.add_input("__dropout_seed", "uint32", (1,))
    salt = len([n for n in imp.graph.nodes if n.op == "Dropout"]) + 1
    return [imp.b.op("Dropout", [x, imp.dropout_seed], {"ratio": float(ratio), "salt": salt})]
