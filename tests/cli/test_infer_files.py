"""`dlnet infer` on what users and strangers hand it: every Pillow format, special files, decompression bombs,
--output over an input, fixed-batch models, and progress only on a terminal. Subprocesses where exit statuses,
signals or a terminal matter."""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest
from dlnet.cli import main as cli_main
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from dlnet.images import preprocess

from .conftest import DIGITS_DIR, DIGITS_LABELS, DIGITS_MODEL, ROOT, parse_csv
from .test_images import png_claiming

ENV = dict(os.environ, PYTHONPATH=ROOT)


def dlnet_cli(args, timeout=60, prelude="", **kwargs):
    """`dlnet ARGS` in a fresh interpreter (after running `prelude`), killed after `timeout` seconds."""
    code = f"{prelude}\nfrom dlnet.cli.main import main\nmain()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=ENV,
                          timeout=timeout, **kwargs)


def rgb_model(path, batch):
    """A 3-channel 8x8 classifier with a fixed batch: GlobalAveragePool -> Flatten -> Gemm(4 classes)."""
    rng = np.random.default_rng(11)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32) * 3, "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]), helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "w", "b"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "rgb", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])], [w, b])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8), str(path))
    return str(path)


def ort_probabilities(model, x):
    """Softmax of onnxruntime's logits for one preprocessed image, padded to the model's fixed batch."""
    import onnxruntime as ort

    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    batch = sess.get_inputs()[0].shape[0]
    y = sess.run(None, {"x": np.concatenate([x[None], np.zeros((batch - 1,) + x.shape, np.float32)])})[0][0]
    e = np.exp(y - y.max())
    return e / e.sum()


def unix_socket(path):
    """A listening socket at `path` (skips where the temp folder's path is too long for one)."""
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(path))
    except OSError as e:
        sock.close()
        pytest.skip(f"cannot make a socket at {path} ({e})")
    return sock


def random_photos(folder, n, seed=0):
    rng = np.random.default_rng(seed)
    paths = []
    for k in range(n):
        a = rng.integers(0, 256, (int(rng.integers(9, 30)), int(rng.integers(9, 30)), 3), dtype=np.uint8)
        Image.fromarray(a).save(folder / f"im{k}.png")
        paths.append(str(folder / f"im{k}.png"))
    return paths


@pytest.mark.parametrize("fixed", [1, 2])
def test_fixed_batch_model_runs_any_batch_in_chunks(runner, tmp_path, fixed):
    """torch's default export fixes the batch (1); --batch 3 on 7 images runs chunks of the model's batch, the last
    one padded, each image scored as onnxruntime scores it alone."""
    model = rgb_model(tmp_path / "fixed.onnx", fixed)
    paths = random_photos(tmp_path, 7, seed=fixed)
    r = runner.invoke(cli_main.cli, ["infer", model, *paths, "--batch", "3", "--top-k", "4", "--format", "json"])
    assert r.exit_code == 0, r.output
    items = json.loads(r.stdout)
    assert [i["path"] for i in items] == paths
    for item, path in zip(items, paths):
        with Image.open(path) as im:
            want = ort_probabilities(model, preprocess(im, (8, 8)))
        got = {t["class"]: t["score"] for t in item["top"]}
        assert np.allclose([got[k] for k in range(4)], want, atol=2e-6)


def test_every_pillow_format_in_a_folder_animated_gif_first_frame(runner, rgb_softmax_model, tmp_path):
    d = tmp_path / "photos"
    d.mkdir()
    rng = np.random.default_rng(5)
    frames = [Image.fromarray(rng.integers(0, 256, (14, 11, 3), dtype=np.uint8)) for _ in range(3)]
    frames[0].save(d / "a.bmp")
    frames[1].save(d / "b.tiff")
    frames[2].save(d / "c.webp", lossless=True)
    frames[0].save(d / "d.gif", save_all=True, append_images=frames[1:], duration=40, loop=0)
    frames[1].save(d / "e_no_extension", format="PNG")
    r = runner.invoke(cli_main.cli, ["infer", rgb_softmax_model, str(d), "--top-k", "4", "--format", "json"])
    assert r.exit_code == 0, r.output
    items = json.loads(r.stdout)
    names = ["a.bmp", "b.tiff", "c.webp", "d.gif", "e_no_extension"]
    assert [os.path.basename(i["path"]) for i in items] == names
    assert f"dlnet: note: {d / 'd.gif'}: animated GIF; using its first frame" in r.stderr
    import onnxruntime as ort

    sess = ort.InferenceSession(rgb_softmax_model, providers=["CPUExecutionProvider"])
    for item, name in zip(items, names):
        with Image.open(d / name) as im:  # Pillow opens at the first frame
            want = sess.run(None, {"x": preprocess(im, (8, 8))[None]})[0][0]
        got = {t["class"]: t["score"] for t in item["top"]}
        assert item["error"] is None and np.allclose([got[k] for k in range(4)], want, atol=2e-6)


