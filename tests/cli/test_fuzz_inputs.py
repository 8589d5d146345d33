"""Bounded fuzz (marked `fuzz`) of the other untrusted inputs: image files and training configs. Mutated bytes of
small PNG, JPEG, GIF, BMP and TIFF files go through read_image and preprocess; mutated YAML configs through the
config loader. Only a DlnetError may escape, and nothing may hang (each example is time-bounded). The examples are
the same on every run (derandomized); for a longer run raise MAX_EXAMPLES through the environment of hypothesis's
own profile, e.g. `python -m pytest tests/cli/test_fuzz_inputs.py -m fuzz --hypothesis-seed=$RANDOM`.
"""
import io
import signal

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
st = pytest.importorskip("hypothesis.strategies")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from PIL import Image  # noqa: E402

from dlnet.cli import train_config  # noqa: E402
from dlnet.errors import DlnetError  # noqa: E402
from dlnet.images import preprocess, read_image  # noqa: E402

pytestmark = pytest.mark.fuzz
CI = settings(max_examples=150, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
HANG_S = 10


def _images():
    rng = np.random.default_rng(0)
    out = []
    for fmt, mode in (("PNG", "RGB"), ("JPEG", "RGB"), ("GIF", "P"), ("BMP", "L"), ("TIFF", "RGBA")):
        img = Image.fromarray(rng.integers(0, 255, (23, 17, 3), dtype=np.uint8)).convert(mode)
        buf = io.BytesIO()
        img.save(buf, format=fmt)
        out.append(buf.getvalue())
    return out


IMAGES = _images()
CONFIG = b"""model: digits_init.onnx
dataset:
  path: digits_train.npz
  val_split: 0.2
batch_size: 64
epochs: 15
optimizer: {name: adam, lr: 0.003}
schedule:
  name: cosine
output: runs/digits
seed: 0
"""


class _Timeout(Exception):
    pass


def _bounded(fn):
    """fn() within HANG_S seconds, or the example fails as a hang."""
    def alarm(signum, frame):
        raise _Timeout()
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(HANG_S)
    try:
        return fn()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _write(factory, data):
    path = factory.mktemp("cfg") / "train.yaml"
    path.write_bytes(data)
    return path


def _mutate(data, flips, cut):
    b = bytearray(data)
    for pos, val in flips:
        b[pos % len(b)] = val
    return bytes(b[:max(1, len(b) - cut)])


@CI
@given(st.integers(0, len(IMAGES) - 1), st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)),
                                                 max_size=12), st.integers(0, 200))
def test_mutated_images_raise_only_dlnet_errors(tmp_path_factory, which, flips, cut):
    path = tmp_path_factory.mktemp("img") / "x.img"
    path.write_bytes(_mutate(IMAGES[which], flips, cut))
    try:
        img = _bounded(lambda: read_image(str(path)))
        x = _bounded(lambda: preprocess(img, (16, 16), resize=20))
        assert x.shape == (3, 16, 16) and np.isfinite(x).all()
    except DlnetError:
        pass


@CI
@given(st.lists(st.tuples(st.integers(0, len(CONFIG) - 1), st.integers(0, 255)), max_size=8),
       st.integers(0, 60))
def test_mutated_configs_raise_only_dlnet_errors(tmp_path_factory, flips, cut):
    if not flips and not cut:  # (the base config itself is valid)
        assert train_config.read_config(str(_write(tmp_path_factory, CONFIG)))["epochs"] == 15
    path = _write(tmp_path_factory, _mutate(CONFIG, flips, cut))
    try:
        _bounded(lambda: train_config.read_config(str(path)))
    except DlnetError:
        pass
