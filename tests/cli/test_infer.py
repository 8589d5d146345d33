"""`dlnet infer` through click's CliRunner: output formats, batching, broken files, exit statuses."""
import json
import os

import numpy as np
import pytest
from dlnet.cli import main as cli_main

from dlnet.images import preprocess, read_image

from .conftest import DIGITS_DIR, DIGITS_LABELS, DIGITS_MODEL, parse_csv

LABELS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def true_label(path):
    return int(os.path.basename(path).split("_")[0])


def test_digits_csv_true_class_with_default_preprocessing(runner):
    """The README's quick start: a header line, then one row per digit with its true class."""
    r = runner.invoke(cli_main.cli, ["infer", DIGITS_MODEL, DIGITS_DIR, "--labels", DIGITS_LABELS])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[0] == "path,class,label,score,error"
    rows = parse_csv(r.stdout)
    assert len(rows) == 10
    for path, [(k, label, score)] in rows:
        assert k == true_label(path) and label == LABELS[k] and 0.9 < score <= 1.0
    assert "10 images classified" in r.stderr and "images/s" in r.stderr


def test_tf32_precision_classifies_alike(runner):
    """--precision tf32 (tensor cores on NVIDIA, fp32 elsewhere) gives the same classes, scores within 1e-2."""
    fp32 = parse_csv(runner.invoke(cli_main.cli, ["infer", DIGITS_MODEL, DIGITS_DIR]).stdout)
    r = runner.invoke(cli_main.cli, ["infer", DIGITS_MODEL, DIGITS_DIR, "--precision", "tf32"])
    assert r.exit_code == 0, r.output
    tf32 = parse_csv(r.stdout)
    assert [(p, k) for p, [(k, _, _)] in tf32] == [(p, k) for p, [(k, _, _)] in fp32]
    for (_, [(_, _, a)]), (_, [(_, _, b)]) in zip(tf32, fp32):
        assert abs(a - b) < 1e-2


def test_json_top_k_sorted_probabilities(runner, tmp_path):
    out = tmp_path / "res.json"
    r = runner.invoke(cli_main.cli, ["infer", DIGITS_MODEL, DIGITS_DIR, "--labels", DIGITS_LABELS, "--top-k", "10",
                                     "--format", "json", "--output", str(out)])
    assert r.exit_code == 0, r.output
    assert r.stdout == "" and os.listdir(tmp_path) == ["res.json"]  # no temp file left behind
    items = json.loads(out.read_text())
    assert len(items) == 10
    for item in items:
        assert item["error"] is None
        scores = [t["score"] for t in item["top"]]
        assert scores == sorted(scores, reverse=True)
        assert abs(sum(scores) - 1) < 1e-4  # softmax applied once, over all 10 classes
        assert item["top"][0]["class"] == true_label(item["path"])
        assert sorted(t["label"] for t in item["top"]) == sorted(LABELS)


def test_top_k_without_labels_has_empty_label(runner):
    path = os.path.join(DIGITS_DIR, sorted(os.listdir(DIGITS_DIR))[3])
    r = runner.invoke(cli_main.cli, ["infer", DIGITS_MODEL, path, "--top-k", "3"])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[0] == ("path,class_1,label_1,score_1,class_2,label_2,score_2,class_3,label_3,"
                                        "score_3,error")
    [(p, top)] = parse_csv(r.stdout)
    assert p == path and len(top) == 3 and top[0][0] == 3 and all(label == "" for _, label, _ in top)


def test_batched_equals_one_at_a_time(runner):
    one = runner.invoke(cli_main.cli, ["infer", DIGITS_MODEL, DIGITS_DIR, "--top-k", "3"])
    four = runner.invoke(cli_main.cli, ["infer", DIGITS_MODEL, DIGITS_DIR, "--top-k", "3", "--batch", "4"])
    assert one.exit_code == four.exit_code == 0
    a, b = parse_csv(one.stdout), parse_csv(four.stdout)  # 10 images: batches of 4, 4, 2 (padded)
    assert [p for p, _ in a] == [p for p, _ in b]
    for (_, ta), (_, tb) in zip(a, b):
        assert [k for k, _, _ in ta] == [k for k, _, _ in tb]
        assert np.allclose([s for _, _, s in ta], [s for _, _, s in tb], atol=2e-6)


