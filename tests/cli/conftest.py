import csv
import io
import os
import shutil

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.path.join(ROOT, "models")
DIGITS_MODEL = os.path.join(MODELS, "digits.onnx")
DIGITS_DIR = os.path.join(MODELS, "digits")
DIGITS_LABELS = os.path.join(MODELS, "digits_labels.txt")


@pytest.fixture
def runner():
    return CliRunner()


@pytest.fixture
def digits_copy(tmp_path):
    """The 10 shipped test digits, copied into tmp_path/images."""
    d = tmp_path / "images"
    shutil.copytree(DIGITS_DIR, d)
    return d


@pytest.fixture(scope="session")
def rgb_softmax_model(tmp_path_factory):
    """A 3-channel 8x8 classifier ending in Softmax: GlobalAveragePool -> Flatten -> Gemm(4 classes) -> Softmax."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32) * 3, "w")
    b = numpy_helper.from_array(np.array([0.1, -0.2, 0.3, 0.0], np.float32), "b")
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "w", "b"], ["g"], transB=1),
             helper.make_node("Softmax", ["g"], ["y"], axis=1)]
    graph = helper.make_graph(nodes, "rgb", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    path = tmp_path_factory.mktemp("models") / "rgb_softmax.onnx"
    onnx.save(model, str(path))
    return str(path)


def parse_csv(text, with_errors=False):
    """[(path, [(class, label, score), ...])] from `dlnet infer` CSV output, its header checked; a failed image's
    list is empty; with_errors=True adds each row's error text as a third item."""
    lines = list(csv.reader(io.StringIO(text)))
    if not lines:
        return []
    header = lines[0]
    assert header[0] == "path" and header[-1] == "error" and (len(header) - 2) % 3 == 0, header
    rows = []
    for f in lines[1:]:
        assert len(f) == len(header), (header, f)
        top = [(int(f[i]), f[i + 1], float(f[i + 2])) for i in range(1, len(f) - 1, 3) if f[i] != ""]
        rows.append((f[0], top, f[-1]) if with_errors else (f[0], top))
    return rows
