"""The PNM reader and preprocessing behind `dlnet infer`."""
import numpy as np
import pytest

from dlnet.errors import InputError
from dlnet.images import find_images, preprocess, read_image, read_pnm


def test_plain_and_binary_pnm_16_bit():
    assert read_pnm(b"P2\n2 1\n65535\n0 65535\n").ravel().tolist() == [0.0, 1.0]
    assert np.allclose(read_pnm(b"P3\n1 1\n255\n51 102 255\n"), [[[0.2, 0.4, 1.0]]])
    p5 = b"P5\n# comment\n2 1\n65535\n" + np.array([1000, 65535], ">u2").tobytes()
    assert np.allclose(read_pnm(p5).ravel(), [1000 / 65535, 1.0])
    # Pillow keeps only 8 bits of a 16-bit P6; this reader keeps all 16
    p6 = b"P6\n1 1\n65535\n" + np.array([1000, 30000, 65535], ">u2").tobytes()
    assert np.allclose(read_pnm(p6).ravel(), [1000 / 65535, 30000 / 65535, 1.0], rtol=0, atol=1e-7)
    assert np.allclose(read_pnm(b"P5\n2 1\n16\n\x00\x08").ravel(), [0.0, 0.5])


@pytest.mark.parametrize("data, reason", [
    (b"P6\n4 4\n255\n\x00\x10", "truncated image data (2 of 48 bytes"),
    (b"P2\n2 2\n255\n1 2 3", "truncated image data (3 of 4 values"),
    (b"P6\n4", "truncated PNM header"),
    (b"P6\n100000 100000\n255\n\x00", "over the limit"),
    (b"P6\n" + b"9" * 100 + b" 1\n255\n\x00", "bad PNM header field"),
    (b"P5\n1 1\n70000\n\x00\x00", "maxval 70000"),
    (b"P5\n2 1\n10\n\x00\x0b", "exceeds maxval 10"),
])
def test_broken_pnm_names_file_and_reason(data, reason):
    with pytest.raises(InputError, match="^x.ppm: ") as e:
        read_pnm(data, "x.ppm")
    assert reason in str(e.value)


def test_read_image_png_jpeg_and_unsupported(tmp_path):
    from PIL import Image

    a = np.zeros((4, 6, 3), np.uint8)
    a[..., 0] = 255
    Image.fromarray(a).save(tmp_path / "red.png")
    assert np.allclose(read_image(str(tmp_path / "red.png"))[0, 0], [1, 0, 0])
    Image.fromarray(a).save(tmp_path / "red.jpg", quality=95)
    assert read_image(str(tmp_path / "red.jpg")).shape == (4, 6, 3)
    (tmp_path / "x.gif").write_bytes(b"GIF89a....")
    with pytest.raises(InputError, match="unsupported image format"):
        read_image(str(tmp_path / "x.gif"))
    (tmp_path / "cut.png").write_bytes((tmp_path / "red.png").read_bytes()[:40])
    with pytest.raises(InputError, match="cut.png: cannot decode image"):
        read_image(str(tmp_path / "cut.png"))


def test_preprocess_resize_crop_normalise():
    img = np.full((10, 20, 3), 0.5, np.float32)
    x = preprocess(img, (8, 8), mean=(0.5, 0.25, 0.0), std=(1, 0.5, 0.25))
    assert x.shape == (3, 8, 8)
    assert np.allclose(x[:, 0, 0], [0.0, 0.5, 2.0])
    gray = preprocess(img, (4, 4), channels=1, mean=0, std=1, scale=255)
    assert gray.shape == (1, 4, 4) and np.allclose(gray, 127.5, atol=1e-3)


def test_find_images_walks_sorted_and_filters(tmp_path):
    (tmp_path / "b").mkdir()
    for name in ["b/2.pgm", "b/1.PNG", "a.jpg", "notes.txt"]:
        (tmp_path / name).write_bytes(b"")
    found = [p[len(str(tmp_path)) + 1:] for p in find_images([str(tmp_path)])]
    assert found == ["a.jpg", "b/1.PNG", "b/2.pgm"]


def test_shipped_label_files():
    from .conftest import DIGITS_LABELS, MODELS

    with open(f"{MODELS}/imagenet_classes.txt") as f:
        names = f.read().splitlines()
    assert len(names) == 1000
    assert (names[0], names[1], names[281], names[291], names[948], names[963], names[999]) == (
        "tench", "goldfish", "tabby", "lion", "Granny Smith", "pizza", "toilet tissue")
    with open(DIGITS_LABELS) as f:
        assert f.read().split() == ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
