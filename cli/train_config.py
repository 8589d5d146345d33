"""The training config's schema, written once: dataclasses whose fields carry type, default, range and meaning.

It drives validation (`read_config`, `load_config`), the error messages (each names the key and what was expected),
`dlnet train --show-config` (`show_config`) and docs/config.md (`config_markdown`; regenerate it with
`python -m dlnet.cli.train_config > docs/config.md`).
"""
import dataclasses
import math
import os
import re
import stat
import types
import typing
from dataclasses import dataclass, field

from dlnet.errors import ConfigError
from dlnet.losses import LOSSES

MAX_BYTES = 1 << 20  # a config is a few hundred bytes; a bigger file is a mistake or an attack
MAX_SIDE = 16384  # preprocess.resize: beyond this one image would take gigabytes


def spec(doc, default=None, *, required=False, ge=None, gt=None, le=None, lt=None, choices=None, length=None):
    """A field: its meaning (doc), default, and what is allowed (a range for numbers and list elements, choices for
    strings, a length for lists). required: no default; the key must be given."""
    meta = {"doc": doc, "required": required, "ge": ge, "gt": gt, "le": le, "lt": lt, "choices": choices,
            "length": length}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def section(cls, doc):
    return field(default_factory=cls, metadata={"doc": doc})


@dataclass
class Dataset:
    path: str = spec("an .npz holding arrays x (float images N x C x H x W) and y (int labels N), or a folder with "
                     "one sub-folder of images per class (sorted names give the class indices); relative to the "
                     "config's folder", required=True)
    val_split: float = spec("fraction of the images held out for validation (split once, by seed)", 0.1, ge=0, lt=1)


@dataclass
class Preprocess:
    resize: list[int] | None = spec("[height, width] every image of a folder dataset is resized to at load",
                                    length=2, ge=1, le=MAX_SIDE)
    random_crop: list[int] | None = spec("[pad]: pad by zeros, then crop back to the image size at a random offset "
                                         "per image (CIFAR style)", length=1, ge=0, le=MAX_SIDE)
    flip: bool = spec("random horizontal flips, one draw per image", False)
    mean: float | list[float] = spec("subtracted from the [0, 1] pixels: one value, or one per channel", 0.0)
    std: float | list[float] = spec("the pixels are divided by it after the mean: one value, or one per channel",
                                    1.0, gt=0)


@dataclass
class Optimizer:
    name: str = spec("the optimizer", "adam", choices=("sgd", "adam", "adamw"))
    lr: float = spec("base learning rate", 1e-3, gt=0)
    momentum: float = spec("sgd's momentum", 0.0, ge=0, lt=1)
    nesterov: bool = spec("sgd: Nesterov momentum", False)
    weight_decay: float = spec("L2 penalty (adamw: decoupled decay)", 0.0, ge=0)
    clip_norm: float | None = spec("clip the gradient's global L2 norm to this; null: no clipping (a NaN or Inf "
                                   "norm stops training either way)", gt=0)


@dataclass
class Schedule:
    name: str = spec("learning-rate schedule: none (constant), step (times gamma every step_size epochs) or "
                     "cosine (to zero over all epochs)", "none", choices=("none", "step", "cosine"))
    step_size: int = spec("step: epochs between decays", 1, ge=1)
    gamma: float = spec("step: the factor of each decay", 0.1, gt=0, le=1)
    warmup: int = spec("optimizer steps of linear warm-up from lr / warmup to lr (any schedule)", 0, ge=0)


