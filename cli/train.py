"""`dlnet train config.yaml`: train an ONNX model from a YAML config, with checkpoints and exact resume."""
import csv
import hashlib
import json
import os
import pickle
import signal
import threading
import time

import click
import numpy as np

from dlnet.errors import ConfigError

from .common import command_errors

# key: (type(s), default); a dict value is a nested section
SCHEMA = {
    "model": (str, None),
    "dataset": {"path": (str, None), "val_split": (float, 0.1)},
    # resize: [height, width] at load; random_crop: [pad]: pad by zeros, then crop back to the image size at a random
    # offset per image (CIFAR style); flip: random horizontal flips; mean/std: per channel or one for all
    "preprocess": {"resize": (list, None), "random_crop": (list, None), "flip": (bool, False),
                   "mean": ((float, list), 0.0), "std": ((float, list), 1.0)},
    "batch_size": (int, 32),
    "epochs": (int, 1),
    "loss": (str, "cross_entropy"),
    "label_smoothing": (float, 0.0),
    "optimizer": {"name": (str, "adam"), "lr": (float, 1e-3), "momentum": (float, 0.0), "nesterov": (bool, False),
                  "weight_decay": (float, 0.0), "clip_norm": ((float, type(None)), None)},
    "schedule": {"name": (str, "none"), "step_size": (int, 1), "gamma": (float, 0.1), "warmup": (int, 0)},
    "output": (str, "runs/train"),
    "device": ((str, type(None)), None),
    "seed": (int, 0),
}


# list keys: the type and count of their elements
LISTS = {"preprocess.resize": (int, 2), "preprocess.random_crop": (int, 1), "preprocess.mean": (float, None),
         "preprocess.std": (float, None)}


def _check_list(name, v, path):
    elem, count = LISTS[name]
    ok = all(isinstance(e, (int, float) if elem is float else int) and not isinstance(e, bool) for e in v)
    if not ok or (count is not None and len(v) != count):
        n = f"{count} " if count is not None else ""
        raise ConfigError(f"{path}: key {name!r} is {v!r}, expected a list of {n}{elem.__name__}")
    return [elem(e) for e in v]


def _check(cfg, schema, where, path):
    if not isinstance(cfg, dict):
        what = f"key {where[:-1]!r}" if where else "the file"
        raise ConfigError(f"{path}: {what} must be a mapping of {', '.join(schema)}, got {type(cfg).__name__} "
                          f"{cfg!r}")
    out = {}
    for key in cfg:
        if key not in schema:
            raise ConfigError(f"{path}: unknown key {where + key!r}; expected one of {', '.join(schema)}")
    for key, spec in schema.items():
        name = where + key
        if isinstance(spec, dict):
            section = cfg.get(key)
            out[key] = _check({} if section is None else section, spec, name + ".", path)
            continue
        types, default = spec
        if key not in cfg:
            if default is None and types is str:
                raise ConfigError(f"{path}: missing key {name!r} ({types.__name__})")
            out[key] = default
            continue
        v = cfg[key]
        types = types if isinstance(types, tuple) else (types,)
        if float in types and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
            raise ConfigError(f"{path}: key {name!r} is {type(v).__name__} {v!r}, expected "
                              f"{' or '.join(t.__name__ for t in types)}")
        if isinstance(v, list) and name in LISTS:
            v = _check_list(name, v, path)
        out[key] = v
    return out


def load_config(path):
    import yaml
    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({e})") from None
    cfg = _check(raw or {}, SCHEMA, "", path)
    base = os.path.dirname(os.path.abspath(path))
    for key in ("model", "output"):
        cfg[key] = os.path.join(base, cfg[key])
    cfg["dataset"]["path"] = os.path.join(base, cfg["dataset"]["path"])
    return cfg


