"""The PyTorch bridge on CUDA tensors with NVIDIA's OpenCL (dlnet/cuda_share.py): the plans' memory is shared with
torch, so dlnet.torch.Module and torch.compile(backend="dlnet") train without crossing the host, with the same
outputs, gradients, updates and running statistics as eager CUDA. Skipped where there is no CUDA device or no
NVIDIA OpenCL device sharing memory with it."""
import functools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript")
from torch import nn  # noqa: E402

import dlnet  # noqa: E402
import dlnet.torch as dt  # noqa: E402
from dlnet import cuda_share  # noqa: E402

from .conftest import rel_l2  # noqa: E402
from .test_torch_bridge import ConvNet, _seeded  # noqa: E402


@functools.lru_cache(maxsize=None)
def gpu_context():
    """One Context for the module's tests (contexts made and dropped test after test are torn down by the garbage
    collector at any later moment, an OpenCL build of the next one's included, which NVIDIA's driver fails)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    try:
        ctx = dlnet.Context("gpu")
        if not ctx.is_nvidia or cuda_share.EXTENSION not in ctx.device.extensions:
            pytest.skip("no NVIDIA OpenCL device with cl_khr_external_memory_opaque_fd")
    except dlnet.errors.DeviceError:
        pytest.skip("no OpenCL GPU")
    return ctx


def host(t):
    return t.detach().cpu().numpy()


def test_views_are_the_same_memory():
    ctx = gpu_context()
    share = cuda_share.share_with_torch(ctx)
    assert share is not None and ctx.allocator is share
    buf = ctx.alloc(4096)
    view = share.view(buf, 256, (4, 8), np.float32)
    view.copy_(torch.arange(32, dtype=torch.float32, device="cuda").view(4, 8))
    torch.cuda.synchronize()
    got = np.empty(32, np.float32)
    ctx.download(buf, got, 256)
    assert np.array_equal(got, np.arange(32, dtype=np.float32))
    ctx.free(buf)


def test_module_trains_on_cuda_tensors_without_the_host():
    ctx = gpu_context()
    model = _seeded(ConvNet()).cuda().train()
    reference = _seeded(ConvNet()).cuda().train()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(4, 3, 10, 10, device="cuda")
    wrapped = dt.Module(model, (x,), ctx=ctx)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    opt_ref = torch.optim.Adam(reference.parameters(), lr=1e-2)
    for _ in range(3):
        out, want = wrapped(x), reference(x)
        assert out.is_cuda and rel_l2(host(out), host(want)) < 1e-5
        for o, m in ((opt, out), (opt_ref, want)):
            o.zero_grad()
            (m ** 2).sum().backward()
            o.step()
    assert wrapped._runner.share is not None and cuda_share.shared_plan(wrapped._runner.share,
                                                                           wrapped._runner.last.plan)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert rel_l2(host(p), host(q)) < 1e-5, name
    assert rel_l2(host(model.bn.running_var), host(reference.bn.running_var)) < 1e-6


def test_kernels_launched_by_cuda_match_the_queue():
    """The plan's kernels launched by CUDA on torch's stream (Options.cuda_launch, the default) give the queue's
    outputs and gradients bit for bit."""
    base = gpu_context()
    x = torch.randn(4, 3, 10, 10, device="cuda")
    runs = []
    for launch in (True, False):
        model = _seeded(ConvNet()).cuda().train()
        wrapped = dt.Module(model, (x,), ctx=base.with_options(cuda_launch=launch))  # (one OpenCL context)
        out = wrapped(x)
        (out ** 2).sum().backward()
        runs.append((host(out), [host(p.grad) for p in model.parameters()], wrapped._runner.last.plan))
    assert runs[0][2].cuda_launches and not runs[1][2].cuda_launches
    assert np.array_equal(runs[0][0], runs[1][0])
    assert all(np.array_equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))


def test_torch_compile_training_step_on_cuda():
    gpu_context()
    torch._dynamo.reset()
    model, eager = _seeded(ConvNet()).cuda().train(), _seeded(ConvNet()).cuda().train()
    eager.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend=dt.backend)  # (the entry point's name needs dlnet installed)
    x, y = torch.randn(4, 3, 10, 10, device="cuda"), torch.randint(0, 5, (4,), device="cuda")
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
        assert rel_l2(host(p), host(q)) < 1e-5, name


class _TwoGraphs(nn.Module):
    """Two dynamo graphs (a graph break between them): two dlnet partitions whose launches torch's stream waits for in
    turn, each on its own context, forward and backward."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1, bias=False)  # (a bias before BatchNorm has no gradient but noise,
        self.bn = nn.BatchNorm2d(6)  # which Adam would scale up to lr either way)
        self.fc = nn.Linear(6 * 10 * 10, 5)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x)))
        torch._dynamo.graph_break()
        return self.fc(h.flatten(1))


def test_torch_compile_training_across_a_graph_break_on_cuda():
    gpu_context()
    torch._dynamo.reset()
    model, eager = _seeded(_TwoGraphs()).cuda().train(), _seeded(_TwoGraphs()).cuda().train()
    eager.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend=dt.backend)
    x, y = torch.randn(4, 3, 10, 10, device="cuda"), torch.randint(0, 5, (4,), device="cuda")
    opt_c = torch.optim.Adam(model.parameters(), lr=1e-2)
    opt_e = torch.optim.Adam(eager.parameters(), lr=1e-2)
    for _ in range(3):
        out_c, out_e = compiled(x), eager(x)
        assert rel_l2(host(out_c), host(out_e)) < 1e-5
        for opt, out in ((opt_c, out_c), (opt_e, out_e)):
            opt.zero_grad()
            nn.functional.cross_entropy(out, y).backward()
            opt.step()
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        assert rel_l2(host(p), host(q)) < 1e-5, name
    assert rel_l2(host(model.bn.running_mean), host(eager.bn.running_mean)) < 1e-6