@dataclass
class TrainConfig:
    model: str = spec("the ONNX model to train (its initializers are the weights); relative to the config's "
                      "folder", required=True)
    dataset: Dataset = section(Dataset, "the images and labels")
    preprocess: Preprocess = section(Preprocess, "loading, augmentation and normalisation")
    batch_size: int = spec("images per optimizer step", 32, ge=1)
    epochs: int = spec("passes over the training images (may grow on --resume)", 1, ge=1)
    loss: str = spec("the loss on the model's first output", "cross_entropy", choices=LOSSES)
    label_smoothing: float = spec("class losses: weight moved from the true class to all classes", 0.0, ge=0, lt=1)
    optimizer: Optimizer = section(Optimizer, "the optimizer")
    schedule: Schedule = section(Schedule, "the learning-rate schedule")
    output: str = spec("the run folder: checkpoints, metrics.csv, metrics.png, model.onnx; relative to the "
                       "config's folder", "runs/train")
    device: str | None = spec("ocl:N, gpu or cpu; null: DLNET_DEVICE, else the first GPU, else the first CPU "
                              "(may change on --resume)")
    seed: int = spec("seeds the validation split, the epochs' orders, augmentation and dropout", 0, ge=0,
                     lt=2 ** 32)
    precision: str = spec("fp32, tf32 (NVIDIA's tensor cores for the products) or fp16: activations stored in half "
                          "where the kernels take it, float32 master weights, and a dynamic loss scale (as PyTorch's "
                          "autocast with GradScaler)", "fp32", choices=("fp32", "tf32", "fp16"))
    loss_scale_interval: int = spec("fp16: good steps in a row after which the loss scale doubles (a step with an "
                                    "inf or NaN gradient is skipped and halves it; GradScaler's growth_interval)",
                                    2000, ge=1)
    sync_bn: bool = spec("several processes (mpirun, --procs): BatchNormalization normalises by the global batch's "
                         "statistics, forward and backward, as PyTorch's SyncBatchNorm (N ranks train as one process); "
                         "false: each rank by its own shard's, and rank 0's running statistics are saved", False)


# keys whose value may differ between a checkpoint's config and the config given with --resume, and why
MAY_CHANGE_ON_RESUME = {
    "epochs": "to train longer (not fewer epochs than the checkpoint has done); a cosine schedule is stretched over "
              "the new total from the step reached",
    "device": "the weights and optimizer state are plain arrays; another device rounds differently",
    "output": "it is the folder the checkpoint was found in (the config may have moved)",
}


# validation --------------------------------------------------------------------------------------------------------
def _alternatives(hint):
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def _scalar(v, kind):
    """v as `kind` (None, bool, int, float, str), or raise ValueError."""
    if kind is type(None) and v is None:
        return v
    if kind in (bool, str) and isinstance(v, kind):
        return v
    if kind in (int, float) and isinstance(v, int) and not isinstance(v, bool):
        return kind(v)
    if kind is float and isinstance(v, float):
        return v
    raise ValueError


def _convert(v, kind, meta):
    if typing.get_origin(kind) is list:
        (elem,) = typing.get_args(kind)
        if not isinstance(v, list) or meta.get("length") not in (None, len(v)):
            raise ValueError
        return [_scalar(e, elem) for e in v]
    return _scalar(v, kind)


def _kind_name(kind, meta):
    if kind is type(None):
        return "null"
    if typing.get_origin(kind) is list:
        (elem,) = typing.get_args(kind)
        n = f"{meta['length']} " if meta.get("length") else ""
        return f"a list of {n}{_kind_name(elem, meta)}"
    bounds = [f"{op} {meta[k]}" for k, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
              if meta.get(k) is not None and kind in (int, float)]
    return " ".join([kind.__name__, " and ".join(bounds)]).strip()


def describe(hint, meta):
    """What a field takes, in words: 'int >= 1', 'a list of 2 int >= 1 and <= 16384 or null', 'one of sgd, adam'."""
    if meta.get("choices"):
        return "one of " + ", ".join(meta["choices"])
    return " or ".join(_kind_name(k, meta) for k in _alternatives(hint))


def _show(v):
    text = repr(v)
    return (type(v).__name__ + " " if not isinstance(v, (list, dict)) else "") + \
        (text if len(text) <= 60 else text[:57] + "...")


def _in_range(x, meta):
    if isinstance(x, float) and not math.isfinite(x):
        return False
    checks = {"ge": lambda b: x >= b, "gt": lambda b: x > b, "le": lambda b: x <= b, "lt": lambda b: x < b}
    return all(meta.get(k) is None or ok(meta[k]) for k, ok in checks.items())


