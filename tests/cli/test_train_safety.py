"""`dlnet train` loses nothing: a NaN or Inf stops it with the step and keeps the last good checkpoint; a run folder
is never overwritten by mistake, never left empty by a failed run; a read-only or full folder is one line naming the
file; progress, metrics.csv and the plot say how the run goes."""
import csv
import io
import os
import sys

import numpy as np
import pytest
from dlnet.cli import checkpoint
from dlnet.cli import train as train_cli

import dlnet
from dlnet.errors import ConfigError, DlnetError

from .train_util import can_unshare, dataset, dlnet_train, linear_model, temp_files, write_config


def quiet(line):
    pass


def names(out):
    return [os.path.basename(p) for _, p in checkpoint.checkpoints(str(out))]


# NaN and Inf ---------------------------------------------------------------------------------------------------------
def test_a_huge_learning_rate_stops_at_the_step_it_diverges(tmp_path):
    path = write_config(tmp_path, lr=1e38)
    r = dlnet_train([path])
    assert r.returncode == 2, r.stdout + r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"dlnet: error: {path}: training diverged at epoch 1, step ")
    assert "/3 (step " in line and "loss " in line and "no checkpoint was written; nothing exported" in line
    assert "epoch 1/2" not in r.stdout
    assert not (tmp_path / "out").exists()  # nothing was written into the folder this run made: it goes too


NAN_IN_EPOCH_2 = """
from dlnet.cli import train
real = train.augment
calls = []

def augment(x, cfg, rng):
    calls.append(1)
    out = real(x, cfg, rng)
    if len(calls) == 5:  # epoch 2, step 2 (3 steps an epoch)
        out[0, 0, 3, 3] = float("nan")
    return out

train.augment = augment
"""


def test_nan_in_epoch_2_keeps_epoch_1s_checkpoint_and_exports_nothing(tmp_path):
    path = write_config(tmp_path, epochs=3)
    out = tmp_path / "out"
    r = dlnet_train([path], harness=NAN_IN_EPOCH_2)
    assert r.returncode == 2, r.stdout + r.stderr
    good = out / "checkpoint-000001.safetensors"
    assert r.stderr.strip().splitlines() == [
        f"dlnet: error: {path}: training diverged at epoch 2, step 2/3 (step 5 overall): loss nan; the last good "
        f"checkpoint is {good}; nothing exported (lower optimizer.lr, or set optimizer.clip_norm)"]
    assert "epoch 1/3" in r.stdout and "epoch 2/3" not in r.stdout
    assert sorted(os.listdir(out)) == ["checkpoint-000001.safetensors", "metrics.csv"]
    tensors, state = checkpoint.read_checkpoint(str(good))
    assert state["epoch"] == 1 and state["step"] == 3
    assert all(np.isfinite(a).all() for a in tensors.values())
    # the good checkpoint continues the run
    rows = train_cli.run_training(path, resume=True, echo=quiet)
    assert [r["epoch"] for r in rows] == [1, 2, 3] and (out / "model.onnx").exists()


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # validation of the poisoned weights
def test_weights_that_went_bad_with_a_finite_loss_are_never_saved(tmp_path, monkeypatch):
    """The loss a step returns is from before its update: NaN weights after a finite last step of an epoch must not
    reach the epoch's checkpoint."""
    path = write_config(tmp_path, epochs=2)
    real_step = dlnet.Trainer.step
    calls = []

    def step(self, feeds):
        loss = real_step(self, feeds)
        calls.append(1)
        if len(calls) == 6:  # epoch 2's last step: its update poisoned one weight
            w = self.net.state_dict()["w"]
            w[7, 1] = np.inf
            self.net.load_state_dict({"w": w})
        return loss

    monkeypatch.setattr(dlnet.Trainer, "step", step)
    with pytest.raises(ConfigError, match=r"diverged at epoch 2, step 3/3 \(step 6 overall\): weight 'w' is not "
                                          r"finite; the last good checkpoint is .*checkpoint-000001.safetensors"):
        train_cli.run_training(path, echo=quiet)
    assert names(tmp_path / "out") == ["checkpoint-000001.safetensors"]
    assert not (tmp_path / "out" / "model.onnx").exists()


