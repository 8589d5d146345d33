"""`dlnet train --resume` continues exactly, and checkpoints are written atomically."""
import errno
import os
import signal

import numpy as np
import pytest
from click.testing import CliRunner
from dlnet.cli import checkpoint
from dlnet.cli import train as train_cli
from dlnet.cli.main import cli

import dlnet

from .conftest import MODELS


def digits_config(tmp_path, name, epochs=2):
    out = tmp_path / name
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"model: {os.path.join(MODELS, 'digits_init.onnx')}\n"
                    f"dataset: {{path: {os.path.join(MODELS, 'digits_train.npz')}, val_split: 0.2}}\n"
                    f"batch_size: 64\nepochs: {epochs}\noptimizer: {{name: adam, lr: 0.003}}\n"
                    f"schedule: {{name: cosine}}\noutput: {out}\nseed: 0\n")
    return str(path), out


def final_state(out):
    """The newest checkpoint's state, with its tensors as "weights" and "optimizer"."""
    (_, path), *_ = checkpoint.checkpoints(str(out))
    tensors, state = checkpoint.read_checkpoint(path)
    for part in ("weight", "optimizer"):
        state[part if part == "optimizer" else "weights"] = {k.split("/", 1)[1]: a for k, a in tensors.items()
                                                              if k.startswith(part + "/")}
    state["perm"] = tensors.get("position/perm")
    return state


def assert_same_run(a, b):
    assert len(a["rows"]) == len(b["rows"]) == 2
    for ra, rb in zip(a["rows"], b["rows"]):
        for key in ("train_loss", "train_accuracy", "val_loss", "val_accuracy"):
            assert abs(ra[key] - rb[key]) <= 1e-6, (key, ra, rb)
    assert a["step"] == b["step"]
    assert set(a["weights"]) == set(b["weights"]) and a["weights"]
    for name in a["weights"]:
        np.testing.assert_array_equal(a["weights"][name], b["weights"][name], err_msg=name)
    assert set(a["optimizer"]) == set(b["optimizer"]) and a["optimizer"]
    for name in a["optimizer"]:
        np.testing.assert_array_equal(a["optimizer"][name], b["optimizer"][name], err_msg=name)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("straight")
    path, out = digits_config(tmp, "straight")
    rows = train_cli.run_training(path, echo=lambda line: None)
    assert len(rows) == 2 and rows[1]["train_loss"] < rows[0]["train_loss"]
    return final_state(out)


def test_resume_after_an_epoch_matches_an_uninterrupted_run(tmp_path, uninterrupted):
    path, out = digits_config(tmp_path, "split")

    def stop_after_first_epoch(line):
        if line.startswith("epoch 1/2"):
            raise KeyboardInterrupt

    with pytest.raises(SystemExit) as e:
        train_cli.run_training(path, echo=stop_after_first_epoch)
    assert e.value.code == 130
    state = final_state(out)
    assert state["epoch"] == 1 and len(state["rows"]) == 1
    result = CliRunner().invoke(cli, ["train", path, "--resume"])
    assert result.exit_code == 0, result.output
    assert "resumed from" in result.output and "epoch 2/2" in result.output and "epoch 1/2" not in result.output
    assert_same_run(final_state(out), uninterrupted)
    assert (out / "model.onnx").exists() and (out / "metrics.csv").read_text().count("\n") == 3


def test_ctrl_c_mid_epoch_resumes_exactly(tmp_path, uninterrupted, monkeypatch):
    """A real SIGINT during the 5th step of epoch 1: the step finishes, the checkpoint records the position."""
    path, out = digits_config(tmp_path, "sigint")
    real_step = dlnet.Trainer.step
    calls = []
    before = signal.getsignal(signal.SIGINT)  # (Python's default, or SIG_IGN under a shell's background job)

    def step(self, feeds):
        calls.append(1)
        if len(calls) == 5:
            os.kill(os.getpid(), signal.SIGINT)
        return real_step(self, feeds)

    monkeypatch.setattr(dlnet.Trainer, "step", step)
    with pytest.raises(SystemExit) as e:
        train_cli.run_training(path, echo=lambda line: None)
    assert e.value.code == 130
    monkeypatch.setattr(dlnet.Trainer, "step", real_step)
    state = final_state(out)
    assert state["epoch"] == 0 and state["step"] == 5 and state["position"]["step"] == 5
    assert signal.getsignal(signal.SIGINT) is before  # the handler is put back
    train_cli.run_training(path, resume=True, echo=lambda line: None)
    assert_same_run(final_state(out), uninterrupted)


def test_sigterm_mid_epoch_checkpoints_and_resumes_exactly(tmp_path, uninterrupted, monkeypatch):
    """SIGTERM (a scheduler stopping the job) is held like Ctrl-C until the step ends: exit 143, then exact resume."""
    path, out = digits_config(tmp_path, "sigterm")
    real_step = dlnet.Trainer.step
    calls = []

    def step(self, feeds):
        calls.append(1)
        if len(calls) == 19:  # epoch 2's third step (16 steps an epoch)
            os.kill(os.getpid(), signal.SIGTERM)
        return real_step(self, feeds)

    monkeypatch.setattr(dlnet.Trainer, "step", step)
    with pytest.raises(SystemExit) as e:
        train_cli.run_training(path, echo=lambda line: None)
    assert e.value.code == 143
    monkeypatch.setattr(dlnet.Trainer, "step", real_step)
    state = final_state(out)
    assert state["epoch"] == 1 and state["step"] == 19 and state["position"]["step"] == 3
    assert sorted(state["perm"].tolist()) == list(range(1078))
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert [os.path.basename(p) for _, p in checkpoint.checkpoints(str(out))] == \
        ["checkpoint-000002.safetensors", "checkpoint-000001.safetensors"]
    train_cli.run_training(path, resume=True, echo=lambda line: None)
    assert_same_run(final_state(out), uninterrupted)


def test_checkpoint_is_written_atomically(tmp_path, monkeypatch):
    path = tmp_path / "model.bin"
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    checkpoint.write_atomic(str(path), b"first")
    assert len(synced) >= 1, "the file was not fsynced"
    assert os.listdir(tmp_path) == ["model.bin"]

    def broken_write(f, chunks):
        f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "write_chunks", broken_write)
    with pytest.raises(dlnet.ConfigError) as e:
        checkpoint.write_atomic(str(path), b"second")
    assert str(e.value) == f"{path}: could not write it (No space left on device)"  # the final name, not the temp's
    assert os.listdir(tmp_path) == ["model.bin"]  # no temporary file left behind
    monkeypatch.undo()
    assert path.read_bytes() == b"first"  # the previous file is intact

    def broken_replace(src, dst):
        raise KeyboardInterrupt  # Ctrl-C between the write and the rename

    monkeypatch.setattr(checkpoint.os, "replace", broken_replace)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.write_atomic(str(path), b"third")
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["model.bin"] and path.read_bytes() == b"first"
