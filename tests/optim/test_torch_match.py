"""Loss and every parameter gradient of small nets against PyTorch CPU autograd (float32 on both sides)."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import dlnet  # noqa: E402
from tests.conftest import context  # noqa: E402
from dlnet.train import Trainer  # noqa: E402

from .nets import data, export, make  # noqa: E402

KINDS = ["conv", "grouped", "depthwise", "bn", "pool", "linear", "residual", "concat"]


@pytest.fixture(scope="module")
def ctx():
    return context()


def torch_grads(model, x, y, loss="cross_entropy", smoothing=0.0):
    model.zero_grad()
    out = model(torch.from_numpy(x))
    if loss == "cross_entropy":
        value = torch.nn.functional.cross_entropy(out, torch.from_numpy(y), label_smoothing=smoothing)
    else:
        value = torch.nn.functional.mse_loss(out, torch.from_numpy(y))
    value.backward()
    names = dict(model.named_parameters())
    return float(value), {n: p.grad.numpy().copy() for n, p in names.items()}


def dlnet_grads(ctx, model_proto, x, y, loss="cross_entropy", smoothing=0.0):
    net = dlnet.Net(ctx).load_onnx(model_proto)
    # lr 0: the step leaves the weights alone and the gradients stay readable in the plan
    tr = Trainer(net, loss=loss, optimizer=dlnet.optim.SGD(lr=0.0), label_smoothing=smoothing)
    value = tr.step({"input": x, "target": y})
    plan = tr._active
    return value, {n: plan.download(ctx, gv) for n, _, gv in plan.params}, tr


def close(a, b, rtol=1e-4, atol=1e-6):
    """max |a - b| <= rtol * max |b| + atol; atol covers gradients that are zero up to rounding (a conv bias
    before BatchNormalization)"""
    return np.abs(a - b).max() <= rtol * np.abs(b).max() + atol


@pytest.mark.parametrize("kind", KINDS)
def test_loss_and_gradients_match_torch(ctx, kind):
    x, y = data()
    model = make(kind)
    proto = export(model, x)
    ref_loss, ref = torch_grads(model, x, y)
    loss, grads, _ = dlnet_grads(ctx, proto, x, y)
    assert abs(loss - ref_loss) <= 1e-4 * abs(ref_loss)
    assert set(grads) == set(ref), (set(grads) ^ set(ref))
    for n in ref:
        assert close(grads[n], ref[n]), (n, np.abs(grads[n] - ref[n]).max(), np.abs(ref[n]).max())


def test_layernorm_gradients_read_the_forward_statistics(ctx):
    """A LayerNormalization (op-set 17) trains as LayerNormStats (pipeline.training_import): its gradient reads the
    row statistics the forward kept, and the loss and every gradient still match PyTorch's."""
    x, y = data()
    model = make("layernorm")
    proto = export(model, x, opset=17)
    ref_loss, ref = torch_grads(model, x, y)
    loss, grads, tr = dlnet_grads(ctx, proto, x, y)
    ops = [n.op for n in tr._active.graph.nodes]
    assert "LayerNormStats" in ops and "LayerNorm" not in ops
    assert abs(loss - ref_loss) <= 1e-4 * abs(ref_loss)
    assert set(grads) == set(ref)
    for n in ref:
        assert close(grads[n], ref[n]), (n, np.abs(grads[n] - ref[n]).max(), np.abs(ref[n]).max())


def test_products_read_transposed_weights_as_stored(ctx):
    """A Linear layer over a sequence exports as MatMul(x, Transpose(W)): the training graph's Gemm reads W as it is
    stored (transB, pipeline.training_import), so no step copies W or its gradient; loss and gradients match
    PyTorch's."""
    x, y = data()
    model = make("tokens")
    proto = export(model, x)
    assert "Transpose" in [n.op_type for n in proto.graph.node]
    ref_loss, ref = torch_grads(model, x, y)
    loss, grads, tr = dlnet_grads(ctx, proto, x, y)
    assert "Transpose" not in [n.op for n in tr._active.graph.nodes]
    assert abs(loss - ref_loss) <= 1e-4 * abs(ref_loss)
    assert set(grads) == set(ref)
    for n in ref:
        assert close(grads[n], ref[n]), (n, np.abs(grads[n] - ref[n]).max(), np.abs(ref[n]).max())


def test_split_gradient_is_one_concat(ctx):
    """A packed projection split in three pieces (attention's q, k, v): its gradient is one Concat of the pieces'
    gradients (transposes.slice_grads_into_concat), not three zero-filled SliceGrads summed; loss and gradients match
    PyTorch's."""
    x, y = data()
    model = make("split")
    proto = export(model, x)
    ref_loss, ref = torch_grads(model, x, y)
    loss, grads, tr = dlnet_grads(ctx, proto, x, y)
    ops = [n.op for n in tr._active.graph.nodes]
    assert "SliceGrad" not in ops and "Concat" in ops
    assert abs(loss - ref_loss) <= 1e-4 * abs(ref_loss)
    for n in ref:
        assert close(grads[n], ref[n]), (n, np.abs(grads[n] - ref[n]).max(), np.abs(ref[n]).max())


