"""The PyTorch bridge (dlnet/torch.py) on a transformer block written in plain torch (issue 29): pre-norm,
nn.MultiheadAttention or scaled_dot_product_attention, a GELU MLP. The same four checks test_torch_bridge.py makes of
its CNN: from_module against eager, the bit-exact weight round trip after Adam steps, dlnet's backward inside a torch
training loop (dlnet.torch.Module over dlnet.torch.Function) and torch.compile(backend="dlnet") forward and training
steps against eager."""
import io
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")
from torch import nn  # noqa: E402

import dlnet  # noqa: E402
import dlnet.torch as dt  # noqa: E402
from dlnet.vjp import VJPPlan  # noqa: E402

from .conftest import context, rel_l2  # noqa: E402

D, HEADS, FF, T = 32, 4, 64, 6


class SdpaAttention(nn.Module):
    """Self-attention from one qkv projection through F.scaled_dot_product_attention."""

    def __init__(self):
        super().__init__()
        self.qkv, self.out = nn.Linear(D, 3 * D), nn.Linear(D, D)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (y.reshape(b, t, HEADS, D // HEADS).transpose(1, 2) for y in self.qkv(x).split(D, dim=-1))
        y = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, t, D))


class Block(nn.Module):
    """x + attn(ln1(x)), then x + mlp(ln2(x)); attention by nn.MultiheadAttention ("mha") or SDPA ("sdpa")."""

    def __init__(self, attention="mha"):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.mha = attention == "mha"
        self.attn = nn.MultiheadAttention(D, HEADS, batch_first=True) if self.mha else SdpaAttention()
        self.mlp = nn.Sequential(nn.Linear(D, FF), nn.GELU(), nn.Linear(FF, D))

    def forward(self, x):
        h = self.ln1(x)
        x = x + (self.attn(h, h, h, need_weights=False)[0] if self.mha else self.attn(h))
        return x + self.mlp(self.ln2(x))


def block(attention="mha"):
    """A seeded block with its LayerNorms away from (1, 0), so a wrong scale or bias shows."""
    torch.manual_seed(0)
    module = Block(attention)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
    return module


# nn.MultiheadAttention runs by default; the SDPA block (about 20 s more on 2 cores) is marked slow
ATTENTION = ["mha", pytest.param("sdpa", marks=pytest.mark.slow)]


@pytest.mark.parametrize("attention", ATTENTION)
def test_from_module_matches_eager(attention):
    model = block(attention).eval()
    x = torch.randn(3, T, D)
    net = dt.from_module(model, (x,), ctx=context())
    assert [i.name for i in net.inputs] == ["x"] and [o.name for o in net.outputs] == ["output"]
    assert set(net.torch_params) == {n for n, _ in model.named_parameters()}  # in_proj_weight too
    for xb in (x, torch.randn(5, T, D)):  # the batch is dynamic
        with torch.no_grad():
            want = model(xb).numpy()
        assert rel_l2(net.run({"x": xb.numpy()})["output"], want) < 1e-5
    net.release()


@pytest.mark.parametrize("attention", ATTENTION)
def test_adam_steps_in_dlnet_come_back_bit_exact(attention):
    """torch -> dlnet -> 3 Adam steps -> load_into: the module holds exactly dlnet's state_dict(), every parameter
    moved, and torch.save / torch.load of the module keeps those bits."""
    model = block(attention).train()
    x, y = torch.randn(4, T, D), torch.randn(4, T, D)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    net = dt.from_module(model, (x,), ctx=context(), dynamic_batch=False)
    trainer = dlnet.Trainer(net, loss="mse", optimizer=dlnet.optim.Adam(lr=1e-2))
    losses = [trainer.step({"x": x.numpy(), "target": y.numpy()}) for _ in range(3)]
    assert losses[-1] < losses[0]
    written = dt.load_into(net, model)
    state = net.state_dict()
    assert set(written) == set(before)
    for name, p in model.named_parameters():
        assert np.array_equal(p.detach().numpy(), state[name]), name  # bit-exact
        assert not torch.equal(p, before[name]), name  # and trained
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    loaded = torch.load(buf)
    assert all(np.array_equal(loaded[n].numpy(), state[n]) for n in before)
    trainer.close()
    net.release()


