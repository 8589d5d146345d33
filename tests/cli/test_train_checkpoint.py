"""Checkpoints are data: safetensors with a SHA-256 of every byte, the last two kept, a corrupt newest one replaced by
the one before, pickles never opened, a checkpoint that does not fit the model or the config named."""
import os
import pickle
import signal
import subprocess
import time

import numpy as np
import pytest
from dlnet.cli import checkpoint
from dlnet.cli import train as train_cli

from dlnet.errors import ConfigError

from .train_util import dlnet_train, linear_model, popen_train, temp_files, wait_for_line, write_config


def quiet(line):
    pass


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 3-epoch run of the linear model: (config path, run folder); tests copy what they change."""
    tmp = tmp_path_factory.mktemp("trained")
    path = write_config(tmp, epochs=3)
    rows = train_cli.run_training(path, echo=quiet)
    assert len(rows) == 3 and rows[2]["train_loss"] < rows[0]["train_loss"]
    return path, tmp / "out"


def copy_run(trained, tmp_path, epochs=3):
    """The trained run copied into tmp_path: (config path, run folder)."""
    import shutil
    path = write_config(tmp_path, epochs=epochs)
    shutil.copytree(trained[1], tmp_path / "out")
    return path, tmp_path / "out"


def test_the_last_two_checkpoints_are_kept_and_read_back(trained):
    _, out = trained
    assert [os.path.basename(p) for _, p in checkpoint.checkpoints(str(out))] == \
        ["checkpoint-000003.safetensors", "checkpoint-000002.safetensors"]
    tensors, state = checkpoint.read_checkpoint(str(out / "checkpoint-000003.safetensors"))
    assert state["epoch"] == 3 and state["step"] == 9 and len(state["rows"]) == 3
    assert state["config"]["optimizer"]["lr"] == 0.1 and state["config"]["model"] == "m.onnx"  # as written
    assert set(tensors) == {"weight/w", "weight/b", "optimizer/w/momentum_buffer", "optimizer/b/momentum_buffer"}
    import onnx
    from onnx import numpy_helper
    exported = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(out / "model.onnx")).graph.initializer}
    np.testing.assert_array_equal(tensors["weight/w"], exported["w"])  # the model is the last checkpoint's weights
    assert not np.array_equal(tensors["weight/w"], checkpoint.read_checkpoint(
        str(out / "checkpoint-000002.safetensors"))[0]["weight/w"])


def test_every_flipped_byte_and_every_cut_is_found(trained, tmp_path):
    _, out = trained
    blob = (out / "checkpoint-000003.safetensors").read_bytes()
    rng = np.random.default_rng(0)
    header = 8 + int.from_bytes(blob[:8], "little")
    positions = list(range(0, header, 3)) + sorted(rng.choice(np.arange(header, len(blob)), 200, replace=False))
    bad = tmp_path / "bad.safetensors"
    for at in positions:
        changed = bytearray(blob)
        changed[at] ^= 1 << int(rng.integers(8))
        bad.write_bytes(bytes(changed))
        with pytest.raises(checkpoint.CorruptCheckpoint, match="bad.safetensors: not a good checkpoint"):
            checkpoint.read_checkpoint(str(bad))
    for size in (0, 7, 8, header - 1, header, len(blob) - 1):
        bad.write_bytes(blob[:size])
        with pytest.raises(checkpoint.CorruptCheckpoint, match="bad.safetensors: not a good checkpoint"):
            checkpoint.read_checkpoint(str(bad))
    bad.write_bytes(blob)
    assert checkpoint.read_checkpoint(str(bad))[1]["epoch"] == 3  # the unchanged bytes read back


class Payload:
    """What a malicious pickle does: run a command when unpickled (here it only leaves a file behind)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_planted_pickle_checkpoint_is_refused_unread(tmp_path):
    path = write_config(tmp_path)
    out, marker = tmp_path / "out", tmp_path / "pwned"
    out.mkdir()
    (out / "checkpoint.pkl").write_bytes(pickle.dumps({"weights": Payload(marker)}))
    r = dlnet_train([path, "--resume"])
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"dlnet: error: {out / 'checkpoint.pkl'}: a pickle checkpoint of an older dlnet, not read (unpickling can "
        f"run any code); start this run again with --force"]
    assert not marker.exists()
    # the same bytes under the new name: not a safetensors file, so not a checkpoint; still never unpickled
    os.rename(out / "checkpoint.pkl", out / "checkpoint-000001.safetensors")
    r = dlnet_train([path, "--resume"])
    assert r.returncode == 2 and "checkpoint-000001.safetensors: not a good checkpoint" in r.stderr, r.stderr
    assert not marker.exists()
    assert sorted(os.listdir(out)) == ["checkpoint-000001.safetensors"]  # nothing written, nothing removed


