"""The training kernels at sizes where they split their sums over several work-groups per channel (the central-
difference cases in test_autodiff.py are too small for that): depthwise convolution and training-mode batch
normalization, forward value and every input gradient against torch float64 autograd."""
import numpy as np
import pytest

from .test_autodiff import device_gradients
from ..conftest import rel_l2

torch = pytest.importorskip("torch")


def torch_grads(fn, arrays, w):
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    loss = (fn(*ts) * torch.tensor(w)).sum()
    loss.backward()
    return float(loss), [t.grad.numpy() for t in ts]


@pytest.mark.parametrize("shape,stride,mult", [((4, 8, 33, 31), 1, 1), ((3, 6, 40, 24), 2, 2)])
def test_depthwise_conv_gradients(shape, stride, mult):
    rng = np.random.default_rng(1)
    C = shape[1]
    x = rng.standard_normal(shape)
    wt = rng.standard_normal((C * mult, 1, 3, 3))
    attrs = {"group": C, "strides": (stride, stride), "pads": (1, 1, 1, 1)}
    fn = lambda a, b: torch.nn.functional.conv2d(a, b, stride=stride, padding=1, groups=C)  # noqa: E731
    out_shape = fn(torch.tensor(x), torch.tensor(wt)).shape
    w = rng.standard_normal(tuple(out_shape))
    ref_loss, ref = torch_grads(fn, [x, wt], w)
    loss, grads = device_gradients("Conv", attrs, [x, wt], w)
    assert abs(loss - ref_loss) <= 1e-4 * max(1.0, abs(ref_loss))
    for g, r in zip(grads, ref):
        assert rel_l2(g, r) < 1e-5


@pytest.mark.parametrize("exchanged", [0, 1])  # 1: the statistics in launches of their own (sync_bn's form)
@pytest.mark.parametrize("shape", [(16, 5, 37, 29), (64, 7), (8, 6, 12, 20)])  # (S = 240: float4 loads)
def test_batchnorm_training_gradients(shape, exchanged):
    rng = np.random.default_rng(2)
    C = shape[1]
    x = rng.standard_normal(shape) * 3.0 + 5.0  # a mean far from 0: the shifted sums must stay accurate
    scale, bias = rng.uniform(0.5, 2.0, C), rng.standard_normal(C)
    fn = lambda a, s, b: torch.nn.functional.batch_norm(a, None, None, s, b, training=True, eps=1e-5)  # noqa: E731
    w = rng.standard_normal(shape)
    ref_loss, ref = torch_grads(fn, [x, scale, bias], w)
    loss, grads = device_gradients("BatchNormTrain", {"epsilon": 1e-5, "exchanged": exchanged}, [x, scale, bias], w)
    assert abs(loss - ref_loss) <= 1e-4 * max(1.0, abs(ref_loss))
    for g, r in zip(grads, ref):
        assert rel_l2(g, r) < 1e-4