def trainer_on_linear(tmp_path, clip_norm):
    net = dlnet.Net(dlnet.Context()).load_onnx(linear_model(tmp_path / "m.onnx"))
    opt = dlnet.optim.SGD(lr=0.01, clip_norm=clip_norm)
    return net, dlnet.Trainer(net, loss="cross_entropy", optimizer=opt)


def test_grad_norm_is_the_gradients_norm_and_inf_when_it_overflows(tmp_path):
    net, trainer = trainer_on_linear(tmp_path, clip_norm=1e6)
    rng = np.random.default_rng(7)
    x = rng.random((8, 1, 16, 16)).astype(np.float32)
    y = rng.integers(0, 3, 8)
    weights = net.state_dict()
    trainer.step({"x": x, "target": y})
    # reference: d(mean cross-entropy)/d(w, b) of Flatten -> Gemm, in float64
    f = x.reshape(8, -1).astype(np.float64)
    logits = f @ weights["w"] + weights["b"]
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    d = (p - np.eye(3)[y]) / 8
    ref = np.sqrt(np.sum((f.T @ d) ** 2) + np.sum(d.sum(0) ** 2))
    assert abs(trainer.grad_norm - ref) / ref < 1e-4, (trainer.grad_norm, ref)
    x[2, 0, 5, 5] = 1e30  # finite input, finite loss, a gradient whose squares overflow float32
    loss = trainer.step({"x": x, "target": y})
    assert np.isfinite(loss) and trainer.grad_norm == np.inf
    _, plain = trainer_on_linear(tmp_path, clip_norm=None)
    plain.step({"x": x, "target": y})
    assert plain.grad_norm is None  # without clipping nothing computes it


def test_an_infinite_gradient_norm_stops_training(tmp_path):
    path = write_config(tmp_path, extra="")
    text = open(path).read().replace("momentum: 0.9}", "momentum: 0.9, clip_norm: 1.0}")
    open(path, "w").write(text)
    d = np.load(tmp_path / "d.npz")
    x = d["x"].copy()
    x[:, 0, 0, 0] = 1e30  # every image: the first step's gradient overflows
    np.savez(tmp_path / "d.npz", x=x, y=d["y"])
    with pytest.raises(ConfigError, match=r"diverged at epoch 1, step 1/3 \(step 1 overall\): gradient norm inf"):
        train_cli.run_training(path, echo=quiet)
    assert not (tmp_path / "out").exists()


# the run folder ------------------------------------------------------------------------------------------------------
def test_an_existing_run_folder_is_refused_without_force(tmp_path):
    path = write_config(tmp_path, epochs=1)
    train_cli.run_training(path, echo=quiet)
    out = tmp_path / "out"
    before = {f: (out / f).read_bytes() for f in os.listdir(out)}
    r = dlnet_train([path])
    assert r.returncode == 2
    listed = sorted(before)  # metrics.png only where matplotlib is installed
    shown = ", ".join(listed[:3]) + (", ..." if len(listed) > 3 else "")
    assert shown.startswith("checkpoint-000001.safetensors, metrics.csv, ")
    assert r.stderr.strip().splitlines() == [
        f"dlnet: error: output {out}: the run folder exists ({shown}); continue it with --resume or start it over "
        f"with --force"]
    assert {f: (out / f).read_bytes() for f in os.listdir(out)} == before
    with pytest.raises(ConfigError, match="--resume and --force: give one"):
        train_cli.run_training(path, resume=True, force=True, echo=quiet)
    (out / "notes.txt").write_text("mine")
    (out / "checkpoint-000007.safetensors").write_bytes(b"an old run's")
    rows = train_cli.run_training(path, force=True, echo=quiet)
    assert len(rows) == 1
    assert sorted(os.listdir(out)) == sorted(list(before) + ["notes.txt"])  # the old run's checkpoint is gone
    assert (out / "notes.txt").read_text() == "mine"  # only dlnet's own files go