def test_decomposed_gelu_trains_as_one_op(ctx):
    """GELU's tanh form, decomposed by the op-set 13 exporter, trains as GeluTanh (pipeline.training_import), and its
    gradient rule's pointwise DAG (x^2 and tanh read twice) fuses into one kernel with the product's gradient that
    feeds it; loss and gradients match PyTorch's."""
    x, y = data()
    model = make("gelu_tanh")
    proto = export(model, x)
    ref_loss, ref = torch_grads(model, x, y)
    loss, grads, tr = dlnet_grads(ctx, proto, x, y)
    nodes = tr._active.graph.nodes
    assert "GeluTanh" in [n.op for n in nodes] and "Tanh" not in [n.op for n in nodes]
    rule = [n for n in nodes if n.op == "Fused" and "Tanh" in [m.op for m in n.attrs["nodes"]]]
    assert len(rule) == 1 and len(rule[0].attrs["nodes"]) >= 15
    assert abs(loss - ref_loss) <= 1e-4 * abs(ref_loss)
    for n in ref:
        assert close(grads[n], ref[n]), (n, np.abs(grads[n] - ref[n]).max(), np.abs(ref[n]).max())


def test_attention_gradient_reads_heads_in_place(ctx):
    """Causal self-attention (SDPA, op-set 17) trains with the fused forward; with Options.transpose_views its
    gradient's products read q, k, v and dy in [b, h, t, d] through TransposeViews of their [b, t, h, d] values (no
    copies); loss and gradients match PyTorch's either way."""
    x, y = data()
    model = make("attention")
    proto = export(model, x, opset=17)
    ref_loss, ref = torch_grads(model, x, y)
    for views in (False, True):
        loss, grads, tr = dlnet_grads(ctx.with_options(transpose_views=views, fused_attention_grad=()), proto, x, y)
        ops = [n.op for n in tr._active.graph.nodes]
        assert "Attention" in ops and ops.count("TransposeView") == (4 if views else 0)
        assert abs(loss - ref_loss) <= 1e-4 * abs(ref_loss)
        for n in ref:
            assert close(grads[n], ref[n]), (n, np.abs(grads[n] - ref[n]).max(), np.abs(ref[n]).max())


def test_attention_gradient_fused(ctx):
    """With Options.fused_attention_grad naming the device's kind, causal self-attention's gradient is one
    AttentionGrad node (attention_grad.cl: no scores, no Softmax in the step); loss and gradients match PyTorch's."""
    x, y = data()
    model = make("attention")
    proto = export(model, x, opset=17)
    ref_loss, ref = torch_grads(model, x, y)
    loss, grads, tr = dlnet_grads(ctx.with_options(fused_attention_grad=(ctx.dev.kind,)), proto, x, y)
    ops = [n.op for n in tr._active.graph.nodes]
    assert ops.count("AttentionGrad") == 1 and "Softmax" not in ops
    assert abs(loss - ref_loss) <= 1e-4 * abs(ref_loss)
    for n in ref:
        assert close(grads[n], ref[n]), (n, np.abs(grads[n] - ref[n]).max(), np.abs(ref[n]).max())


@pytest.mark.parametrize("precision", ["tf32", "fp16"])
def test_attention_gradient_on_tensor_cores(ctx, precision):
    """In tf32 and fp16 a head dim of 16 trains through attention_grad_mma.cl (algo flash_grad_mma; off NVIDIA with
    its PTX emulated) even where Options.fused_attention_grad leaves the others to the decomposition; loss and
    gradients match PyTorch's float32 to the precision's rounding."""
    x, y = data()
    model = make("attention16")
    proto = export(model, x, opset=17)
    ref_loss, ref = torch_grads(model, x, y)
    options = ctx.with_options(fused_attention_grad=(), mma_emulate=not ctx.dev.is_nvidia).options
    loss, grads, tr = dlnet_grads(dlnet.Context(ctx.info, precision=precision, options=options), proto, x, y)
    grad = [n for n in tr._active.graph.nodes if n.op == "AttentionGrad"]
    assert len(grad) == 1 and grad[0].schedule["algo"] == "flash_grad_mma"
    rtol = 3e-2 if precision == "fp16" else 5e-3
    assert abs(loss - ref_loss) <= rtol * abs(ref_loss)
    scale = tr.scaler.scale if tr.scaler is not None else 1.0  # (fp16: the gradients of the loss times its scale)
    for n in ref:
        g = grads[n] / scale
        assert close(g, ref[n], rtol, 1e-4), (n, np.abs(g - ref[n]).max(), np.abs(ref[n]).max())


def test_label_smoothing_matches_torch(ctx):
    x, y = data()
    model = make("linear")
    proto = export(model, x)
    ref_loss, ref = torch_grads(model, x, y, smoothing=0.1)
    loss, grads, _ = dlnet_grads(ctx, proto, x, y, smoothing=0.1)
    assert abs(loss - ref_loss) <= 1e-4 * abs(ref_loss)
    for n in ref:
        assert close(grads[n], ref[n])


def test_batchnorm_running_statistics_match_torch(ctx):
    x, y = data(8)
    model = make("bn")
    proto = export(model, x)
    net = dlnet.Net(ctx).load_onnx(proto)
    tr = Trainer(net, optimizer=dlnet.optim.SGD(lr=0.0))
    tr.step({"input": x, "target": y})
    model(torch.from_numpy(x))
    sd = net.state_dict()
    bn = model[1]
    means = [a for n, a in sd.items() if "running_mean" in n]
    vars_ = [a for n, a in sd.items() if "running_var" in n]
    np.testing.assert_allclose(means[0], bn.running_mean.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(vars_[0], bn.running_var.numpy(), rtol=1e-5, atol=1e-6)