def test_fifo_and_dev_zero_by_name_and_in_a_folder_never_hang(tmp_path):
    d = tmp_path / "images"
    d.mkdir()
    os.mkfifo(d / "fifo.pgm")
    os.symlink("/dev/zero", d / "zero.png")
    sock = unix_socket(d / "sock.jpg")
    digit = os.path.join(DIGITS_DIR, sorted(os.listdir(DIGITS_DIR))[4])
    os.symlink(digit, d / "4.pgm")
    try:
        start = time.monotonic()
        named = dlnet_cli(["infer", DIGITS_MODEL, str(d / "fifo.pgm"), "/dev/zero", digit], timeout=30)
        walked = dlnet_cli(["infer", DIGITS_MODEL, str(d)], timeout=30)
        elapsed = time.monotonic() - start
    finally:
        sock.close()
    assert named.returncode == 1, named.stderr
    assert parse_csv(named.stdout, with_errors=True) == [
        (str(d / "fifo.pgm"), [], "a FIFO, not an image file"), ("/dev/zero", [], "a character device, not an image "
                                                                    "file"), (digit, parse_csv(named.stdout)[2][1], "")]
    assert parse_csv(named.stdout)[2][1][0][0] == 4 and "2 failed" in named.stderr
    assert walked.returncode == 0, walked.stderr
    assert [(p, top[0][0]) for p, top in parse_csv(walked.stdout)] == [(str(d / "4.pgm"), 4)]
    for name, kind in [("fifo.pgm", "a FIFO"), ("sock.jpg", "a socket"), ("zero.png", "a character device")]:
        assert f"dlnet: note: {d / name}: {kind}, not an image file; skipped" in walked.stderr
    assert elapsed < 20  # two interpreter starts; a FIFO read would block until the timeout


def test_decompression_bomb_png_is_refused(runner, tmp_path):
    (tmp_path / "bomb.png").write_bytes(png_claiming(60_000, 60_000))
    digit = os.path.join(DIGITS_DIR, sorted(os.listdir(DIGITS_DIR))[2])
    r = runner.invoke(cli_main.cli, ["infer", DIGITS_MODEL, str(tmp_path / "bomb.png"), digit])
    assert r.exit_code == 1
    rows = parse_csv(r.stdout, with_errors=True)
    assert rows[0][0] == str(tmp_path / "bomb.png")
    assert rows[0][2] == ("too many pixels (the header says 3600000000; the limit is PIL.Image.MAX_IMAGE_PIXELS = "
                          f"{Image.MAX_IMAGE_PIXELS})")
    assert rows[1][1][0][0] == 2 and f"{tmp_path / 'bomb.png'}: too many pixels" in r.stderr


@pytest.mark.parametrize("target", ["model", "image", "hardlink", "symlink", "labels"])
def test_output_over_an_input_is_refused(tmp_path, target):
    model = tmp_path / "digits.onnx"
    model.write_bytes(open(DIGITS_MODEL, "rb").read())
    image = tmp_path / "7.pgm"
    image.write_bytes(open(os.path.join(DIGITS_DIR, sorted(os.listdir(DIGITS_DIR))[7]), "rb").read())
    labels = tmp_path / "labels.txt"
    labels.write_text(open(DIGITS_LABELS).read())
    output = {"model": model, "image": image, "labels": labels, "hardlink": tmp_path / "link.csv",
              "symlink": tmp_path / "sym.csv"}[target]
    if target == "hardlink":
        os.link(image, output)
    elif target == "symlink":
        os.symlink(model, output)
    before = {p: p.read_bytes() for p in (model, image, labels)}
    r = dlnet_cli(["infer", str(model), str(image), "--labels", str(labels), "--output", str(output)])
    assert r.returncode == 2 and r.stdout == ""
    [line] = r.stderr.splitlines()
    assert line.startswith(f"dlnet: error: --output {output} is the input ") and line.endswith("refusing to write "
                                                                                             "over it")
    assert {p: p.read_bytes() for p in before} == before
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".dlnet-")]


def test_sigterm_while_writing_the_output_removes_the_temp_file(tmp_path):
    """SIGTERM arrives between the temp file's write and its rename: exit 143, no temp file, no output."""
    prelude = ("import os, signal, time\nreal = os.replace\n"
               "def replace(src, dst):\n    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(5)\n"
               "    real(src, dst)\nos.replace = replace")
    r = dlnet_cli(["infer", DIGITS_MODEL, DIGITS_DIR, "--output", str(tmp_path / "out.csv")], prelude=prelude)
    assert r.returncode == 143, r.stderr
    assert os.listdir(tmp_path) == []