def test_explicit_flags_match_the_defaults(runner):
    path = os.path.join(DIGITS_DIR, sorted(os.listdir(DIGITS_DIR))[7])
    default = runner.invoke(cli_main.cli, ["infer", DIGITS_MODEL, path])
    flags = runner.invoke(cli_main.cli, ["infer", DIGITS_MODEL, path, "--gray", "--size", "16", "--resize", "18",
                                         "--mean", "0.449", "--std", "0.226", "--scale", "1", "--layout", "nchw"])
    assert default.exit_code == flags.exit_code == 0
    assert default.stdout == flags.stdout and parse_csv(default.stdout)[0][1][0][0] == 7


def broken_dir(digits_copy):
    (digits_copy / "README.txt").write_text("not an image: no image extension and no image header, passed over")
    (digits_copy / "sub").mkdir()
    (digits_copy / "sub" / "0_trunc.pgm").write_bytes(b"P5\n8 8\n16\n\x00\x01\x02")
    (digits_copy / "sub" / "1_huge.ppm").write_bytes(b"P6\n99999999 99999999\n255\n\x00")
    (digits_copy / "sub" / "2_fake.png").write_bytes(b"definitely not a png")
    return digits_copy


BROKEN = {"sub/0_trunc.pgm": "truncated image data (PPM 8x8", "sub/1_huge.ppm": "too many pixels",
          "sub/2_fake.png": "not an image file Pillow reads (unknown format)"}


def test_mixed_directory_gives_every_image_a_row_failed_ones_with_their_error(runner, digits_copy):
    d = broken_dir(digits_copy)
    r = runner.invoke(cli_main.cli, ["infer", DIGITS_MODEL, str(d), "--batch", "3"])
    assert r.exit_code == 1
    assert r.stdout.splitlines()[0] == "path,class,label,score,error"
    rows = parse_csv(r.stdout, with_errors=True)
    assert [p for p, _, _ in rows] == sorted(str(p) for p in d.glob("*.pgm")) + [str(d / n) for n in BROKEN]
    for path, top, error in rows[:10]:
        assert error == "" and len(top) == 1 and top[0][0] == true_label(path)
    for (path, top, error), (name, reason) in zip(rows[10:], BROKEN.items()):
        assert path == str(d / name) and top == [] and error.startswith(reason)
        assert f"dlnet: {d / name}: {reason}" in r.stderr
    assert "README" not in r.output and "3 failed" in r.stderr and "Traceback" not in r.stderr
    assert "<_io" not in r.output


def test_json_has_every_input_and_an_error_field(runner, digits_copy):
    d = broken_dir(digits_copy)
    r = runner.invoke(cli_main.cli, ["infer", DIGITS_MODEL, str(d), "--format", "json", "--top-k", "2"])
    assert r.exit_code == 1
    items = json.loads(r.stdout)
    assert [i["path"] for i in items][10:] == [str(d / n) for n in BROKEN] and len(items) == 13
    for item in items[:10]:
        assert item["error"] is None and len(item["top"]) == 2 and item["top"][0]["class"] == true_label(item["path"])
    for item, reason in zip(items[10:], BROKEN.values()):
        assert item["top"] == [] and item["error"].startswith(reason)


def test_strict_stops_at_first_broken_file(runner, digits_copy):
    d = broken_dir(digits_copy)
    (d / "00.pgm").write_bytes(b"P5\n8 8\n16\n")  # sorts first: nothing after it is read
    r = runner.invoke(cli_main.cli, ["infer", DIGITS_MODEL, str(d), "--strict"])
    assert r.exit_code == 1
    rows = parse_csv(r.stdout, with_errors=True)
    assert len(rows) == 14 and all(top == [] for _, top, _ in rows)
    assert rows[0][0] == str(d / "00.pgm") and rows[0][2].startswith("truncated image data")
    assert all(error == f"not read: --strict stopped at {d / '00.pgm'}" for _, _, error in rows[1:])
    assert "00.pgm: truncated image data" in r.stderr and "--strict; 13 not read" in r.stderr