def load_dataset(cfg, channels=3):
    """(x float32 [N, C, H, W], y int64 [N], class names). A folder holds one sub-folder per class (sorted names
    give the class indices); its images are read as grey (channels 1) or RGB, scaled to [0, 1]."""
    p = cfg["dataset"]["path"]
    if p.endswith(".npz"):
        try:
            d = np.load(p)
            x, y = d["x"].astype(np.float32), d["y"]
        except (OSError, KeyError, ValueError) as e:
            raise ConfigError(f"dataset.path {p!r}: expected an .npz with arrays x and y ({e})") from None
        return x, y, [str(c) for c in range(int(y.max()) + 1 if y.ndim == 1 and len(y) else 0)]
    if os.path.isdir(p):
        from PIL import Image, UnidentifiedImageError
        classes = sorted(c for c in os.listdir(p) if os.path.isdir(os.path.join(p, c)))
        size = cfg["preprocess"]["resize"]
        xs, ys = [], []
        for k, c in enumerate(classes):
            for f in sorted(os.listdir(os.path.join(p, c))):
                if f.startswith("."):
                    continue
                file = os.path.join(p, c, f)
                try:
                    im = Image.open(file).convert("L" if channels == 1 else "RGB")
                except (OSError, UnidentifiedImageError) as e:
                    raise ConfigError(f"dataset {file}: not a readable image ({e})") from None
                if size:
                    im = im.resize((size[1], size[0]), Image.BILINEAR)
                a = np.asarray(im, np.float32) / 255.0
                a = a[None] if a.ndim == 2 else a.transpose(2, 0, 1)
                if xs and a.shape != xs[0].shape:
                    raise ConfigError(f"dataset {file}: image is {a.shape[2]}x{a.shape[1]}, the first one "
                                      f"{xs[0].shape[2]}x{xs[0].shape[1]}; set preprocess.resize: [height, width]")
                xs.append(a)
                ys.append(k)
        if not xs:
            raise ConfigError(f"dataset.path {p!r}: no images in class sub-folders")
        return np.stack(xs), np.array(ys, np.int64), classes
    raise ConfigError(f"dataset.path {p!r}: expected an .npz with arrays x, y or a folder with a sub-folder per class")


def augment(x, cfg, rng):
    """Random horizontal flips and pad-and-crop, one draw per image from `rng`, then normalise."""
    pre = cfg["preprocess"]
    if pre["flip"]:
        flip = rng.random(len(x)) < 0.5
        x = np.where(flip[:, None, None, None], x[..., ::-1], x)
    if pre["random_crop"]:
        pad = int(pre["random_crop"][0])
        h, w = x.shape[2], x.shape[3]
        xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        offsets = rng.integers(0, 2 * pad + 1, (len(x), 2))
        x = np.stack([xp[i, :, dy:dy + h, dx:dx + w] for i, (dy, dx) in enumerate(offsets)]) if len(x) else x
    return normalise(x, cfg)


def normalise(x, cfg):
    mean = np.asarray(cfg["preprocess"]["mean"], np.float32).reshape(-1, 1, 1)
    std = np.asarray(cfg["preprocess"]["std"], np.float32).reshape(-1, 1, 1)
    return np.ascontiguousarray((x - mean) / std, dtype=np.float32)


def make_optimizer(cfg, steps_per_epoch):
    from dlnet import optim
    o, s = cfg["optimizer"], cfg["schedule"]
    total = steps_per_epoch * cfg["epochs"]
    schedule = {"none": lambda: optim.Warmup(s["warmup"]) if s["warmup"] else None,
                "step": lambda: optim.StepLR(s["step_size"] * steps_per_epoch, s["gamma"], s["warmup"]),
                "cosine": lambda: optim.Cosine(total, warmup=s["warmup"])}.get(s["name"])
    if schedule is None:
        raise ConfigError(f"schedule.name {s['name']!r}: expected none, step or cosine")
    kw = dict(lr=o["lr"], weight_decay=o["weight_decay"], schedule=schedule(), clip_norm=o["clip_norm"])
    if o["name"] == "sgd":
        return optim.SGD(momentum=o["momentum"], nesterov=o["nesterov"], **kw)
    if o["name"] in ("adam", "adamw"):
        return (optim.Adam if o["name"] == "adam" else optim.AdamW)(**kw)
    raise ConfigError(f"optimizer.name {o['name']!r}: expected sgd, adam or adamw")


