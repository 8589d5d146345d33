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