def _check_value(v, hint, meta, name, path):
    for kind in _alternatives(hint):
        try:
            out = _convert(v, kind, meta)
        except ValueError:
            continue
        numbers = out if isinstance(out, list) else [out]
        bad = [x for x in numbers if isinstance(x, (int, float)) and not isinstance(x, bool)
               and not _in_range(x, meta)]
        choices = meta.get("choices")
        if bad or (choices and out not in choices) or (isinstance(out, str) and not out):
            break
        return out
    raise ConfigError(f"{path}: key {name!r} is {_show(v)}, expected {describe(hint, meta)}")


def _validate(cls, raw, where, path):
    names = [f.name for f in dataclasses.fields(cls)]
    if not isinstance(raw, dict):
        what = f"key {where[:-1]!r}" if where else "the file"
        got = _show(raw) if not isinstance(raw, list) else f"list {_show(raw)}"
        raise ConfigError(f"{path}: {what} must be a mapping of {', '.join(names)}, got {got}")
    for key in raw:
        if key not in names:
            raise ConfigError(f"{path}: unknown key {where + str(key)!r}; expected one of {', '.join(names)}")
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        name, hint = where + f.name, hints[f.name]
        if dataclasses.is_dataclass(hint):
            values[f.name] = _validate(hint, {} if raw.get(f.name) is None else raw[f.name], name + ".", path)
        elif f.name in raw:
            values[f.name] = _check_value(raw[f.name], hint, f.metadata, name, path)
        elif f.metadata["required"]:
            raise ConfigError(f"{path}: missing key {name!r} ({describe(hint, f.metadata)})")
    return cls(**values)


# reading -----------------------------------------------------------------------------------------------------------
def _read_text(path):
    """The file's text: a regular file of at most MAX_BYTES (a FIFO or a device is refused, never waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{path}: not a regular file")
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_BYTES >> 20} MiB; a training config is a few hundred bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start})") from None


def _loader():
    import yaml

    class StrictLoader(yaml.SafeLoader):
        """SafeLoader that refuses aliases (a few nested ones expand exponentially: an alias bomb) and merge keys,
        and names a duplicate key instead of keeping its last value."""

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise yaml.composer.ComposerError(
                    None, None, f"alias *{event.anchor}: aliases are not allowed in a training config (write the "
                    "value out)", event.start_mark)
            return super().compose_node(parent, index)

        def construct_mapping(self, node, deep=False):
            seen = {}
            for key_node, _ in node.value if isinstance(node, yaml.MappingNode) else ():
                if key_node.tag == "tag:yaml.org,2002:merge":
                    raise yaml.constructor.ConstructorError(None, None, "merge keys (<<) are not allowed in a "
                                                            "training config", key_node.start_mark)
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.setdefault(key, line)
                except TypeError:  # unhashable: SafeLoader names it
                    continue
                if first != line:
                    raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r} (first on line "
                                                            f"{first})", key_node.start_mark)
            return super().construct_mapping(node, deep)

    # YAML 1.2 reads 1e-3 as a float; PyYAML's YAML 1.1 rules want a dot (1.0e-3) and would make it a string
    exponent = re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+$")
    StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", exponent, list("-+0123456789"))
    return StrictLoader


def parse_yaml(text, path):
    """The YAML document in `text`, through the strict loader; any problem is a ConfigError naming the line."""
    import yaml
    try:
        return yaml.load(text, Loader=_loader())
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}: " if mark else ""
        context = f" ({e.context})" if e.context and e.problem else ""
        raise ConfigError(f"{path}: {where}{e.problem or e.context}{context}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply for a training config") from None


def read_config(path):
    """The config as written, checked, with every default filled in: a dict shaped as TrainConfig (paths as
    written)."""
    raw = parse_yaml(_read_text(path), path)
    return dataclasses.asdict(_validate(TrainConfig, {} if raw is None else raw, "", path))


def resolve_paths(cfg, path):
    """A copy of `cfg` whose model, dataset.path and output are absolute, relative to the config's folder."""
    base = os.path.dirname(os.path.abspath(path))
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in cfg.items()}
    out["model"] = os.path.join(base, cfg["model"])
    out["output"] = os.path.join(base, cfg["output"])
    out["dataset"]["path"] = os.path.join(base, cfg["dataset"]["path"])
    return out