def test_an_empty_existing_folder_is_used(tmp_path):
    path = write_config(tmp_path, epochs=1)
    out = tmp_path / "out"
    out.mkdir()
    stale = ".checkpoint-000001.safetensors.dlnet-tmp-999999999"  # all a run killed in its first write leaves
    (out / stale).write_bytes(b"half")
    lines = []
    assert len(train_cli.run_training(path, echo=lines.append)) == 1
    assert f"removed 1 temporary file(s) an interrupted run left in {out}" in lines
    assert temp_files(out) == [] and names(out) == ["checkpoint-000001.safetensors"]


def test_a_late_error_leaves_no_folder_behind(tmp_path):
    path = write_config(tmp_path, output="runs/deep/out")
    dataset(tmp_path / "d.npz", side=5)  # the model takes 16 x 16 images: the first step says no
    with pytest.raises(DlnetError):
        train_cli.run_training(path, echo=quiet)
    assert not (tmp_path / "runs").exists()  # the run folder and the parents this run made


def test_disk_full_in_process_names_the_checkpoint(tmp_path, monkeypatch):
    path = write_config(tmp_path, epochs=1)

    def full(f, chunks):
        f.write(b"x" * 100)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "write_chunks", full)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ConfigError) as e:
        train_cli.run_training(path, echo=quiet)
    assert str(e.value) == f"{out / 'checkpoint-000001.safetensors'}: could not write it (No space left on device)"
    assert os.listdir(out) == []


needs_unshare = pytest.mark.skipif(not can_unshare(), reason="no unprivileged user and mount namespaces here")
IN_NAMESPACE = 'd="$1"; shift; {mount} && "$@"; rc=$?; echo LISTING; ls -A "$d"; exit $rc'


