"""A small training setup the `dlnet train` tests share: a linear classifier, a dataset it can learn, a config, and a
way to run the real command in a subprocess (with an optional test harness run first in that process)."""
import functools
import os
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SIDE = 16  # 1 x 16 x 16 images: a checkpoint of ~10 KB (larger than the 4 KiB of the full-disk test's tmpfs)
CLASSES = 3


def linear_model(path, side=SIDE, classes=CLASSES, weight="w", seed=1, bias=True):
    """Flatten -> Gemm: [n, 1, side, side] -> [n, classes] logits."""
    rng = np.random.default_rng(seed)
    n_in = side * side
    w = numpy_helper.from_array((rng.standard_normal((n_in, classes)) * 0.05).astype(np.float32), weight)
    b = numpy_helper.from_array(np.zeros(classes, np.float32), "b")
    nodes = [helper.make_node("Flatten", ["x"], ["f"]),
             helper.make_node("Gemm", ["f", weight, "b"] if bias else ["f", weight], ["y"])]
    graph = helper.make_graph(nodes, "lin", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                            ["n", 1, side, side])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", classes])],
                              [w, b] if bias else [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7), str(path))
    return str(path)


def dataset(path, n=40, side=SIDE, seed=0):
    """Random pixels, and each class a bright band of rows of its own (learnable in an epoch)."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % CLASSES
    x = rng.random((n, 1, side, side)).astype(np.float32) * 0.2
    band = side // CLASSES
    for i, k in enumerate(y):
        x[i, 0, k * band:(k + 1) * band] += 0.5
    np.savez(path, x=x, y=y.astype(np.int64))
    return str(path)


def write_config(tmp_path, epochs=2, output="out", lr=0.1, extra="", name="c.yaml"):
    """tmp_path/c.yaml training the linear model on 40 images: 30 to train, 3 steps of 8 per epoch."""
    if not (tmp_path / "m.onnx").exists():
        linear_model(tmp_path / "m.onnx")
        dataset(tmp_path / "d.npz")
    p = tmp_path / name
    p.write_text(f"model: m.onnx\ndataset: {{path: d.npz, val_split: 0.25}}\nbatch_size: 8\nepochs: {epochs}\n"
                 f"optimizer: {{name: sgd, lr: {lr}, momentum: 0.9}}\noutput: {output}\nseed: 5\n{extra}")
    return str(p)


def dlnet_train(args, harness="", timeout=240, prefix=(), **kw):
    """`dlnet train ARGS` in a new process (after the Python in `harness`, e.g. a monkeypatch); CompletedProcess."""
    code = harness + "\nfrom dlnet.cli.main import main\nmain()\n"
    return subprocess.run([*prefix, sys.executable, "-c", code, "train", *args], capture_output=True, text=True,
                          timeout=timeout, **kw)


def popen_train(args, harness=""):
    code = harness + "\nfrom dlnet.cli.main import main\nmain()\n"
    return subprocess.Popen([sys.executable, "-c", code, "train", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for_line(stream, marker, timeout=120):
    """Read `stream` until a line holding `marker` (in a thread, so a stuck process fails the test in time)."""
    import threading
    found, lines = threading.Event(), []

    def read():
        for line in stream:
            lines.append(line)
            if marker in line:
                found.set()
                return

    threading.Thread(target=read, daemon=True).start()
    assert found.wait(timeout), f"no {marker!r} in {timeout} s; read: {''.join(lines)}"


def temp_files(folder):
    return sorted(f for f in os.listdir(folder) if ".dlnet-tmp-" in f)


@functools.lru_cache(maxsize=None)
def can_unshare():
    """Whether this machine lets an unprivileged user and mount namespace mount a tmpfs (for real read-only and
    full-disk folders)."""
    try:
        r = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /tmp"],
                           capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0
