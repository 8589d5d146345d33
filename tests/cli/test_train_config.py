import pytest
from dlnet.cli.train import load_config

from dlnet.errors import ConfigError


def test_unknown_and_mistyped_keys_are_named(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("model: m.onnx\ndataset: {path: d.npz}\nbatchsize: 3\n")
    with pytest.raises(ConfigError, match="unknown key 'batchsize'; expected one of .*batch_size"):
        load_config(str(p))
    p.write_text("model: m.onnx\ndataset: {path: d.npz}\noptimizer: {lr: fast}\n")
    with pytest.raises(ConfigError, match="'optimizer.lr' is str 'fast', expected float"):
        load_config(str(p))


BASE = "model: m.onnx\ndataset: {path: d.npz}\n"


@pytest.mark.parametrize("extra,message", [
    ("optimizer: {lrate: 0.1}\n", r"unknown key 'optimizer.lrate'; expected one of name, lr, momentum"),
    ("preprocess: {flip: true, crop: [2]}\n", r"unknown key 'preprocess.crop'; expected one of resize, random_crop"),
    ("dataset: {path: d.npz, valsplit: 0.1}\n", r"unknown key 'dataset.valsplit'; expected one of path, val_split"),
    ("optimizer: 3\n", r"key 'optimizer' must be a mapping of name, lr, .* got int 3"),
    ("epochs: true\n", r"key 'epochs' is bool True, expected int"),
    ("batch_size: 1.5\n", r"key 'batch_size' is float 1.5, expected int"),
    ("preprocess: {flip: 1}\n", r"key 'preprocess.flip' is int 1, expected bool"),
    ("preprocess: {resize: [8, x]}\n", r"key 'preprocess.resize' is \[8, 'x'\], expected a list of 2 int"),
    ("preprocess: {resize: [8]}\n", r"key 'preprocess.resize' is \[8\], expected a list of 2 int"),
    ("preprocess: {mean: [0.5, yes]}\n", r"key 'preprocess.mean' is \[0.5, True\], expected a list of float"),
    ("optimizer: {clip_norm: big}\n", r"key 'optimizer.clip_norm' is str 'big', expected float or NoneType"),
])
def test_nested_and_mistyped_keys_are_named(tmp_path, extra, message):
    p = tmp_path / "c.yaml"
    text = BASE + extra if not extra.startswith("dataset") else "model: m.onnx\n" + extra
    p.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(str(p))


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


def test_cli_config_error_is_one_line_exit_2(tmp_path):
    from click.testing import CliRunner
    from dlnet.cli.main import cli
    p = tmp_path / "c.yaml"
    p.write_text(BASE + "optimizer: {name: adam, lrate: 0.1}\n")
    result = CliRunner().invoke(cli, ["train", str(p)])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("dlnet: error: ") and "'optimizer.lrate'" in lines[0] and "lr" in lines[0]
    assert "Traceback" not in result.output