@needs_unshare
def test_a_full_disk_is_one_line_naming_the_checkpoint(tmp_path):
    path = write_config(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    script = IN_NAMESPACE.format(mount='mount -t tmpfs -o size=4k tmpfs "$d"')  # a checkpoint is ~10 KB
    r = dlnet_train([path], prefix=("unshare", "-rm", "sh", "-c", script, "sh", str(out)))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [
        f"dlnet: error: {out / 'checkpoint-000001.safetensors'}: could not write it (No space left on device)"]
    assert r.stdout.split("LISTING\n")[1] == ""  # the temporary file is gone


@pytest.mark.skipif(not can_unshare() and os.geteuid() == 0, reason="root writes anywhere, and no namespaces here")
def test_a_read_only_run_folder_is_one_line_and_keeps_the_checkpoint(tmp_path):
    path = write_config(tmp_path, epochs=1)
    train_cli.run_training(path, echo=quiet)
    out = tmp_path / "out"
    text = open(path).read()
    open(path, "w").write(text.replace("epochs: 1", "epochs: 2"))
    before = {f: (out / f).read_bytes() for f in os.listdir(out)}
    if can_unshare():  # a read-only mount, as root or not
        script = IN_NAMESPACE.format(mount='mount --bind "$d" "$d" && mount -o remount,bind,ro "$d"')
        r = dlnet_train([path, "--resume"], prefix=("unshare", "-rm", "sh", "-c", script, "sh", str(out)))
        reason = "Read-only file system"
    else:  # a folder without write permission, for a user who is not root
        os.chmod(out, 0o555)
        try:
            r = dlnet_train([path, "--resume"])
        finally:
            os.chmod(out, 0o755)
        reason = "Permission denied"
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [f"dlnet: error: output {out}: the run folder is not writable ({reason})"]
    assert {f: (out / f).read_bytes() for f in os.listdir(out)} == before


# progress, metrics, plot ---------------------------------------------------------------------------------------------
class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_on_a_terminal_only():
    pytest.importorskip("tqdm")
    tty = Terminal()
    bar = train_cli.progress_bar(24, 8, "epoch 2/5", stream=tty)
    for loss in (0.75, 0.5):
        bar.set_postfix_str(f"loss {loss:.4f}", refresh=False)
        bar.update(8)
    bar.refresh()
    text = tty.getvalue()
    bar.close()
    assert "epoch 2/5" in text and "24/24" in text and "img/s" in text and "loss 0.5000" in text
    assert "<00:00" in text or "<?" in text  # the time left
    pipe = io.StringIO()
    bar = train_cli.progress_bar(24, 0, "epoch 1/5", stream=pipe)
    bar.update(8)
    bar.close()
    assert pipe.getvalue() == ""


def test_without_tqdm_there_is_no_bar_and_the_epoch_lines_stay(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    assert isinstance(train_cli.progress_bar(10, 0, "x", stream=Terminal()), train_cli._NoBar)
    path = write_config(tmp_path, epochs=2)
    lines = []
    train_cli.run_training(path, echo=lines.append)
    assert [line.split(":")[0] for line in lines if line.startswith("epoch")] == ["epoch 1/2", "epoch 2/2"]


def test_training_on_a_terminal_draws_a_bar_per_epoch(tmp_path, monkeypatch):
    pytest.importorskip("tqdm")
    tty = Terminal()
    monkeypatch.setattr(sys, "stderr", tty)
    path = write_config(tmp_path, epochs=2)
    train_cli.run_training(path, echo=quiet)
    text = tty.getvalue()
    assert "epoch 1/2" in text and "epoch 2/2" in text and "img/s" in text and "loss " in text


def test_metrics_csv_is_written_after_every_epoch(tmp_path):
    path = write_config(tmp_path, epochs=3)
    seen = []

    def echo(line):
        if line.startswith("epoch "):
            with open(tmp_path / "out" / "metrics.csv") as f:
                seen.append(list(csv.DictReader(f)))

    rows = train_cli.run_training(path, echo=echo)
    assert [len(s) for s in seen] == [1, 2, 3]
    assert list(seen[2][0]) == list(train_cli.METRICS)
    for got, row in zip(seen[2], rows):
        assert abs(float(got["train_loss"]) - row["train_loss"]) <= 1e-12 * abs(row["train_loss"])
        assert 0 <= float(got["train_accuracy"]) <= 1 and 0 <= float(got["val_accuracy"]) <= 1


def test_the_plot_shows_loss_and_accuracy_with_labelled_axes(tmp_path, monkeypatch):
    matplotlib = pytest.importorskip("matplotlib")
    import matplotlib.figure
    figures = []
    real = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: (figures.append(fig),
                                                                                    real(fig, *a, **k)))
    rows = [{"epoch": e, "train_loss": 1.0 / e, "val_loss": 1.2 / e, "train_accuracy": 0.5 + e / 10,
             "val_accuracy": 0.4 + e / 10} for e in (1, 2, 3)]
    assert train_cli.write_plot(str(tmp_path), rows)
    assert (tmp_path / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (fig,) = figures
    axes = {ax.get_ylabel(): ax for ax in fig.axes}
    assert set(axes) == {"loss", "accuracy"} and all(ax.get_xlabel() == "epoch" for ax in fig.axes)
    for what, ax in axes.items():
        assert [t.get_text() for t in ax.get_legend().get_texts()] == [f"train {what}", f"validation {what}"]
        lines = {line.get_label(): line.get_ydata() for line in ax.get_lines()}
        np.testing.assert_allclose(lines[f"validation {what}"], [r[f"val_{what}"] for r in rows])


def test_without_matplotlib_the_hint_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    path = write_config(tmp_path, epochs=1)
    lines = []
    train_cli.run_training(path, echo=lines.append)
    assert "matplotlib is not installed: no plot (pip install -e '.[plot]' in dlnet's folder)" in lines
    assert not (tmp_path / "out" / "metrics.png").exists() and (tmp_path / "out" / "model.onnx").exists()
    assert temp_files(tmp_path / "out") == []