def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous(trained, tmp_path):
    path, out = copy_run(trained, tmp_path, epochs=4)
    newest = out / "checkpoint-000003.safetensors"
    blob = bytearray(newest.read_bytes())
    blob[len(blob) - 5] ^= 0x40  # a flipped bit in the weights: the kind that was resumed silently
    newest.write_bytes(bytes(blob))
    r = dlnet_train([path, "--resume"])
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("dlnet: warning:")]
    assert warnings == [f"dlnet: warning: {newest}: not a good checkpoint (checksum mismatch: the file changed after "
                        f"it was written); using checkpoint-000002.safetensors instead"]
    assert f"resumed from {out / 'checkpoint-000002.safetensors'}: epoch 3, step 0" in r.stdout
    assert "epoch 3/4" in r.stdout and "epoch 4/4" in r.stdout
    # the corrupt one is gone; the two newest good ones stay
    assert [os.path.basename(p) for _, p in checkpoint.checkpoints(str(out))] == \
        ["checkpoint-000005.safetensors", "checkpoint-000004.safetensors"]
    assert checkpoint.read_checkpoint(str(out / "checkpoint-000005.safetensors"))[1]["epoch"] == 4


def test_no_good_checkpoint_is_an_error_naming_it(trained, tmp_path):
    path, out = copy_run(trained, tmp_path, epochs=4)
    for _, p in checkpoint.checkpoints(str(out)):
        with open(p, "r+b") as f:
            f.truncate(os.path.getsize(p) // 2)
    with pytest.raises(ConfigError, match=r"checkpoint-000003.safetensors: not a good checkpoint .*; no good "
                                          r"checkpoint in .*out \(start again with --force\)"):
        train_cli.run_training(path, resume=True, echo=quiet)


def test_resume_with_another_config_names_the_keys(trained, tmp_path):
    path, out = copy_run(trained, tmp_path)
    text = open(path).read()
    open(path, "w").write(text.replace("lr: 0.1", "lr: 0.2").replace("batch_size: 8", "batch_size: 4"))
    r = dlnet_train([path, "--resume"])
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"dlnet: error: {path}: differs from the config of {out / 'checkpoint-000003.safetensors'}: batch_size 8 -> 4, "
        f"optimizer.lr 0.1 -> 0.2; only epochs, device, output may change on --resume (or start over with --force)"]
    open(path, "w").write(text.replace("epochs: 3", "epochs: 2"))
    with pytest.raises(ConfigError, match=r"epochs is 2, but .*checkpoint-000003.safetensors has 3 done"):
        train_cli.run_training(path, resume=True, echo=quiet)
    # epochs may grow, and the folder may be named another way
    open(path, "w").write(text.replace("epochs: 3", "epochs: 4").replace("output: out", f"output: {out}"))
    rows = train_cli.run_training(path, resume=True, echo=quiet)
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4]


def test_a_checkpoint_of_another_model_names_the_weight(trained, tmp_path):
    path, out = copy_run(trained, tmp_path)
    linear_model(tmp_path / "m.onnx", classes=4)  # same file name and weight names, another shape
    with pytest.raises(ConfigError, match=r"checkpoint-000003.safetensors: weight 'w' has shape \[256, 3\], the "
                                          r"model's is \[256, 4\]"):
        train_cli.run_training(path, resume=True, echo=quiet)
    linear_model(tmp_path / "m.onnx", weight="w2")
    with pytest.raises(ConfigError, match=r"checkpoint-000003.safetensors: the model's weight 'w2' is not in the "
                                          r"checkpoint"):
        train_cli.run_training(path, resume=True, echo=quiet)
    linear_model(tmp_path / "m.onnx", bias=False)
    with pytest.raises(ConfigError, match=r"checkpoint-000003.safetensors: weight 'b' is not in the model "):
        train_cli.run_training(path, resume=True, echo=quiet)
    assert len(checkpoint.checkpoints(str(out))) == 2 and not temp_files(out)


