"""The training config: one schema (cli/train_config.py) drives validation, its messages, --show-config and
docs/config.md."""
import dataclasses
import os
import time
import typing

import pytest
import yaml
from click.testing import CliRunner
from dlnet.cli import train_config
from dlnet.cli.main import cli
from dlnet.cli.train import load_config

from dlnet.errors import ConfigError

from .conftest import ROOT
from .train_util import dlnet_train, write_config

BASE = "model: m.onnx\ndataset: {path: d.npz}\n"


def test_unknown_and_mistyped_keys_are_named(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("model: m.onnx\ndataset: {path: d.npz}\nbatchsize: 3\n")
    with pytest.raises(ConfigError, match="unknown key 'batchsize'; expected one of .*batch_size"):
        load_config(str(p))
    p.write_text("model: m.onnx\ndataset: {path: d.npz}\noptimizer: {lr: fast}\n")
    with pytest.raises(ConfigError, match="'optimizer.lr' is str 'fast', expected float > 0"):
        load_config(str(p))


@pytest.mark.parametrize("extra,message", [
    ("optimizer: {lrate: 0.1}\n", r"unknown key 'optimizer.lrate'; expected one of name, lr, momentum"),
    ("preprocess: {flip: true, crop: [2]}\n", r"unknown key 'preprocess.crop'; expected one of resize, random_crop"),
    ("dataset: {path: d.npz, valsplit: 0.1}\n", r"unknown key 'dataset.valsplit'; expected one of path, val_split"),
    ("optimizer: 3\n", r"key 'optimizer' must be a mapping of name, lr, .* got int 3"),
    ("epochs: true\n", r"key 'epochs' is bool True, expected int >= 1"),
    ("batch_size: 1.5\n", r"key 'batch_size' is float 1.5, expected int >= 1"),
    ("preprocess: {flip: 1}\n", r"key 'preprocess.flip' is int 1, expected bool"),
    ("preprocess: {resize: [8, x]}\n", r"key 'preprocess.resize' is \[8, 'x'\], expected a list of 2 int >= 1"),
    ("preprocess: {resize: [8]}\n", r"key 'preprocess.resize' is \[8\], expected a list of 2 int"),
    ("preprocess: {mean: [0.5, yes]}\n", r"key 'preprocess.mean' is \[0.5, True\], expected float or a list of float"),
    ("optimizer: {clip_norm: big}\n", r"key 'optimizer.clip_norm' is str 'big', expected float > 0 or null"),
    ("optimizer: {name: adamax}\n", r"key 'optimizer.name' is str 'adamax', expected one of sgd, adam, adamw"),
    ("loss: hinge\n", r"key 'loss' is str 'hinge', expected one of cross_entropy, nll, mse"),
    ("schedule: {name: linear}\n", r"key 'schedule.name' is str 'linear', expected one of none, step, cosine"),
    ("device: ''\n", r"key 'device' is str '', expected str or null"),
])
def test_nested_and_mistyped_keys_are_named(tmp_path, extra, message):
    p = tmp_path / "c.yaml"
    text = BASE + extra if not extra.startswith("dataset") else "model: m.onnx\n" + extra
    p.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(str(p))


# every range the issue names, written out, then every bound of the schema, generated from it
@pytest.mark.parametrize("extra,key,expected", [
    ("batch_size: 0", "batch_size", "int >= 1"),
    ("batch_size: -5", "batch_size", "int >= 1"),
    ("epochs: 0", "epochs", "int >= 1"),
    ("dataset: {path: d.npz, val_split: 1.0}", "dataset.val_split", "float >= 0 and < 1"),
    ("dataset: {path: d.npz, val_split: -0.1}", "dataset.val_split", "float >= 0 and < 1"),
    ("optimizer: {lr: 0}", "optimizer.lr", "float > 0"),
    ("optimizer: {lr: -0.1}", "optimizer.lr", "float > 0"),
    ("optimizer: {lr: .nan}", "optimizer.lr", "float > 0"),
    ("optimizer: {lr: .inf}", "optimizer.lr", "float > 0"),
    ("optimizer: {momentum: 1.0}", "optimizer.momentum", "float >= 0 and < 1"),
    ("optimizer: {weight_decay: -1e-4}", "optimizer.weight_decay", "float >= 0"),
    ("optimizer: {clip_norm: 0}", "optimizer.clip_norm", "float > 0 or null"),
    ("schedule: {step_size: 0}", "schedule.step_size", "int >= 1"),
    ("schedule: {gamma: 0}", "schedule.gamma", "float > 0 and <= 1"),
    ("schedule: {gamma: 1.5}", "schedule.gamma", "float > 0 and <= 1"),
    ("schedule: {warmup: -1}", "schedule.warmup", "int >= 0"),
    ("label_smoothing: 1", "label_smoothing", "float >= 0 and < 1"),
    ("preprocess: {std: 0}", "preprocess.std", "float > 0 or a list of float > 0"),
    ("preprocess: {std: [0.5, 0]}", "preprocess.std", "float > 0 or a list of float > 0"),
    ("preprocess: {mean: .nan}", "preprocess.mean", "float or a list of float"),
    ("preprocess: {resize: [0, 8]}", "preprocess.resize", "a list of 2 int >= 1 and <= 16384 or null"),
    ("preprocess: {random_crop: [-1]}", "preprocess.random_crop", "a list of 1 int >= 0 and <= 16384 or null"),
    ("seed: -1", "seed", "int >= 0 and < 4294967296"),
])
def test_out_of_range_values_are_named(tmp_path, extra, key, expected):
    p = tmp_path / "c.yaml"
    p.write_text(("model: m.onnx\n" if extra.startswith("dataset") else BASE) + extra + "\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(p))
    assert f"key {key!r} is " in str(e.value) and str(e.value).endswith(f"expected {expected}"), str(e.value)


def _bounds():
    """(dotted key, a value just outside one of its bounds) for every numeric bound in the schema."""
    out = []

    def walk(cls, where):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            hint = hints[f.name]
            if dataclasses.is_dataclass(hint):
                walk(hint, f"{where}{f.name}.")
                continue
            kinds = typing.get_args(hint) or (hint,)
            number = next((k for k in kinds if k in (int, float)), None)
            elem = next((typing.get_args(k)[0] for k in kinds if typing.get_origin(k) is list), None)
            step = 1 if (number or elem) is int else 1e-9
            for bound, outside in (("ge", -step), ("gt", 0), ("le", step), ("lt", 0)):
                b = f.metadata.get(bound)
                if b is None:
                    continue
                v = (number or elem)(b + outside)
                value = v if number else [v] * (f.metadata.get("length") or 1)
                out.append((where + f.name, value))

    walk(train_config.TrainConfig, "")
    return out


BOUNDS = _bounds()


def test_the_generated_bounds_cover_the_schema():
    keys = {k for k, _ in BOUNDS}
    assert {"batch_size", "epochs", "dataset.val_split", "optimizer.lr", "preprocess.resize", "seed"} <= keys
    assert len(BOUNDS) >= 20


@pytest.mark.parametrize("key,value", BOUNDS, ids=[f"{k}={v}" for k, v in BOUNDS])
def test_every_bound_of_the_schema_is_checked(tmp_path, key, value):
    raw = yaml.safe_load(BASE)
    section, _, leaf = key.rpartition(".")
    (raw.setdefault(section, {}) if section else raw)[leaf] = value
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=rf"key '{key}' is .*, expected "):
        load_config(str(p))


def test_values_inside_the_bounds_are_kept(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("model: m.onnx\nbatch_size: 1\nepochs: 1\nlabel_smoothing: 0\noptimizer: {lr: 1e-9, momentum: 0.99}\n"
                 "schedule: {gamma: 1, warmup: 0}\ndataset: {path: d.npz, val_split: 0}\nseed: 4294967295\n")
    cfg = load_config(str(p))
    assert cfg["batch_size"] == 1 and cfg["optimizer"]["lr"] == 1e-9 and cfg["dataset"]["val_split"] == 0.0
    assert cfg["schedule"]["gamma"] == 1.0 and cfg["seed"] == 2 ** 32 - 1
    p.write_text(BASE + "optimizer: {lr: 3e-4, weight_decay: 5E+0}\n")  # YAML 1.2 floats, no dot needed
    assert load_config(str(p))["optimizer"]["lr"] == 3e-4 and load_config(str(p))["optimizer"]["weight_decay"] == 5.0


def test_missing_model_is_named(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("dataset: {path: d.npz}\n")
    with pytest.raises(ConfigError, match="missing key 'model'"):
        load_config(str(p))
    p.write_text("model: m.onnx\n")
    with pytest.raises(ConfigError, match="missing key 'dataset.path'"):
        load_config(str(p))


def test_lists_are_converted(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(BASE + "preprocess: {resize: [8, 6], mean: [0, 0.5, 1], std: 2}\n")
    cfg = load_config(str(p))
    assert cfg["preprocess"]["resize"] == [8, 6]
    assert cfg["preprocess"]["mean"] == [0.0, 0.5, 1.0] and cfg["preprocess"]["std"] == 2.0
    assert cfg["model"] == os.path.join(str(tmp_path), "m.onnx")


@pytest.mark.parametrize("text,message", [
    (BASE + "epochs: 2\nbatch_size: 4\nepochs: 3\n", r"line 5: duplicate key 'epochs' \(first on line 3\)"),
    ("model: m.onnx\ndataset:\n  path: d.npz\n  path: e.npz\n", r"line 4: duplicate key 'path' \(first on line 3\)"),
    (BASE + "preprocess:\n  mean: &m 0.5\n  std: *m\n", r"line 5: alias \*m: aliases are not allowed"),
    (BASE + "optimizer:\n  <<: {lr: 0.1}\n", r"line 4: merge keys \(<<\) are not allowed"),
    ("- model\n- m.onnx\n", r"the file must be a mapping of model, dataset, .* got list"),
    ("model: [unclosed\n", r"line 2: .*"),
    ("[" * 5000 + "]" * 5000, r"nested too deeply|line 1"),
])
def test_yaml_problems_are_named_with_their_line(tmp_path, text, message):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(str(p))


def test_alias_bomb_fails_fast(tmp_path):
    """A billion-laughs document: nine levels of nine aliases each would expand to 9^9 strings."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for k in range(1, 10):
        lines.append(f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * 9)}]")
    p = tmp_path / "bomb.yaml"
    p.write_text(BASE + "\n".join(lines) + "\n")
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=r"bomb.yaml: line 4: alias \*a0: aliases are not allowed"):
        load_config(str(p))
    assert time.perf_counter() - t0 < 5.0  # refused at the first alias, long before any expansion


def test_size_cap_and_special_files(tmp_path):
    p = tmp_path / "big.yaml"
    p.write_text(BASE + "# " + "x" * train_config.MAX_BYTES + "\n")
    with pytest.raises(ConfigError, match=r"big.yaml: larger than 1 MiB"):
        load_config(str(p))
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match=r"fifo.yaml: not a regular file"):
        load_config(str(fifo))  # no writer: opening it for reading would wait forever
    with pytest.raises(ConfigError, match=r"missing.yaml: No such file"):
        load_config(str(tmp_path / "missing.yaml"))
    (tmp_path / "bin.yaml").write_bytes(b"model: \xff\xfe\n")
    with pytest.raises(ConfigError, match=r"bin.yaml: not UTF-8 text"):
        load_config(str(tmp_path / "bin.yaml"))


def test_cli_config_error_is_one_line_exit_2(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(BASE + "optimizer: {name: adam, lrate: 0.1}\n")
    result = CliRunner().invoke(cli, ["train", str(p)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("dlnet: error: ") and "'optimizer.lrate'" in lines[0] and "lr" in lines[0]
    assert "Traceback" not in result.output


def test_range_error_from_the_real_command(tmp_path):
    path = write_config(tmp_path, extra="batch_size: 0\n", name="zero.yaml")
    text = open(path).read().replace("batch_size: 8\n", "")
    open(path, "w").write(text)
    r = dlnet_train([path])
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [f"dlnet: error: {path}: key 'batch_size' is int 0, expected int >= 1"]
    assert not (tmp_path / "out").exists()


def test_show_config_prints_the_resolved_config(tmp_path):
    path = write_config(tmp_path)
    r = dlnet_train(["--show-config", path])
    assert r.returncode == 0, r.stderr
    shown = yaml.safe_load(r.stdout)
    assert shown == load_config(path)
    assert shown["optimizer"] == {"name": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": False, "weight_decay": 0.0,
                                  "clip_norm": None}
    assert shown["schedule"]["name"] == "none" and shown["loss"] == "cross_entropy"
    assert shown["output"] == str(tmp_path / "out") and not (tmp_path / "out").exists()
    again = tmp_path / "again.yaml"  # what it prints is a config dlnet reads back as the same
    again.write_text(r.stdout)
    assert load_config(str(again)) == shown


def test_docs_config_md_is_generated_from_the_schema():
    with open(os.path.join(ROOT, "docs", "config.md")) as f:
        text = f.read()
    assert text == train_config.config_markdown(), \
        "docs/config.md is stale: python -m dlnet.cli.train_config > docs/config.md"
    for f in dataclasses.fields(train_config.Optimizer):
        assert f"`optimizer.{f.name}`" in text
