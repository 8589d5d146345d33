"""`dlnet train` on a folder of images (one sub-folder per class) and the augmentation's determinism."""
import numpy as np
import onnx
import pytest
from dlnet.cli import train as train_cli
from onnx import TensorProto, helper, numpy_helper

from dlnet.errors import ConfigError

PIL = pytest.importorskip("PIL")
from PIL import Image

CLASSES = ["cat", "dog", "owl"]


def image_folder(root, channels, per_class=6, size=(10, 12)):
    """Classes differ in brightness so one epoch has something to learn; PGM/PPM and PNG files mixed."""
    rng = np.random.default_rng(0)
    for k, c in enumerate(CLASSES):
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            shape = size if channels == 1 else size + (3,)
            a = np.clip(rng.normal(60 + 70 * k, 20, shape), 0, 255).astype(np.uint8)
            ext = ("pgm" if channels == 1 else "ppm") if i % 2 else "png"
            Image.fromarray(a).save(root / c / f"{i}.{ext}")
    (root / "cat" / ".DS_Store").write_bytes(b"\0")  # hidden files are skipped
    return root


def linear_model(path, channels, hw=8):
    rng = np.random.default_rng(1)
    n_in = channels * hw * hw
    w = numpy_helper.from_array((rng.standard_normal((n_in, len(CLASSES))) * 0.1).astype(np.float32), "w")
    b = numpy_helper.from_array(np.zeros(len(CLASSES), np.float32), "b")
    nodes = [helper.make_node("Flatten", ["x"], ["f"]), helper.make_node("Gemm", ["f", "w", "b"], ["y"])]
    graph = helper.make_graph(nodes, "lin", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                            ["n", channels, hw, hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", len(CLASSES)])], [w, b])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7), str(path))
    return path


def write_config(tmp_path, channels, extra=""):
    model = linear_model(tmp_path / "m.onnx", channels)
    image_folder(tmp_path / "images", channels)
    p = tmp_path / "c.yaml"
    p.write_text(f"model: {model}\ndataset: {{path: images, val_split: 0.25}}\nbatch_size: 4\nepochs: 1\n"
                 f"preprocess: {{resize: [8, 8], random_crop: [1], flip: true, mean: 0.5, std: 0.25}}\n"
                 f"optimizer: {{name: sgd, lr: 0.05}}\noutput: out\nseed: 3\n{extra}")
    return str(p)


@pytest.mark.parametrize("channels", [1, 3])
def test_image_folder_trains_an_epoch(tmp_path, channels):
    path = write_config(tmp_path, channels)
    lines = []
    rows = train_cli.run_training(path, echo=lines.append)
    assert lines[0] == f"dataset: 18 images, 3 classes, {channels} x 8 x 8", lines
    assert len(rows) == 1 and np.isfinite(rows[0]["train_loss"]) and np.isfinite(rows[0]["val_loss"])
    assert (tmp_path / "out" / "model.onnx").exists() and (tmp_path / "out" / "checkpoint-000001.safetensors").exists()


def test_load_dataset_labels_by_sorted_folder(tmp_path):
    path = write_config(tmp_path, 1)
    cfg = train_cli.load_config(path)
    x, y, classes = train_cli.load_dataset(cfg, channels=1)
    assert classes == CLASSES
    assert x.shape == (18, 1, 8, 8) and x.dtype == np.float32 and 0 <= x.min() and x.max() <= 1
    np.testing.assert_array_equal(y, np.repeat([0, 1, 2], 6))
    assert x[y == 0].mean() < x[y == 1].mean() < x[y == 2].mean()


def test_unreadable_image_and_mixed_sizes_are_named(tmp_path):
    path = write_config(tmp_path, 1)
    cfg = train_cli.load_config(path)
    (tmp_path / "images" / "dog" / "notes.txt").write_text("hello")
    with pytest.raises(ConfigError, match=r"dog/notes.txt: not a readable image"):
        train_cli.load_dataset(cfg, channels=1)
    (tmp_path / "images" / "dog" / "notes.txt").unlink()
    cfg["preprocess"]["resize"] = None
    Image.fromarray(np.zeros((5, 5), np.uint8)).save(tmp_path / "images" / "owl" / "small.png")
    with pytest.raises(ConfigError, match=r"owl/small.png: image is 5x5, the first one 12x10; set preprocess.resize"):
        train_cli.load_dataset(cfg, channels=1)


def augment_cfg(flip=True, crop=(2,), mean=0.0, std=1.0):
    return {"preprocess": {"flip": flip, "random_crop": list(crop) if crop else None, "mean": mean, "std": std}}


def test_augmentation_is_deterministic_under_the_seed():
    x = np.random.default_rng(0).random((32, 3, 6, 6)).astype(np.float32)
    cfg = augment_cfg()
    a = train_cli.augment(x, cfg, np.random.default_rng(5))
    b = train_cli.augment(x, cfg, np.random.default_rng(5))
    c = train_cli.augment(x, cfg, np.random.default_rng(6))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a.shape == x.shape and a.dtype == np.float32 and a.flags.c_contiguous


def test_flip_flips_about_half_and_crop_shifts_per_image():
    x = np.random.default_rng(0).random((200, 1, 5, 5)).astype(np.float32) + 1  # no zeros: padding shows
    flipped = train_cli.augment(x, augment_cfg(crop=None), np.random.default_rng(1))
    same = [np.array_equal(f, o) for f, o in zip(flipped, x)]
    mirrored = [np.array_equal(f, o[..., ::-1]) for f, o in zip(flipped, x)]
    assert all(s or m for s, m in zip(same, mirrored))
    assert 70 < sum(mirrored) < 130
    cropped = train_cli.augment(x, augment_cfg(flip=False, crop=(1,)), np.random.default_rng(1))
    offsets = set()
    for o, c in zip(x, cropped):
        pad = np.pad(o, ((0, 0), (1, 1), (1, 1)))
        hits = [(dy, dx) for dy in range(3) for dx in range(3) if np.array_equal(pad[:, dy:dy + 5, dx:dx + 5], c)]
        assert len(hits) == 1
        offsets.add(hits[0])
    assert len(offsets) == 9  # each image draws its own offset


def test_normalisation_per_channel():
    x = np.ones((2, 3, 2, 2), np.float32)
    y = train_cli.augment(x, augment_cfg(flip=False, crop=None, mean=[0.0, 0.5, 1.0], std=[1.0, 0.5, 0.25]),
                          np.random.default_rng(0))
    np.testing.assert_allclose(y[0, :, 0, 0], [1.0, 1.0, 0.0])