def test_a_forged_state_is_an_error_not_a_crash(tmp_path):
    """Anyone can write a file whose checksum matches: what the state holds is checked before it is used."""
    path = write_config(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    w = np.random.default_rng(0).standard_normal((256, 3)).astype(np.float32)
    forged = {"config": {}, "epoch": 1, "step": 3, "rows": [{"epoch": "x"}], "rng": {}, "position": {},
              "train_images": 30, "val_images": 10}
    checkpoint.save_checkpoint(str(out), {"weight/w": w}, forged)
    with pytest.raises(ConfigError, match=r"checkpoint-000001.safetensors: not a dlnet training state \(field "
                                          r"'rows'\)"):
        train_cli.run_training(path, resume=True, echo=quiet)
    checkpoint.save_checkpoint(str(out), {"weight/w": w}, dict(forged, rows=[], epoch=0, step=-4))
    with pytest.raises(ConfigError, match=r"checkpoint-000002.safetensors: not a dlnet training state \(field "
                                          r"'step'\)"):
        train_cli.run_training(path, resume=True, echo=quiet)
    checkpoint.save_checkpoint(str(out), {"weight/w": w}, {"epoch": "1"})
    with pytest.raises(ConfigError, match=r"checkpoint-000003.safetensors: not a dlnet training state \(field "
                                          r"'config'\)"):
        train_cli.run_training(path, resume=True, echo=quiet)


SLOW_SECOND_CHECKPOINT = """
import os, sys, time
from dlnet.cli import checkpoint
real = checkpoint.write_chunks
pause = float(sys.argv.pop())  # the test's last argument: how long the write stops half-way

def write_chunks(f, chunks):
    if os.path.basename(f.name).startswith(".checkpoint-000002"):
        data = b"".join(bytes(c) for c in chunks)
        f.write(data[:len(data) // 2])
        f.flush()
        print("WRITING", flush=True)
        time.sleep(pause)
    real(f, chunks)

checkpoint.write_chunks = write_chunks
"""


def test_kill_9_during_a_checkpoint_write_then_resume(tmp_path, trained):
    """SIGKILL while the second checkpoint is half written: one temporary file and the first checkpoint are left;
    --resume removes the temporary file and ends as the uninterrupted run did."""
    path = write_config(tmp_path, epochs=3)
    out = tmp_path / "out"
    p = popen_train([path, "600"], harness=SLOW_SECOND_CHECKPOINT)
    try:
        wait_for_line(p.stdout, "WRITING")
        p.kill()
    finally:
        p.wait(60)
    assert p.returncode == -signal.SIGKILL
    assert temp_files(out) == [f".checkpoint-000002.safetensors.dlnet-tmp-{p.pid}"]
    assert [os.path.basename(q) for _, q in checkpoint.checkpoints(str(out))] == ["checkpoint-000001.safetensors"]
    r = dlnet_train([path, "--resume"])
    assert r.returncode == 0, r.stderr
    assert f"removed 1 temporary file(s) an interrupted run left in {out}" in r.stdout
    assert f"resumed from {out / 'checkpoint-000001.safetensors'}: epoch 2, step 0" in r.stdout
    assert temp_files(out) == []
    final = checkpoint.read_checkpoint(checkpoint.checkpoints(str(out))[0][1])[0]
    straight = checkpoint.read_checkpoint(checkpoint.checkpoints(str(trained[1]))[0][1])[0]
    for name in straight:
        np.testing.assert_array_equal(final[name], straight[name], err_msg=name)


def test_sigterm_during_a_checkpoint_write_leaves_no_temporary_file(tmp_path):
    """The first SIGTERM waits for the write (it is held until the step ends); a second one stops the write at
    once, and its temporary file goes with it."""
    path = write_config(tmp_path, epochs=3)
    out = tmp_path / "out"
    p = popen_train([path, "600"], harness=SLOW_SECOND_CHECKPOINT)
    try:
        wait_for_line(p.stdout, "WRITING")
        assert len(temp_files(out)) == 1
        p.send_signal(signal.SIGTERM)
        time.sleep(1)  # two signals sent at once may arrive as one
        p.send_signal(signal.SIGTERM)
        p.wait(60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 143, p.stderr.read()
    assert temp_files(out) == []
    assert [os.path.basename(q) for _, q in checkpoint.checkpoints(str(out))] == ["checkpoint-000001.safetensors"]
    assert checkpoint.read_checkpoint(str(out / "checkpoint-000001.safetensors"))[1]["epoch"] == 1


def test_stale_temporary_files_of_live_processes_are_kept(tmp_path):
    keeper = subprocess.Popen(["sleep", "60"])
    try:
        names = [f".checkpoint-000004.safetensors.dlnet-tmp-{keeper.pid}", ".metrics.csv.dlnet-tmp-999999999",
                 f".model.onnx.dlnet-tmp-{os.getpid()}", "notes.dlnet-tmp-1", ".x.dlnet-tmp-12a"]
        for name in names:
            (tmp_path / name).write_bytes(b"x")
        removed = checkpoint.remove_stale_temps(str(tmp_path))
        assert removed == [".metrics.csv.dlnet-tmp-999999999", f".model.onnx.dlnet-tmp-{os.getpid()}"]
        assert sorted(os.listdir(tmp_path)) == sorted(set(names) - set(removed))
    finally:
        keeper.kill()
        keeper.wait()
