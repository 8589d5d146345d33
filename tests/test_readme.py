"""Every code block of README.md runs as written.

Python blocks run in a subprocess; shell blocks run line by line: `dlnet ...` commands run, and lines that install
packages, run the test suite itself or only make sense on a GPU are skipped, each with its reason (SHELL_RULES).
Both run in a scratch folder that links every top-level entry of the repository, so paths read as from the root and
files a block writes (trained.onnx) land in the scratch folder. A block that is not meant to run (a file tree) is
marked on the line before it with `<!-- readme-test: skip REASON -->`. A shell line no rule knows fails the test: say
how to test it here, or mark its block.
"""
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

markdown_it = pytest.importorskip("markdown_it")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
SKIP_MARK = re.compile(r"<!--\s*readme-test:\s*skip\s+(.*?)\s*-->", re.S)
ON_GPU = (os.environ.get("DLNET_TEST_DEVICE") or "").lower() == "gpu"
DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]

# (pattern a shell line matches, None to run it or the reason it is skipped); the first that matches decides
SHELL_RULES = [
    (r"\bpip install\b|\bpython3? -m venv\b", "installs packages: the tests run in the installed checkout"),
    (r"\bpython3? -m pytest\b", "runs the test suite, of which this test is part"),
    (r"^dlnet tune(\s+--|\s*$)", None if ON_GPU else "measures a GPU's GEMM tiles and caches them: GPU only "
                                                     "(DLNET_TEST_DEVICE=gpu runs it)"),
    (r"^dlnet\s", None),
]


def code_blocks():
    """(first line, kind, code, skip reason or None) for every code block of README.md, fenced or indented."""
    tokens = markdown_it.MarkdownIt("commonmark").parse(open(README, encoding="utf-8").read())
    found = []
    for i, t in enumerate(tokens):
        if t.type not in ("fence", "code_block"):
            continue
        before = tokens[i - 1] if i else None
        mark = SKIP_MARK.search(before.content) if before is not None and before.type == "html_block" else None
        kind = (t.info.split() or ["shell"])[0].lower() if t.type == "fence" else "shell"
        found.append((t.map[0] + 1, kind, t.content, mark.group(1) if mark else None))
    return found


def cases():
    """One case per python block and per shell line: (README line, kind, code, skip reason or None)."""
    out = []
    for line, kind, code, skip in code_blocks():
        if kind == "python" or skip is not None:
            out.append((line, kind, code, skip))
            continue
        if kind not in ("shell", "sh", "bash", "console"):
            out.append((line, kind, code, f"a {kind} block: not code to run"))
            continue
        for k, text in enumerate(code.splitlines()):
            command = re.sub(r"\s+#.*$", "", text).strip()
            if command:
                out.append((line + k, "shell", command, _shell_rule(command)))
    return out


def _shell_rule(command):
    for pattern, reason in SHELL_RULES:
        if re.search(pattern, command):
            return reason
    return f"UNKNOWN: no rule in tests/test_readme.py says how to test `{command}`"


def _scratch(tmp_path):
    for name in os.listdir(ROOT):
        if not name.startswith("."):
            os.symlink(os.path.join(ROOT, name), tmp_path / name)
    env = dict(os.environ)
    if os.environ.get("DLNET_TEST_DEVICE"):
        env["DLNET_DEVICE"] = os.environ["DLNET_TEST_DEVICE"]
    return env


def _check_infer(out, command, cwd):
    """Each of the shipped digit images appears, with its digit's label first (and --top-k labels in JSON)."""
    images = sorted(f for f in os.listdir(os.path.join(ROOT, "models", "digits")) if f.endswith(".pgm"))
    assert len(images) == 10
    if "--format json" in command:
        top_k = int(re.search(r"--top-k (\d+)", command).group(1))
        rows = {os.path.basename(r["path"]): r for r in json.loads(out)}
        for f in images:
            assert len(rows[f]["top"]) == top_k and rows[f]["top"][0]["label"] == DIGITS[int(f[0])]
        return
    for f in images:
        line = next(line for line in out.splitlines() if f in line)
        assert DIGITS[int(f[0])] in line.split(","), line


def _check_training(out, code, cwd):
    loss = float(re.search(r"loss ([\d.]+)", out).group(1))
    assert loss < 2.0, out  # from ln(10) = 2.30 at the untrained start, in ten steps on one batch
    import onnx
    onnx.checker.check_model(onnx.load(os.path.join(cwd, "trained.onnx")))


# what a block's output must show, by a piece of its text: a pattern its output matches, or a check; a block not
# listed must only succeed
CHECKS = {
    "dlnet infer models/digits.onnx models/digits/": _check_infer,
    "dlnet devices": r"ocl:0",
    "dlnet show": r"= Conv\(.*\n(.*\n)*\s*return %\d+ \"logits\"",
    "dlnet bench": r"[\d.]+ images/s",
    "dlnet validate": r"(?m)^OK: worst",
    'trainer.step({"image"': _check_training,
    # dlnet's output within 1e-5 of torch's
    "dlnet.torch.from_module": r"^tensor\((\d\.\d+e-0[5-9]|\d\.\d+e-[1-9]\d|0\.)",
    "InferenceSession": r"\['batch', 1, 16, 16\] tensor\(float\) \[[\d ]+\]",
}


@pytest.mark.slow
@pytest.mark.parametrize("line,kind,code,skip", [pytest.param(*c, id=f"line{c[0]}-{c[1]}") for c in cases()])
def test_readme_block_runs(tmp_path, line, kind, code, skip):
    if skip is not None and skip.startswith("UNKNOWN"):
        pytest.fail(f"README.md:{line}: {skip[9:]}; or mark its block <!-- readme-test: skip REASON -->")
    if skip is not None:
        pytest.skip(f"README.md:{line}: {skip}")
    for package in ("torch", "torchvision", "onnxscript"):
        if kind == "python" and re.search(rf"^\s*(import|from)\s+([\w.]+,\s*)*{package}\b", code, re.M) and \
                importlib.util.find_spec(package) is None:
            pytest.skip(f"README.md:{line}: needs {package}")
    env = _scratch(tmp_path)
    if kind == "python":
        args = [sys.executable, "-c", code]
    else:  # `dlnet` is this interpreter's command
        args = [sys.executable, "-m", "dlnet.cli.main", *shlex.split(code)[1:]]
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"README.md:{line}: exit {done.returncode}\n{done.stdout[-2000:]}\n" \
                                 f"{done.stderr[-3000:]}"
    for piece, check in CHECKS.items():
        if piece in code and isinstance(check, str):
            assert re.search(check, done.stdout), f"README.md:{line}: output does not match {check!r}:\n{done.stdout}"
        elif piece in code:
            check(done.stdout, code, tmp_path)


def test_every_readme_block_is_run_or_skipped_for_a_reason():
    """Guards the cases above: the blocks the README has today are all found, and none is silently left out."""
    found = cases()
    kinds = [kind for _, kind, _, _ in found]
    assert kinds.count("python") >= 4
    run = [code for _, kind, code, skip in found if kind == "shell" and skip is None]
    assert any(c.startswith("dlnet infer") for c in run) and any(c.startswith("dlnet validate") for c in run)
    assert all(skip is None or not skip.startswith("UNKNOWN") for *_, skip in found), found
