"""The CPU device's worker threads: Context(threads=N) / Options(threads=N) / --threads set PoCL's count once per
process, before the platform starts; another count later is a ConfigError. A fresh count needs a fresh process, so
the counts themselves are checked in subprocesses."""
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner
from dlnet.cli import main as cli_main

import dlnet
from dlnet.errors import ConfigError
from dlnet.kernels.device import fix_threads

from ..conftest import context

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIGITS = os.path.join(ROOT, "models", "digits.onnx")

CHILD = """
import json, os, sys
import numpy as np, onnxruntime as ort
import dlnet
from dlnet.errors import ConfigError
threads = int(sys.argv[1])
ctx = dlnet.Context("cpu", options=dlnet.Options(threads=threads)) if sys.argv[2] == "options" else \\
    dlnet.Context("cpu", threads=threads)
found = {"threads": ctx.threads, "compute_units": ctx.dev.compute_units, "units": ctx.device.max_compute_units,
         "env": os.environ.get("POCL_MAX_PTHREAD_COUNT")}
try:
    dlnet.Context("cpu", threads=threads + 1)
    found["other"] = "accepted"
except ConfigError as e:
    found["other"] = str(e)
found["default"] = dlnet.Context("cpu").threads
x = np.random.default_rng().standard_normal((3, 1, 16, 16)).astype(np.float32)
net = dlnet.Net(ctx).load_onnx(sys.argv[3])
got = net.run({net.inputs[0].name: x})
ref = ort.InferenceSession(sys.argv[3]).run(None, {net.inputs[0].name: x})[0]
y = list(got.values())[0]
found["err"] = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
print(json.dumps(found))
"""


def _child(threads, how):
    env = {k: v for k, v in os.environ.items() if not k.startswith("POCL_MAX_PTHREAD") and k != "POCL_CPU_MAX_CU_NUM"}
    out = subprocess.run([sys.executable, "-c", CHILD, str(threads), how, DIGITS], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("threads, how", [(1, "argument"), (3, "options")])
def test_threads_set_pocl_workers_once_per_process(threads, how):
    """The device reports the asked count as its compute units (PoCL's workers), the env var PoCL reads says it, a
    later Context without a count gets it, another count is refused naming both, and the model still computes
    what onnxruntime does."""
    if not any(d.type == "CPU" and "Portable" in d.platform for d in dlnet.devices()):
        pytest.skip("no PoCL CPU device")
    found = _child(threads, how)
    assert found["threads"] == threads and found["compute_units"] == threads and found["units"] == threads
    assert found["env"] == str(threads) and found["default"] == threads
    assert f"threads={threads + 1}" in found["other"] and f"fixed at {threads}" in found["other"]
    assert found["err"] < 1e-5


def test_another_count_after_the_platform_started_is_a_config_error():
    fixed = context().threads
    assert fix_threads(0) == fixed and fix_threads(fixed) == fixed
    with pytest.raises(ConfigError, match=f"threads={fixed + 1}: .*fixed at {fixed}"):
        dlnet.Context("cpu", threads=fixed + 1)
    with pytest.raises(ConfigError, match=f"threads={fixed + 2}"):
        context().with_options(threads=fixed + 2)


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_threads_must_be_a_count(bad):
    with pytest.raises(ConfigError, match="expected a positive integer"):
        fix_threads(bad)


def test_cli_threads_flag():
    """--threads of the process's count classifies; another count is one line on stderr and exit 2."""
    fixed = context().threads
    digits_dir = os.path.join(ROOT, "models", "digits")
    runner = CliRunner()
    ok = runner.invoke(cli_main.cli, ["infer", DIGITS, digits_dir, "--threads", str(fixed)])
    assert ok.exit_code == 0, ok.output
    assert len(ok.stdout.splitlines()) == 11
    bad = runner.invoke(cli_main.cli, ["infer", DIGITS, digits_dir, "--threads", str(fixed + 1)])
    assert bad.exit_code == 2 and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and f"fixed at {fixed}" in bad.stderr
    bad_train = runner.invoke(cli_main.cli, ["train", os.path.join(ROOT, "models", "digits_train.yaml"),
                                             "--threads", str(fixed + 1)])
    assert bad_train.exit_code == 2 and f"threads={fixed + 1}" in bad_train.stderr, bad_train.output
    assert runner.invoke(cli_main.cli, ["infer", DIGITS, digits_dir, "--threads", "0"]).exit_code == 2
