"""`dlnet train config.yaml`: train an ONNX model from a YAML config, with checkpoints and exact resume."""
import csv
import hashlib
import json
import os
import pickle
import time

import click
import numpy as np

from dlnet.errors import ConfigError, DlnetError

# key: (type(s), default); a dict value is a nested section
SCHEMA = {
    "model": (str, None),
    "dataset": {"path": (str, None), "val_split": (float, 0.1)},
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


def _check(cfg, schema, where, path):
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: {where or 'the file'} must be a mapping, got {type(cfg).__name__}")
    out = {}
    for key in cfg:
        if key not in schema:
            raise ConfigError(f"{path}: unknown key {where + key!r}; expected one of {', '.join(schema)}")
    for key, spec in schema.items():
        name = where + key
        if isinstance(spec, dict):
            out[key] = _check(cfg.get(key) or {}, spec, name + ".", path)
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


def load_dataset(cfg):
    p = cfg["dataset"]["path"]
    if p.endswith(".npz"):
        d = np.load(p)
        return d["x"].astype(np.float32), d["y"]
    if os.path.isdir(p):
        from PIL import Image
        classes = sorted(c for c in os.listdir(p) if os.path.isdir(os.path.join(p, c)))
        size = cfg["preprocess"]["resize"]
        xs, ys = [], []
        for k, c in enumerate(classes):
            for f in sorted(os.listdir(os.path.join(p, c))):
                im = Image.open(os.path.join(p, c, f)).convert("RGB")
                if size:
                    im = im.resize((size[1], size[0]))
                xs.append(np.asarray(im, np.float32).transpose(2, 0, 1) / 255.0)
                ys.append(k)
        return np.stack(xs), np.array(ys, np.int64)
    raise ConfigError(f"dataset.path {p!r}: expected an .npz with arrays x, y or a folder with a sub-folder per class")


def augment(x, cfg, rng):
    pre = cfg["preprocess"]
    if pre["flip"]:
        flip = rng.random(len(x)) < 0.5
        x = np.where(flip[:, None, None, None], x[..., ::-1], x)
    if pre["random_crop"]:
        pad = int(pre["random_crop"][0])
        xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        dy, dx = rng.integers(0, 2 * pad + 1, 2)
        x = xp[:, :, dy:dy + x.shape[2], dx:dx + x.shape[3]]
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
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        pickle.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def run_training(config_path, resume=False, echo=print):
    import dlnet
    cfg = load_config(config_path)
    cfg_hash = hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]
    os.makedirs(cfg["output"], exist_ok=True)
    x, y = load_dataset(cfg)
    split_rng = np.random.default_rng(cfg["seed"])
    order = split_rng.permutation(len(x))
    nval = int(len(x) * cfg["dataset"]["val_split"])
    xv, yv, xt, yt = x[order[:nval]], y[order[:nval]], x[order[nval:]], y[order[nval:]]
    bs = cfg["batch_size"]
    steps = max(len(xt) // bs, 1)
    net = dlnet.Net(dlnet.Context(cfg["device"])).load_onnx(cfg["model"])
    trainer = dlnet.Trainer(net, loss=cfg["loss"], optimizer=make_optimizer(cfg, steps),
                            label_smoothing=cfg["label_smoothing"], seed=cfg["seed"])
    name = net.inputs[0].name
    rng = np.random.default_rng(cfg["seed"] + 1)
    ckpt = os.path.join(cfg["output"], "checkpoint.pkl")
    rows, start = [], 0
    if resume and os.path.exists(ckpt):
        with open(ckpt, "rb") as f:
            state = pickle.load(f)
        if state["config_hash"] != cfg_hash:
            raise ConfigError(f"{ckpt}: written with another config (hash {state['config_hash']}, now {cfg_hash})")
        net.load_state_dict(state["weights"])
        trainer.load_optimizer_state(state["optimizer"])
        trainer.step_count = state["step"]
        rng.bit_generator.state = state["rng"]
        rows, start = state["rows"], state["epoch"]

    def checkpoint(epoch):
        save_checkpoint(ckpt, {"weights": net.state_dict(), "optimizer": trainer.optimizer_state(),
                               "step": trainer.step_count, "rng": rng.bit_generator.state, "config_hash": cfg_hash,
                               "epoch": epoch, "rows": rows})

    epoch = start
    try:
        for epoch in range(start, cfg["epochs"]):
            t0, total = time.perf_counter(), 0.0
            perm = rng.permutation(len(xt))
            for k in range(steps):
                idx = perm[k * bs:(k + 1) * bs]
                xb = augment(xt[idx], cfg, rng)
                total += trainer.step({name: xb, "target": yt[idx]})
            dt = time.perf_counter() - t0
            m = trainer.evaluate({name: normalise(xv, cfg), "target": yv}) if nval else {"loss": float("nan")}
            row = {"epoch": epoch + 1, "train_loss": total / steps, "val_loss": m["loss"],
                   "val_accuracy": m.get("accuracy", float("nan")), "images_per_s": steps * bs / dt}
            rows.append(row)
            echo(f"epoch {epoch + 1}/{cfg['epochs']}: loss {row['train_loss']:.4f}  {row['images_per_s']:.0f} img/s  "
                 f"val loss {row['val_loss']:.4f}  val acc {row['val_accuracy']:.3f}")
            checkpoint(epoch + 1)
    except KeyboardInterrupt:
        checkpoint(epoch)
        echo(f"interrupted: checkpoint at epoch {epoch} in {ckpt}; continue with --resume")
        raise SystemExit(130)
    with open(os.path.join(cfg["output"], "metrics.csv"), "w", newline="") as f:
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
        fig.savefig(os.path.join(cfg["output"], "metrics.png"))
    except ImportError:
        echo("matplotlib is not installed: no plot (pip install 'dlnet[plot]')")
    net.save_onnx(os.path.join(cfg["output"], "model.onnx"))
    return rows


@click.command()
@click.argument("config", type=click.Path())
@click.option("--resume", is_flag=True, help="continue from the output dir's checkpoint")
@click.option("--debug", is_flag=True, help="show tracebacks")
def train(config, resume, debug):
    """Train an ONNX model as CONFIG (YAML) says."""
    try:
        run_training(config, resume, echo=click.echo)
    except DlnetError as e:
        if debug:
            raise
        click.echo(f"error: {e}", err=True)
        raise SystemExit(1)
