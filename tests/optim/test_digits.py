"""A real training run: a small CNN on scikit-learn's digits reaches >= 95% validation accuracy."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

import dlnet  # noqa: E402
from tests.conftest import context  # noqa: E402
from dlnet.digits import digits_arrays, digits_model  # noqa: E402


@pytest.mark.slow
def test_digits_cnn_reaches_95_percent(tmp_path):
    x, y = digits_arrays()
    rng = np.random.default_rng(0)
    order = rng.permutation(len(x))
    x, y = x[order], y[order]
    xv, yv, xt, yt = x[:360], y[:360], x[360:], y[360:]
    path = tmp_path / "digits.onnx"
    digits_model(str(path))
    net = dlnet.Net(context()).load_onnx(str(path))
    tr = dlnet.Trainer(net, optimizer=dlnet.optim.Adam(lr=3e-3))
    bs = 64
    for epoch in range(6):
        perm = rng.permutation(len(xt))
        for s in range(0, len(xt) - bs + 1, bs):
            idx = perm[s:s + bs]
            tr.step({"input": xt[idx], "target": yt[idx]})
    metrics = tr.evaluate({"input": xv, "target": yv})
    assert metrics["accuracy"] >= 0.95, metrics
    net.save_onnx(str(tmp_path / "trained.onnx"))
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(str(tmp_path / "trained.onnx"))
    out = sess.run(None, {"input": xv})[0]
    assert (out.argmax(1) == yv).mean() >= 0.95
