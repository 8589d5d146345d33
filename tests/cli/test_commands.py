"""devices, bench, show, validate, and the real `dlnet` process."""
import os
import subprocess
import sys

import numpy as np
import pytest
from dlnet.cli import main as cli_main

from .conftest import DIGITS_DIR, DIGITS_LABELS, DIGITS_MODEL, ROOT, parse_csv


def test_devices_table_marks_default(runner):
    r = runner.invoke(cli_main.cli, ["devices"])
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["device", "platform", "name"]
    assert any(line.startswith("*  ocl:0") for line in lines)


def test_devices_hint_for_unregistered_gpu_library(runner, monkeypatch):
    monkeypatch.setattr(cli_main, "_unregistered_gpu_libraries", lambda: [("nvidia", "libnvidia-opencl.so.1")])
    r = runner.invoke(cli_main.cli, ["devices"])
    assert "libnvidia-opencl.so.1" in r.stderr
    assert "echo libnvidia-opencl.so.1 > /tmp/icd/nvidia.icd && export OCL_ICD_VENDORS=/tmp/icd" in r.stderr


def test_bench_profile_table(runner):
    r = runner.invoke(cli_main.cli, ["bench", DIGITS_MODEL, "--batch", "2", "--iters", "3", "--profile"])
    assert r.exit_code == 0, r.output
    assert "images/s" in r.stdout
    rows = [line.split() for line in r.stdout.splitlines() if "Conv" in line or "Gemm" in line]
    assert len(rows) == 3
    times = [float(row[-2]) for row in rows]
    assert times == sorted(times, reverse=True)
    assert r.stdout.splitlines()[-1].split()[-1] == "100.0"


def test_show_prints_ir_memory_and_dot(runner, tmp_path):
    dot = tmp_path / "g.dot"
    r = runner.invoke(cli_main.cli, ["show", DIGITS_MODEL, "--dot", str(dot)])
    assert r.exit_code == 0, r.output
    assert "Conv(" in r.stdout and "Gemm(" in r.stdout and "weights" in r.stdout
    text = dot.read_text()
    assert text.startswith("digraph") and text.count("label=\"Conv") == 2 and "->" in text


def test_validate_ok_and_past_tolerance(runner, tmp_path):
    r = runner.invoke(cli_main.cli, ["validate", DIGITS_MODEL])
    assert r.exit_code == 0 and "relative L2 error" in r.stdout and "OK" in r.stdout
    x = np.random.default_rng(5).standard_normal((3, 1, 16, 16)).astype(np.float32)
    np.savez(tmp_path / "in.npz", image=x)
    r = runner.invoke(cli_main.cli, ["validate", DIGITS_MODEL, "--input", str(tmp_path / "in.npz"), "--tol", "-1"])
    assert r.exit_code == 1 and "[3, 10]" in r.stdout and "FAIL" in r.stdout
    r = runner.invoke(cli_main.cli, ["validate", DIGITS_MODEL, "--precision", "tf32", "--tol", "1e-2"])
    assert r.exit_code == 0 and "OK" in r.stdout, r.output


def test_subprocess_module_and_script_exit_statuses(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    ok = subprocess.run([sys.executable, "-m", "dlnet.cli.main", "infer", DIGITS_MODEL, DIGITS_DIR, "--labels",
                         DIGITS_LABELS], check=False, capture_output=True, text=True, env=env,
                         timeout=60)
    assert ok.returncode == 0, ok.stderr
    rows = parse_csv(ok.stdout)
    assert [top[0][0] for _, top in rows] == [int(os.path.basename(p)[0]) for p, _ in rows] == list(range(10))
    (tmp_path / "bad.ppm").write_bytes(b"P6\n2 2\n255\n\x00")
    one = subprocess.run([sys.executable, "-m", "dlnet.cli.main", "infer", DIGITS_MODEL, str(tmp_path)],
                         check=False, capture_output=True, text=True, env=env,
                         timeout=60)
    assert one.returncode == 1 and "bad.ppm: truncated" in one.stderr
    script = os.path.join(os.path.dirname(sys.executable), "dlnet")
    cmd = [script] if os.path.exists(script) else [sys.executable, "-m", "dlnet.cli.main"]
    two = subprocess.run(cmd + ["infer", str(tmp_path / "none.onnx"), DIGITS_DIR], check=False, capture_output=True,
                         text=True, timeout=60)
    assert two.returncode == 2
    assert two.stderr.strip() == f"dlnet: error: {tmp_path / 'none.onnx'}: no such file"


@pytest.mark.slow
def test_torch_export_validates(runner, tmp_path):
    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                              torch.nn.Flatten(), torch.nn.Linear(4, 5), torch.nn.Softmax(dim=1))
    torch.manual_seed(0)
    path = str(tmp_path / "t.onnx")
    torch.onnx.export(net.eval(), torch.zeros(1, 3, 8, 8), path, opset_version=13, dynamo=False)
    r = runner.invoke(cli_main.cli, ["validate", path, "--tol", "1e-5"])
    assert r.exit_code == 0, r.output
