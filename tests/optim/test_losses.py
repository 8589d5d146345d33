"""Every loss of dlnet.losses against torch.nn.functional: the value and the gradient w.r.t. the model output,
on the device (the graph the trainer builds) and on the host (`host_loss`, used by evaluate)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from dlnet import losses
from dlnet.graph.autodiff import gradients
from dlnet.graph.ir import Builder, Graph
from dlnet.graph.passes import run_passes
from dlnet.graph.passes.fold import fold_constants, remove_dead
from dlnet.graph.passes.fuse import fuse_pointwise
from dlnet.net import Plan

from ..conftest import context

N, C = 6, 5


def device_loss(kind, y, target, smoothing=0.0):
    """(loss, d loss / d y) from the trainer's loss graph, float32 on the device."""
    g = Graph("loss")
    out = g.add_input("y", "float32", y.shape)
    t = g.add_input("t", "float32", y.shape)
    loss = losses.build_loss(Builder(g), kind, out, t)
    (dy,) = gradients(g, loss, [out])
    g.outputs, g.output_names = [loss, dy], ["loss", "dy"]
    run_passes(g, [fold_constants, fuse_pointwise, remove_dead])
    plan = Plan(context(), g)
    try:
        value, grad = plan.run([y, losses.host_target(kind, target, y.shape, smoothing)])
    finally:
        plan.release()
    return float(value), grad


def torch_loss(kind, y, target, smoothing=0.0):
    yt = torch.tensor(y, dtype=torch.float64, requires_grad=True)
    tt = torch.from_numpy(np.asarray(target))
    if kind == "cross_entropy":
        value = F.cross_entropy(yt, tt, label_smoothing=smoothing)
    elif kind == "nll":
        value = F.nll_loss(yt, tt)
    elif kind == "mse":
        value = F.mse_loss(yt, tt.double())
    elif kind == "bce":
        value = F.binary_cross_entropy(yt, tt.double())
    else:
        value = F.binary_cross_entropy_with_logits(yt, tt.double())
    value.backward()
    return value.item(), yt.grad.numpy()


def inputs(kind, seed=0):
    rng = np.random.default_rng(seed)
    if kind in ("cross_entropy", "nll"):
        y = rng.standard_normal((N, C)) * 2
        if kind == "nll":  # log-probabilities, as after LogSoftmax
            y = y - np.log(np.exp(y).sum(axis=1, keepdims=True))
        return y.astype(np.float32), rng.integers(0, C, N)
    if kind == "bce":
        return rng.uniform(0.05, 0.95, (N, C)).astype(np.float32), rng.integers(0, 2, (N, C)).astype(np.float32)
    if kind == "bce_with_logits":  # soft targets too: torch allows any t in [0, 1]
        return (rng.standard_normal((N, C)) * 3).astype(np.float32), rng.uniform(0, 1, (N, C)).astype(np.float32)
    return rng.standard_normal((N, C)).astype(np.float32), rng.standard_normal((N, C)).astype(np.float32)


CASES = [("cross_entropy", 0.0), ("cross_entropy", 0.1), ("cross_entropy", 0.3), ("nll", 0.0), ("mse", 0.0),
         ("bce", 0.0), ("bce_with_logits", 0.0)]


def test_cases_cover_every_loss():
    assert {k for k, _ in CASES} == set(losses.LOSSES)


@pytest.mark.parametrize("kind,smoothing", CASES, ids=[f"{k}-{s}" for k, s in CASES])
def test_loss_and_gradient_match_torch(kind, smoothing):
    y, target = inputs(kind)
    ref, ref_grad = torch_loss(kind, y, target, smoothing)
    value, grad = device_loss(kind, y, target, smoothing)
    assert abs(value - ref) <= 1e-5 * max(1.0, abs(ref)), (value, ref)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-4, atol=1e-6 * np.abs(ref_grad).max())
    host = losses.host_loss(kind, y, target, smoothing)
    assert abs(host - ref) <= 1e-9 * max(1.0, abs(ref)), (host, ref)


def test_unknown_loss_is_named():
    from dlnet.errors import ConfigError
    g = Graph()
    y = g.add_input("y", "float32", (2, 3))
    with pytest.raises(ConfigError, match="loss 'hinge': expected one of cross_entropy, nll"):
        losses.build_loss(Builder(g), "hinge", y, y)
