"""One SGD / Adam / AdamW step (and a few more) against torch.optim, weights compared after each step."""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import dlnet  # noqa: E402
from tests.conftest import context  # noqa: E402

from .nets import data, export, make  # noqa: E402

CASES = [
    ("sgd", lambda: dlnet.optim.SGD(lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
    ("sgd_momentum", lambda: dlnet.optim.SGD(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2),
     lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2)),
    ("adam", lambda: dlnet.optim.Adam(lr=1e-2, weight_decay=1e-3), lambda p: torch.optim.Adam(p, lr=1e-2,
                                                                                            weight_decay=1e-3)),
    ("adamw", lambda: dlnet.optim.AdamW(lr=1e-2), lambda p: torch.optim.AdamW(p, lr=1e-2)),
    ("adam_clip", lambda: dlnet.optim.Adam(lr=1e-2, clip_norm=0.05), lambda p: torch.optim.Adam(p, lr=1e-2)),
    # one update launch covers tensors split over several chunks, with clipping by the norm over all of them
    ("wide_adamw_clip", lambda: dlnet.optim.AdamW(lr=1e-2, clip_norm=0.05), lambda p: torch.optim.AdamW(p, lr=1e-2)),
    ("wide_sgd_momentum_clip", lambda: dlnet.optim.SGD(lr=0.1, momentum=0.9, clip_norm=0.05),
     lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
    # BatchNormalization reads its scale and shift through views of the weight arena that each step updates (not
    # Adam: the gradient of the conv bias before BatchNormalization is rounding noise, which Adam scales up to lr)
    ("bn_sgd_momentum", lambda: dlnet.optim.SGD(lr=0.1, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.1,
                                                                                               momentum=0.9)),
]


@pytest.mark.parametrize("vectors", [True, False], ids=["vec8", "scalar"])
@pytest.mark.parametrize("name,mine,theirs", CASES, ids=[c[0] for c in CASES])
def test_steps_match_torch_optim(name, mine, theirs, vectors):
    """... with the updates eight elements a work-item (optim.cl's VEC8, rows of every length: ragged ends) or one."""
    x, y = data(8)
    model = make(name.split("_")[0] if name.startswith(("wide_", "bn_")) else "linear")
    proto = export(model, x)
    net = dlnet.Net(context().with_options(optim_vectors=("cpu", "gpu") if vectors else ())).load_onnx(proto)
    tr = dlnet.Trainer(net, optimizer=mine())
    ref = copy.deepcopy(model)
    opt = theirs(ref.parameters())
    for _ in range(3):
        loss = tr.step({"input": x, "target": y})
        opt.zero_grad()
        ref_loss = torch.nn.functional.cross_entropy(ref(torch.from_numpy(x)), torch.from_numpy(y))
        ref_loss.backward()
        if name.endswith("_clip"):
            torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
        opt.step()
        assert abs(loss - ref_loss.item()) <= 1e-4 * abs(ref_loss.item())
    sd = net.state_dict()
    # Adam's step is m / sqrt(v) per element: where a gradient is near zero, float rounding in it moves that
    # element by up to ~1e-3 of lr; among 10368 weights a few such elements exist
    atol = 1e-5 if name.startswith("wide") else 1e-6
    for n, p in ref.named_parameters():
        np.testing.assert_allclose(sd[n], p.detach().numpy(), rtol=1e-4, atol=atol)


def test_frozen_parameters_stay_put():
    x, y = data(8)
    model = make("linear")
    net = dlnet.Net(context()).load_onnx(export(model, x))
    before = net.state_dict()
    tr = dlnet.Trainer(net, optimizer=dlnet.optim.SGD(lr=0.5), frozen=["1.weight", "1.bias"])
    tr.step({"input": x, "target": y})
    after = net.state_dict()
    np.testing.assert_array_equal(after["1.weight"], before["1.weight"])
    assert np.abs(after["3.weight"] - before["3.weight"]).max() > 0


def test_schedules():
    s = dlnet.optim.Cosine(10, warmup=2)
    assert s.factor(0) == 0.5 and s.factor(1) == 1.0 and abs(s.factor(12)) < 1e-12
    assert dlnet.optim.StepLR(5, 0.5).factor(7) == 0.5
