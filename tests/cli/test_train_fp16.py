"""`dlnet train` with `precision: fp16`: the loss scale is in every checkpoint, and --resume continues from it."""
import numpy as np
from dlnet.cli import checkpoint
from dlnet.cli import train as train_cli

from .train_util import write_config

FP16 = "precision: fp16\nloss_scale_interval: 2\n"


def _newest(out):
    (_, path), *_ = checkpoint.checkpoints(str(out))
    tensors, state = checkpoint.read_checkpoint(path)
    return state, {k: a for k, a in tensors.items() if k.startswith("weight/")}


def test_resume_keeps_the_loss_scale(tmp_path):
    """3 steps an epoch, the scale doubling every 2 good steps: 2**16 -> 2**17 after epoch 1 (1 good step since);
    an uninterrupted 2-epoch run and one resumed after epoch 1 end at 2**19 with the same weights (a resume that
    started again from 2**16 would end at 2**17)."""
    straight = write_config(tmp_path, epochs=2, output="straight", extra=FP16, name="a.yaml")
    train_cli.run_training(straight, echo=lambda line: None)
    first = write_config(tmp_path, epochs=1, output="resumed", extra=FP16, name="b.yaml")
    train_cli.run_training(first, echo=lambda line: None)
    state, _ = _newest(tmp_path / "resumed")
    assert state["loss_scale"] == {"scale": 2.0 ** 17, "good_steps": 1, "skipped": 0}
    again = write_config(tmp_path, epochs=2, output="resumed", extra=FP16, name="b.yaml")
    train_cli.run_training(again, resume=True, echo=lambda line: None)
    (state_a, weights_a), (state_b, weights_b) = _newest(tmp_path / "straight"), _newest(tmp_path / "resumed")
    assert state_a["loss_scale"] == state_b["loss_scale"] == {"scale": 2.0 ** 19, "good_steps": 0, "skipped": 0}
    assert state_a["step"] == state_b["step"] == 6 and set(weights_a) == set(weights_b)
    for name in weights_a:
        np.testing.assert_array_equal(weights_a[name], weights_b[name], err_msg=name)


def test_fp32_checkpoints_hold_no_scale(tmp_path):
    path = write_config(tmp_path, epochs=1)
    train_cli.run_training(path, echo=lambda line: None)
    state, _ = _newest(tmp_path / "out")
    assert "loss_scale" not in state and state["step"] == 3