def save_checkpoint(path, state):
    """Atomic: a temporary file beside `path`, fsynced, then os.replace; a failed write leaves the old checkpoint
    and no temporary file behind."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    try:  # make the rename itself durable
        fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class _DeferInterrupt:
    """Ctrl-C during training: a first SIGINT is held until the running step ends (a step half-enqueued would leave
    the weights half-updated, and the checkpoint could not continue exactly); a second one interrupts at once."""

    def __init__(self):
        self.requested = False
        self.previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._handler)
        return self

    def _handler(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def check(self):
        if self.requested:
            self.requested = False
            raise KeyboardInterrupt

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
        return False


def run_training(config_path, resume=False, echo=print):
    """Train as the config says; returns the per-epoch metric rows. A checkpoint is written atomically after every
    epoch and on Ctrl-C (mid-epoch: with the epoch's order and position), so --resume continues exactly: the same
    seed gives the same loss curve as an uninterrupted run."""
    import dlnet
    cfg = load_config(config_path)
    cfg_hash = hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]
    os.makedirs(cfg["output"], exist_ok=True)
    net = dlnet.Net(dlnet.Context(cfg["device"])).load_onnx(cfg["model"])
    run = _TrainingRun(cfg, cfg_hash, net, echo)
    if resume:
        run.resume()
    run.train()
    write_metrics(cfg["output"], run.rows, echo)
    net.save_onnx(os.path.join(cfg["output"], "model.onnx"))
    return run.rows


class _TrainingRun:
    """One training run: the data split, the trainer, and where the run stands (epoch, position in the epoch, metric
    rows), which a checkpoint saves and --resume restores."""

    def __init__(self, cfg, cfg_hash, net, echo):
        import dlnet
        self.cfg, self.cfg_hash, self.net, self.echo = cfg, cfg_hash, net, echo
        self.name = net.inputs[0].name
        in_shape = net.inputs[0].shape
        channels = in_shape[1] if len(in_shape) == 4 and isinstance(in_shape[1], int) else 3
        x, y, classes = load_dataset(cfg, channels)
        echo(f"dataset: {len(x)} images, {len(classes)} classes, {' x '.join(str(d) for d in x.shape[1:])}")
        split_rng = np.random.default_rng(cfg["seed"])
        order = split_rng.permutation(len(x))
        nval = int(len(x) * cfg["dataset"]["val_split"])
        self.nval = nval
        self.xv, self.yv, self.xt, self.yt = x[order[:nval]], y[order[:nval]], x[order[nval:]], y[order[nval:]]
        self.bs = cfg["batch_size"]
        self.steps = max(len(self.xt) // self.bs, 1)
        self.trainer = dlnet.Trainer(net, loss=cfg["loss"], optimizer=make_optimizer(cfg, self.steps),
                                     label_smoothing=cfg["label_smoothing"], seed=cfg["seed"])
        self.rng = np.random.default_rng(cfg["seed"] + 1)
        self.ckpt = os.path.join(cfg["output"], "checkpoint.pkl")
        self.rows, self.start = [], 0
        # where an interrupted epoch stopped: its order, the next step and the loss summed so far
        self.position = {"perm": None, "step": 0, "total": 0.0}

    def resume(self):
        """Continue from the output folder's checkpoint, where there is one."""
        ckpt = self.ckpt
        if not os.path.exists(ckpt):
            self.echo(f"no checkpoint in {self.cfg['output']}: starting from scratch")
            return
        try:
            with open(ckpt, "rb") as f:
                state = pickle.load(f)
        except (OSError, pickle.UnpicklingError, EOFError) as e:
            raise ConfigError(f"{ckpt}: not a readable checkpoint ({e})") from None
        if state["config_hash"] != self.cfg_hash:
            raise ConfigError(f"{ckpt}: written with another config (hash {state['config_hash']}, "
                              f"now {self.cfg_hash})")
        self.net.load_state_dict(state["weights"])
        self.trainer.load_optimizer_state(state["optimizer"])
        self.trainer.step_count = state["step"]
        self.rng.bit_generator.state = state["rng"]
        self.rows, self.start = state["rows"], state["epoch"]
        self.position = state.get("position") or self.position
        self.echo(f"resumed from {ckpt}: epoch {self.start + 1}, step {self.position['step']}")

    def checkpoint(self, epoch):
        save_checkpoint(self.ckpt, {"weights": self.net.state_dict(), "optimizer": self.trainer.optimizer_state(),
                                    "step": self.trainer.step_count, "rng": self.rng.bit_generator.state,
                                    "config_hash": self.cfg_hash, "epoch": epoch, "rows": self.rows,
                                    "position": self.position})

    def train(self):
        """The remaining epochs; on Ctrl-C, a checkpoint and exit status 130."""
        try:
            with _DeferInterrupt() as interrupt:
                for epoch in range(self.start, self.cfg["epochs"]):
                    self.train_epoch(epoch, interrupt)
        except KeyboardInterrupt:
            # raised between steps (see _DeferInterrupt): the weights, step count and position agree
            done = len(self.rows)
            self.checkpoint(done)
            self.echo(f"interrupted: checkpoint after {done} epochs and {self.position['step']} steps in "
                      f"{self.ckpt}; continue with --resume")
            raise SystemExit(130) from None

    def train_epoch(self, epoch, interrupt):
        """The epoch's remaining steps, then validation, a metric row and a checkpoint."""
        cfg, bs, steps = self.cfg, self.bs, self.steps
        t0 = time.perf_counter()
        if self.position["perm"] is None:
            self.position = {"perm": self.rng.permutation(len(self.xt)), "step": 0, "total": 0.0}
        perm, first = self.position["perm"], self.position["step"]
        for k in range(first, steps):
            idx = perm[k * bs:(k + 1) * bs]
            xb = augment(self.xt[idx], cfg, self.rng)
            loss = self.trainer.step({self.name: xb, "target": self.yt[idx]})
            self.position = {"perm": perm, "step": k + 1, "total": self.position["total"] + loss}
            interrupt.check()
        dt = time.perf_counter() - t0
        m = (self.trainer.evaluate({self.name: normalise(self.xv, cfg), "target": self.yv}) if self.nval
             else {"loss": float("nan")})
        row = {"epoch": epoch + 1, "train_loss": self.position["total"] / steps, "val_loss": m["loss"],
               "val_accuracy": m.get("accuracy", float("nan")), "images_per_s": (steps - first) * bs / dt}
        self.rows.append(row)
        self.position = {"perm": None, "step": 0, "total": 0.0}
        self.checkpoint(epoch + 1)
        self.echo(f"epoch {epoch + 1}/{cfg['epochs']}: loss {row['train_loss']:.4f}  "
                  f"{row['images_per_s']:.0f} img/s  val loss {row['val_loss']:.4f}  val acc {row['val_accuracy']:.3f}")


def write_metrics(output, rows, echo):
    """metrics.csv, and metrics.png where matplotlib is installed."""
    with open(os.path.join(output, "metrics.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["epoch"])
        w.writeheader()
        w.writerows(rows)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots()
        ax.plot([r["epoch"] for r in rows], [r["train_loss"] for r in rows], label="train loss")
        ax.plot([r["epoch"] for r in rows], [r["val_loss"] for r in rows], label="val loss")
        ax.legend()
        fig.savefig(os.path.join(output, "metrics.png"))
    except ImportError:
        echo("matplotlib is not installed: no plot (pip install 'dlnet[plot]')")


@click.command()
@click.argument("config", type=click.Path())
@click.option("--resume", is_flag=True, help="continue from the output dir's checkpoint")
@command_errors
def train(config, resume):
    """Train an ONNX model as CONFIG (YAML) says."""
    run_training(config, resume, echo=click.echo)