def test_missing_image_file_is_exit_1(runner, tmp_path):
    first = os.path.join(DIGITS_DIR, min(os.listdir(DIGITS_DIR)))
    r = runner.invoke(cli_main.cli, ["infer", DIGITS_MODEL, str(tmp_path / "nope.pgm"), first])
    assert r.exit_code == 1 and "nope.pgm: cannot read" in r.stderr
    rows = parse_csv(r.stdout, with_errors=True)
    assert rows[0] == (str(tmp_path / "nope.pgm"), [], "cannot read (No such file or directory)")
    assert rows[1][0] == first and rows[1][1][0][0] == 0 and rows[1][2] == "" and len(rows) == 2


@pytest.mark.parametrize("args, message", [
    (["infer", "missing.onnx", DIGITS_DIR], "missing.onnx: no such file"),
    (["infer", DIGITS_LABELS, DIGITS_DIR], "not an ONNX model"),
    (["infer", DIGITS_MODEL, DIGITS_DIR, "--device", "ocl:99"], "device 'ocl:99'"),
    (["infer", DIGITS_MODEL, DIGITS_DIR, "--size", "32"], "fixed at 16x16"),
    (["infer", DIGITS_MODEL, DIGITS_DIR, "--mean", "1,2,3"], "--mean: 3 values for a 1-channel input"),
    (["infer", DIGITS_MODEL, DIGITS_DIR, "--labels", DIGITS_MODEL], "labels"),
    (["infer", DIGITS_MODEL, DIGITS_DIR, "--top-k", "0"], "--top-k"),
    (["infer", DIGITS_MODEL, DIGITS_DIR, "--format", "xml"], "--format"),
    (["infer", DIGITS_MODEL, DIGITS_DIR, "--precision", "fp8"], "--precision"),  # (fp16 is one now)
    (["infer", DIGITS_MODEL, "/nonexistent-dir-for-dlnet/"], None),
])
def test_bad_model_device_or_flag_is_exit_2_one_line(runner, args, message):
    r = runner.invoke(cli_main.cli, args)
    if args[-1].startswith("/nonexistent"):  # a missing path is a failed image, not a usage error
        assert r.exit_code == 1
        return
    assert r.exit_code == 2, r.output
    assert message in r.stderr and "Traceback" not in r.stderr and r.stdout == ""


def test_labels_count_mismatch_is_exit_2(runner, tmp_path):
    labels = tmp_path / "labels.txt"
    labels.write_text("a\nb\n")
    r = runner.invoke(cli_main.cli, ["infer", DIGITS_MODEL, DIGITS_DIR, "--labels", str(labels)])
    assert r.exit_code == 2 and "2 labels, the model" in r.stderr and "10 classes" in r.stderr


def test_debug_shows_the_exception(runner):
    r = runner.invoke(cli_main.cli, ["infer", "missing.onnx", DIGITS_DIR, "--debug"])
    assert r.exit_code != 0 and type(r.exception).__name__ == "ModelError"


def test_model_ending_in_softmax_is_not_softmaxed_again(runner, rgb_softmax_model, tmp_path):
    import onnxruntime as ort
    from PIL import Image

    rng = np.random.default_rng(3)
    paths = []
    for k in range(2):
        Image.fromarray(rng.integers(0, 256, (12, 10, 3), dtype=np.uint8)).save(tmp_path / f"im{k}.png")
        paths.append(str(tmp_path / f"im{k}.png"))
    r = runner.invoke(cli_main.cli, ["infer", rgb_softmax_model, *paths, "--top-k", "4", "--bgr", "--format", "json"])
    assert r.exit_code == 0, r.output
    sess = ort.InferenceSession(rgb_softmax_model, providers=["CPUExecutionProvider"])
    for item, path in zip(json.loads(r.stdout), paths):
        x = preprocess(read_image(path), (8, 8))[::-1][None].copy()  # --bgr reverses the channels
        want = sess.run(None, {"x": x})[0][0]
        got = {t["class"]: t["score"] for t in item["top"]}
        assert np.allclose([got[k] for k in range(4)], want, atol=2e-6)