@pytest.mark.parametrize("attention", ATTENTION)
def test_function_gradients_match_torch(attention):
    """dlnet.torch.Module (forward and backward through dlnet.torch.Function) against eager autograd: the output,
    the input's gradient and every parameter's; then a torch SGD step is re-read by the next forward."""
    model, reference = block(attention).train(), block(attention).train()
    x = torch.randn(4, T, D)
    wrapped = dt.Module(model, (x,), ctx=context())
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out, want = wrapped(xa), reference(xb)
    assert rel_l2(out.detach().numpy(), want.detach().numpy()) < 1e-5
    w = torch.randn(out.shape)
    (out * w).sum().backward()
    (want * w).sum().backward()
    assert rel_l2(xa.grad.numpy(), xb.grad.numpy()) < 1e-4
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert rel_l2(p.grad.numpy(), q.grad.numpy()) < 1e-4, name
    for module in (model, reference):
        torch.optim.SGD(module.parameters(), lr=0.1).step()
    with torch.no_grad():
        assert rel_l2(wrapped(x).numpy(), reference(x).numpy()) < 1e-5


def test_function_gradients_on_tensor_cores():
    """In tf32 the bridge's backward takes attention's gradient on the tensor cores (attention_grad_mma.cl, heads of
    8; off NVIDIA with its PTX emulated), as the trainer does: the input's and the parameters' gradients match eager
    autograd to tf32's rounding."""
    base = context()
    options = base.with_options(mma_emulate=not base.dev.is_nvidia).options
    ctx = dlnet.Context(base.info, precision="tf32", options=options)
    model, reference = block("sdpa").train(), block("sdpa").train()
    x = torch.randn(4, T, D)
    wrapped = dt.Module(model, (x,), ctx=ctx)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out, want = wrapped(xa), reference(xb)
    w = torch.randn(out.shape)
    (out * w).sum().backward()
    (want * w).sum().backward()
    nodes = [n for vjp in wrapped._runner.plans.values() for n in vjp.plan.graph.nodes if n.op == "AttentionGrad"]
    assert len(nodes) == 1 and nodes[0].schedule["algo"] == "flash_grad_mma"
    assert rel_l2(xa.grad.numpy(), xb.grad.numpy()) < 5e-3
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert rel_l2(p.grad.numpy(), q.grad.numpy()) < 5e-3, name


@pytest.mark.parametrize("attention", ATTENTION)
def test_torch_compile_forward_and_training_steps(attention, monkeypatch):
    """Two SGD steps through the compiled module against eager: the losses, then the parameters; then inference.
    Every node ran on dlnet (no "stay in eager" warning; dlnet's training forward ran each step). SGD, not Adam: the
    key projection's bias has a zero gradient in exact arithmetic (softmax is blind to a per-row shift), and Adam
    would scale each side's rounding noise there to a full step."""
    torch._dynamo.reset()
    calls = []
    for cls, method in ((VJPPlan, "forward"), (dlnet.Net, "run")):
        original = getattr(cls, method)
        monkeypatch.setattr(cls, method, lambda *a, _f=original, _m=method, **k: calls.append(_m) or _f(*a, **k))
    model, eager = block(attention).train(), block(attention).train()
    compiled = torch.compile(model, backend="dlnet")
    x, y = torch.randn(4, T, D), torch.randn(4, T, D)
    opt_c = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            loss_c = nn.functional.mse_loss(compiled(x), y)
            loss_e = nn.functional.mse_loss(eager(x), y)
            assert abs(loss_c.item() - loss_e.item()) < 1e-5 * max(1.0, abs(loss_e.item()))
            for opt, loss in ((opt_c, loss_c), (opt_e, loss_e)):
                opt.zero_grad()
                loss.backward()
                opt.step()
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            assert rel_l2(p.detach().numpy(), q.detach().numpy()) < 1e-5, name
        model.eval()
        eager.eval()
        with torch.no_grad():
            assert rel_l2(torch.compile(model, backend="dlnet")(x).numpy(), eager(x).numpy()) < 1e-5
    assert not [str(w.message) for w in caught if "stay in eager" in str(w.message)]
    assert calls.count("forward") == 2 and calls.count("run") == 1, calls