def load_config(path):
    """The config, checked, with defaults filled in and its paths made absolute."""
    return resolve_paths(read_config(path), path)


def flatten(cfg, where=""):
    """{'optimizer.lr': 0.003, ...}"""
    out = {}
    for key, v in cfg.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{where}{key}."))
        else:
            out[where + key] = v
    return out


def config_changes(old, new):
    """[(dotted key, old value, new value)] that differ, the keys in MAY_CHANGE_ON_RESUME left out."""
    a, b = flatten(old), flatten(new)
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b))
            if k not in MAY_CHANGE_ON_RESUME and a.get(k) != b.get(k)]


def show_config(cfg, path):
    """The resolved config as YAML that `dlnet train` reads back."""
    import yaml
    head = f"# {path}, checked, with every default filled in and its paths made absolute\n"
    return head + yaml.safe_dump(cfg, sort_keys=False, default_flow_style=None)


# docs/config.md ------------------------------------------------------------------------------------------------------
DOC_HEAD = """# The training config

<!-- Generated from cli/train_config.py (the schema) by `python -m dlnet.cli.train_config > docs/config.md`;
tests/cli/test_train_config.py checks that it is up to date. -->

`dlnet train CONFIG.yaml` reads one YAML mapping. Every key below is optional unless marked required; a key that is
not listed, a value of the wrong type or out of range, a duplicate key, an alias (`*name`) or merge key (`<<`), and a
file over 1 MiB are errors that name the key (or line) and what was expected. `dlnet train --show-config CONFIG`
prints the config with every default filled in. Paths are relative to the config's folder. Numbers such as `3e-4`
read as floats (YAML 1.2; PyYAML alone would want `3.0e-4`).

| key | type | default | meaning |
|---|---|---|---|
"""

DOC_TAIL = """
## The run folder

`output` holds `checkpoint-NNNNNN.safetensors` (the last two; written after every epoch and on Ctrl-C or SIGTERM),
`metrics.csv` (rewritten after every epoch), `metrics.png` (with matplotlib: `pip install -e '.[plot]'`) and, once
every epoch is done, `model.onnx`. Each file is written to a temporary `.NAME.dlnet-tmp-PID` beside it and renamed
into place; a run removes the temporary files that killed runs left behind. A folder that exists and is not empty
is refused unless `--resume` (continue from its newest good checkpoint) or `--force` (start over: dlnet's own files
in it are removed) is given.

A checkpoint is a safetensors file (tensors and a JSON header, never code) whose header holds a SHA-256 of every
byte. A newest checkpoint that is corrupt or cut short is reported on stderr and the one before it is used.
`checkpoint.pkl` files of older dlnet versions are refused unread.

## Resuming

`dlnet train CONFIG --resume` needs the checkpoint's config: any other changed key is an error that names it.
These may change:

"""


def _default_text(f):
    if f.metadata["required"]:
        return "required"
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return "null" if default is None else f"`{default!r}`".replace("'", "").replace("True", "true").replace(
        "False", "false")


def _rows(cls, where):
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            rows.append(f"| **`{where}{f.name}`** | mapping | | {f.metadata['doc']} |")
            rows += _rows(hint, f"{where}{f.name}.")
        else:
            rows.append(f"| `{where}{f.name}` | {describe(hint, f.metadata)} | {_default_text(f)} | "
                        f"{f.metadata['doc']} |")
    return rows


def config_markdown():
    """docs/config.md, from the schema."""
    changes = "".join(f"- `{k}`: {why}\n" for k, why in MAY_CHANGE_ON_RESUME.items())
    return DOC_HEAD + "\n".join(_rows(TrainConfig, "")) + "\n" + DOC_TAIL + changes


if __name__ == "__main__":
    print(config_markdown(), end="")
