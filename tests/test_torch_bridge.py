"""The PyTorch bridge (dlnet/torch.py) on models written in plain torch: from_module against eager, weights both
ways bit-exact, dlnet's backward inside a torch training loop, torch.compile(backend="dlnet") forward and a
training step, unsupported nodes left in eager, and the ops pytorch_dlprim's users found falling back to the CPU."""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")
from torch import nn  # noqa: E402

import dlnet  # noqa: E402
import dlnet.torch as dt  # noqa: E402

from .conftest import context, rel_l2  # noqa: E402


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        # no bias before BatchNorm: its gradient is zero in exact arithmetic, so rounding noise, which Adam would
        # scale to full steps
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 5)

    def forward(self, image):
        y = torch.relu(self.bn(self.conv(image)))
        return self.fc(y.mean((2, 3)))


class DlprimOps(nn.Module):
    """index_select, gather, isin, where, pow, sin/cos, count_nonzero, amax, linspace (pytorch_dlprim's issues)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("idx", torch.tensor([3, 0, 2]))
        self.register_buffer("pick", torch.tensor([[1, 0], [2, 1], [0, 2], [1, 1]]))

    def forward(self, x):
        a = torch.index_select(x, 1, self.idx)  # [4, 3]
        b = torch.gather(a, 1, self.pick)  # [4, 2]
        mask = torch.isin(self.pick, self.idx)
        c = torch.where(mask, b, torch.pow(b, 2))
        d = torch.sin(c) + torch.cos(c)
        n = torch.count_nonzero(x > 0, dim=1).to(x.dtype)
        ramp = torch.linspace(0.0, 1.0, 2)
        return d * ramp + torch.amax(x, dim=1, keepdim=True) + n.unsqueeze(1)


def _seeded(module):
    torch.manual_seed(0)
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-1, 1)
                m.running_var.uniform_(0.5, 2)
                m.weight.uniform_(0.5, 2)
    return module


def test_from_module_matches_eager_with_the_signatures_names():
    model = _seeded(ConvNet()).eval()
    x = torch.randn(4, 3, 10, 10)
    net = dt.from_module(model, (x,), ctx=context())
    assert [i.name for i in net.inputs] == ["image"] and [o.name for o in net.outputs] == ["output"]
    assert set(net.torch_params) == {n for n, _ in model.named_parameters()}
    assert {"bn.running_mean", "bn.running_var"} <= set(net.torch_buffers)
    with torch.no_grad():
        want = model(x).numpy()
    assert rel_l2(net.run({"image": x.numpy()})["output"], want) < 1e-5
    x2 = torch.randn(7, 3, 10, 10)  # the batch is dynamic
    with torch.no_grad():
        assert rel_l2(net.run({"image": x2.numpy()})["output"], model(x2).numpy()) < 1e-5
    net.release()


def test_train_in_dlnet_and_bring_the_weights_back_bit_exact():
    model = _seeded(ConvNet()).train()
    model.fc.bias.requires_grad_(False)  # a frozen parameter stays as it was
    frozen_before = model.fc.bias.detach().clone()
    x, y = torch.randn(4, 3, 10, 10), torch.randint(0, 5, (4,))
    net = dt.from_module(model, (x,), ctx=context(), dynamic_batch=False)
    trainer = dlnet.Trainer(net, loss="cross_entropy", optimizer=dlnet.optim.Adam(lr=1e-2))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    losses = [trainer.step({"image": x.numpy(), "target": y.numpy()}) for _ in range(3)]
    assert losses[-1] < losses[0]
    written = dt.load_into(net, model)
    assert "conv.weight" in written and "bn.running_mean" in written
    state = net.state_dict()
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if name in state:
            assert np.array_equal(t.detach().numpy(), state[name]), name  # bit-exact
    assert not torch.equal(model.conv.weight, before["conv.weight"])
    assert torch.equal(model.fc.bias, frozen_before)
    # and back: torch names into a fresh net
    other = dt.from_module(_seeded(ConvNet()).eval(), (x,), ctx=context())
    other.load_state_dict(model.state_dict())
    assert all(np.array_equal(other.state_dict()[n], v) for n, v in state.items() if n in other.state_dict())
    net.release()
    other.release()


def test_module_runs_dlnets_backward_in_a_torch_training_loop():
    model = _seeded(ConvNet()).train()
    reference = _seeded(ConvNet()).train()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(4, 3, 10, 10)
    wrapped = dt.Module(model, (x,), ctx=context())
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out, want = wrapped(xa), reference(xb)
    assert rel_l2(out.detach().numpy(), want.detach().numpy()) < 1e-5
    (out ** 2).sum().backward()
    (want ** 2).sum().backward()
    assert rel_l2(xa.grad.numpy(), xb.grad.numpy()) < 1e-4
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert rel_l2(p.grad.numpy(), q.grad.numpy()) < 1e-4, name
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.step()  # the next call re-reads the changed parameters
    with torch.no_grad():
        ref_next = reference.conv.weight - 0.1 * reference.conv.weight.grad
    assert rel_l2(model.conv.weight.detach().numpy(), ref_next.numpy()) < 1e-6
    out2 = wrapped(x)
    reference.conv.weight.data.copy_(model.conv.weight.data)
    for p, q in zip(model.parameters(), reference.parameters()):
        q.data.copy_(p.data)
    assert rel_l2(out2.detach().numpy(), reference(x).detach().numpy()) < 1e-5


def test_module_running_statistics_follow_eager_over_steps():
    """dlnet.torch.Module's BatchNorm running statistics, written back after each backward, are read again by the
    next step (they were the export's forever: from the second step on they drifted from eager's)."""
    model, reference = _seeded(ConvNet()).train(), _seeded(ConvNet()).train()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(4, 3, 10, 10)
    wrapped = dt.Module(model, (x,), ctx=context())
    for _ in range(3):
        for m in (wrapped(x), reference(x)):
            (m ** 2).sum().backward()
    for name in ("bn.running_mean", "bn.running_var"):
        assert rel_l2(model.get_buffer(name).numpy(), reference.get_buffer(name).numpy()) < 1e-6, name


def test_torch_compile_forward_and_a_training_step():
    torch._dynamo.reset()
    model, eager = _seeded(ConvNet()).train(), _seeded(ConvNet()).train()
    eager.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="dlnet")
    x, y = torch.randn(4, 3, 10, 10), torch.randint(0, 5, (4,))
    opt_c = torch.optim.Adam(model.parameters(), lr=1e-2)
    opt_e = torch.optim.Adam(eager.parameters(), lr=1e-2)
    for _ in range(2):
        loss_c = nn.functional.cross_entropy(compiled(x), y)
        loss_e = nn.functional.cross_entropy(eager(x), y)
        assert abs(loss_c.item() - loss_e.item()) < 1e-5 * max(1.0, abs(loss_e.item()))
        for opt, loss in ((opt_c, loss_c), (opt_e, loss_e)):
            opt.zero_grad()
            loss.backward()
            opt.step()
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        assert rel_l2(p.detach().numpy(), q.detach().numpy()) < 1e-5, name
    for name in ("bn.running_mean", "bn.running_var"):  # updated in place, as torch does
        assert rel_l2(model.get_buffer(name).numpy(), eager.get_buffer(name).numpy()) < 1e-6, name
    model.eval()
    eager.eval()
    with torch.no_grad():
        assert rel_l2(torch.compile(model, backend="dlnet")(x).numpy(), eager(x).numpy()) < 1e-5


class WithInverse(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = torch.relu(self.fc(x))
        return torch.linalg.inv(y @ y.transpose(-1, -2) + 4 * torch.eye(4)) + y.sum()


def test_unsupported_nodes_stay_in_eager_with_one_warning():
    torch._dynamo.reset()
    model = WithInverse().eval()
    x = torch.randn(3, 4, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            got = torch.compile(model, backend="dlnet")(x)
    notes = [str(w.message) for w in caught if "stay in eager" in str(w.message)]
    assert len(notes) == 1 and "inv" in notes[0]
    with torch.no_grad():
        assert rel_l2(got.numpy(), model(x).numpy()) < 1e-5


def test_the_ops_pytorch_dlprim_sent_to_the_cpu():
    model = DlprimOps().eval()
    x = torch.randn(4, 5)
    with torch.no_grad():
        want = model(x).numpy()
    net = dt.from_module(model, (x,), ctx=context(), dynamic_batch=False)
    assert rel_l2(net.run({"x": x.numpy()})["output"], want) < 1e-5
    net.release()
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            got = torch.compile(model, backend="dlnet")(x)
    assert not [w for w in caught if "stay in eager" in str(w.message)], [str(w.message) for w in caught]
    assert rel_l2(got.numpy(), want) < 1e-5


class Chunks(nn.Module):
    """torch.chunk: the default exporter writes SplitToSequence then SequenceAt (shufflenet's channel split)."""

    def forward(self, x):
        a, b = x.chunk(2, dim=1)
        c, d, e = torch.split(x, [1, 2, 3], dim=1)
        return torch.cat([b * torch.sigmoid(a), c, d.sum(1, keepdim=True), e[:, :1]], dim=1)


def test_sequences_known_at_load_run_on_the_device():
    model = Chunks()
    x = torch.randn(2, 6, 5)
    net = dt.from_module(model, (x,), ctx=context())
    assert rel_l2(net.run({"x": x.numpy()})["output"], model(x).numpy()) < 1e-6
    net.release()