def test_output_write_error_names_the_output_and_leaves_no_temp(runner, tmp_path, monkeypatch):
    import errno

    real = os.fdopen

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    def fdopen(fd, *a, **k):  # only the results' temp file fills the disk (the model and images still read)
        f = real(fd, *a, **k)
        return Full(f) if str(tmp_path) in os.readlink(f"/proc/self/fd/{fd}") else f
    monkeypatch.setattr(os, "fdopen", fdopen)
    out = tmp_path / "out.json"
    r = runner.invoke(cli_main.cli, ["infer", DIGITS_MODEL, DIGITS_DIR, "--format", "json", "--output", str(out)])
    monkeypatch.undo()
    assert r.exit_code == 2
    assert r.stderr.splitlines()[-1] == f"dlnet: error: {out}: cannot write the results (No space left on device)"
    assert os.listdir(tmp_path) == []


def run_on_a_terminal(args, prelude=""):
    """`dlnet ARGS` with stderr on a pseudo-terminal and stdout on a pipe: (returncode, stdout, terminal text).
    tqdm draws at every step (TQDM_MININTERVAL=0: ten small digits take milliseconds, under its 0.1 s default)."""
    import pty

    try:
        master, slave = pty.openpty()
    except OSError as e:
        pytest.skip(f"no pseudo-terminal here ({e})")
    code = f"{prelude}\nfrom dlnet.cli.main import main\nmain()"
    env = dict(ENV, TQDM_MININTERVAL="0")
    p = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the terminal's other end closed
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    out = p.stdout.read().decode()
    p.stdout.close()
    return p.wait(timeout=60), out, seen.decode(errors="replace")


@pytest.mark.parametrize("bar", ["tqdm", "plain"])
def test_progress_and_build_note_only_on_a_terminal(runner, bar):
    if bar == "tqdm":
        pytest.importorskip("tqdm")
    prelude = "import sys\nsys.modules['tqdm'] = None" if bar == "plain" else ""  # tqdm not installed
    rc, out, tty = run_on_a_terminal(["infer", DIGITS_MODEL, DIGITS_DIR], prelude)
    assert rc == 0, tty
    assert tty.splitlines()[0].strip() == "dlnet: building the model's kernels for the device..."
    assert re.search(r"10/10", tty) and "image" in tty and "10 images classified" in tty
    if bar == "tqdm":
        assert re.search(r"\[\d\d:\d\d<\d\d:\d\d, +[\d.]+image/s\]", tty), tty  # elapsed<ETA, rate
    else:
        assert re.search(r"\d+/10 [\d.]+ images/s ETA \d+ s", tty), tty
    assert [p for p, _ in parse_csv(out)] == sorted(os.path.join(DIGITS_DIR, f) for f in os.listdir(DIGITS_DIR))
    piped = runner.invoke(cli_main.cli, ["infer", DIGITS_MODEL, DIGITS_DIR])
    assert piped.exit_code == 0 and "building" not in piped.stderr and "\r" not in piped.stderr
    assert piped.stderr.count("\n") == 1  # the summary line only


def test_sigterm_default_restored_after_the_write(runner, tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    r = runner.invoke(cli_main.cli, ["infer", DIGITS_MODEL, DIGITS_DIR, "--output", str(tmp_path / "o.csv")])
    assert r.exit_code == 0 and signal.getsignal(signal.SIGTERM) is before
    assert (tmp_path / "o.csv").read_text().splitlines()[0] == "path,class,label,score,error"
    assert len(parse_csv((tmp_path / "o.csv").read_text())) == 10


def test_top_k_beyond_the_classes_gives_every_class_once(runner, rgb_softmax_model, tmp_path):
    [path] = random_photos(tmp_path, 1, seed=9)
    r = runner.invoke(cli_main.cli, ["infer", rgb_softmax_model, path, "--top-k", "7"])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[0] == ",".join(["path"] + [f"{n}_{i}" for i in range(1, 5)
                                                             for n in ("class", "label", "score")] + ["error"])
    [(p, top)] = parse_csv(r.stdout)
    assert sorted(k for k, _, _ in top) == [0, 1, 2, 3] and abs(sum(s for _, _, s in top) - 1) < 1e-5


def test_stdout_closed_by_its_reader_is_one_line(tmp_path):
    """`dlnet infer ... | head`: the reader goes away; one line names stdout, exit 2, nothing else on stderr."""
    code = "from dlnet.cli.main import main\nmain()"
    p = subprocess.Popen([sys.executable, "-c", code, "infer", DIGITS_MODEL, DIGITS_DIR], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=ENV)
    p.stdout.close()
    err = p.stderr.read().decode()
    p.stderr.close()
    assert p.wait(timeout=60) == 2
    assert err == "dlnet: error: stdout: broken pipe (its reader closed it); the results after that were not written\n"
