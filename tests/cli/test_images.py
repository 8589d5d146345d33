"""Reading images safely and preprocessing them exactly as torchvision does (dlnet/images.py)."""
import contextlib
import os
import signal
import socket
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from dlnet import images
from dlnet.errors import InputError
from dlnet.images import center_box, find_images, preprocess, read_image, resized_size

MEAN = np.array([0.485, 0.456, 0.406], np.float32)
STD = np.array([0.229, 0.224, 0.225], np.float32)


def torchvision_reference(pil, short=256, crop=(224, 224), gray=False):
    """torchvision's PIL path, written from its documented algorithm: the loader's convert("RGB") (Grayscale():
    convert("L")), Resize(short) (long side int(short * long / short_side); F_pil.resize = img.resize((w, h),
    BILINEAR), skipped at equal size), CenterCrop (corner int(round((side - crop) / 2.0)); img.crop(box)), ToTensor
    (uint8 HWC -> float32 CHW / 255), Normalize ((x - mean) / std per channel, float32)."""
    img = pil.convert("RGB")
    if gray:
        img = img.convert("L")
    w, h = img.size
    s, l = (w, h) if w <= h else (h, w)
    new_s, new_l = short, int(short * l / s)
    new_w, new_h = (new_s, new_l) if w <= h else (new_l, new_s)
    if [h, w] != [new_h, new_w]:
        img = img.resize((new_w, new_h), Image.BILINEAR)
    top, left = int(round((new_h - crop[0]) / 2.0)), int(round((new_w - crop[1]) / 2.0))
    img = img.crop((left, top, left + crop[1], top + crop[0]))
    t = np.asarray(img, np.uint8).reshape(crop[0], crop[1], -1).transpose(2, 0, 1).astype(np.float32) / np.float32(255)
    mean, std = (np.float32([0.449]), np.float32([0.226])) if gray else (MEAN, STD)
    return (t - mean[:, None, None]) / std[:, None, None]


def synthetic(mode, width, height, seed):
    """A random image of `mode`: smooth gradients plus noise, so resizing has structure and edges to keep."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    base = (xx * 7 + yy * 3) % 256
    noise = lambda hi, *shape: rng.integers(0, hi, (height, width) + shape)
    if mode in ("RGB", "RGBA", "CMYK"):
        bands = len(mode)
        a = (base[..., None] + noise(80, bands)) % 256
        return Image.fromarray(a.astype(np.uint8), mode)
    if mode in ("L", "LA"):
        a = (base[..., None] + noise(80, 2)) % 256
        return Image.fromarray(a.astype(np.uint8)[..., 0], "L") if mode == "L" else Image.fromarray(
            a.astype(np.uint8), "LA")
    if mode == "P":
        im = Image.fromarray(noise(256).astype(np.uint8), "P")
        im.putpalette(rng.integers(0, 256, 768).astype(np.uint8).tobytes())
        return im
    if mode == "1":
        return Image.fromarray(noise(2).astype(bool))
    if mode == "I;16":  # values around 255: Pillow's convert("RGB") clips the ones above
        return Image.fromarray((base + noise(200)).astype(np.uint16))
    if mode == "I":
        return Image.fromarray((base + noise(300) - 50).astype(np.int32), "I")
    raise AssertionError(mode)


MODES = ["RGB", "L", "RGBA", "P", "I;16", "I", "LA", "1", "CMYK"]
SIZES = [(300, 257), (257, 300), (224, 224), (100, 500), (256, 291), (640, 480), (1, 1), (3, 700)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("width, height", SIZES)
def test_preprocess_equals_torchvision_reference(mode, width, height):
    pil = synthetic(mode, width, height, seed=width * 1000 + height)
    assert pil.mode == mode
    want = torchvision_reference(pil)
    got = preprocess(pil, (224, 224))
    assert got.shape == want.shape == (3, 224, 224) and got.dtype == np.float32
    # 1/255 after normalisation is a quarter of one 8-bit step: every pixel must agree exactly
    assert np.abs(got - want).max() <= 1 / 255


@pytest.mark.parametrize("mode", ["RGB", "L", "P", "I;16"])
@pytest.mark.parametrize("crop, short", [((16, 16), 18), ((20, 12), 23), ((224, 224), 224)])
def test_preprocess_other_sizes_and_gray_models(mode, crop, short):
    pil = synthetic(mode, 45, 37, seed=7)
    for gray in (False, True):
        want = torchvision_reference(pil, short, crop, gray=gray)
        got = preprocess(pil, crop, resize=short, channels=1 if gray else 3)
        assert got.shape == want.shape and np.abs(got - want).max() <= 1 / 255


@pytest.mark.parametrize("mode, ext", [("RGB", "png"), ("L", "png"), ("RGBA", "png"), ("P", "png"), ("I;16", "png"),
                                       ("LA", "png"), ("1", "png"), ("I", "tiff"), ("CMYK", "tiff"), ("RGB", "bmp"),
                                       ("P", "gif"), ("RGB", "webp"), ("L", "ppm")])
def test_files_read_as_pillow_opens_them(tmp_path, mode, ext):
    """read_image keeps the file's own mode, so a file preprocesses as torchvision's loader would take it."""
    path = tmp_path / f"im.{ext}"
    synthetic(mode, 61, 45, seed=3).save(path, **({"lossless": True} if ext == "webp" else {}))
    with Image.open(path) as pil:
        want = torchvision_reference(pil)
    got = preprocess(read_image(str(path)), (224, 224))
    assert np.abs(got - want).max() <= 1 / 255


def test_torchvision_geometry():
    """The two differences from the float resize dlnet had: the long side truncates, the crop's corner rounds half to
    even (Python's round, as torchvision calls it)."""
    assert resized_size(300, 257, 256) == (298, 256)  # 256 * 300 / 257 = 298.8
    assert resized_size(257, 300, 256) == (256, 298)
    assert resized_size(500, 100, 256) == (1280, 256) and resized_size(1, 1, 256) == (256, 256)
    assert center_box(291, 256, 224, 224) == (16, 34, 240, 258)  # (291 - 224) / 2 = 33.5 -> 34
    assert center_box(289, 256, 224, 224)[1] == 32  # 32.5 -> 32


def test_arrays_are_rounded_to_8_bits_as_pillow_scales_a_pnm():
    rng = np.random.default_rng(4)
    a = rng.random((9, 13, 1)).astype(np.float32)
    as_uint8 = np.floor(a[:, :, 0] * 255 + 0.5).astype(np.uint8)
    want = preprocess(Image.fromarray(as_uint8, "L"), (8, 8), channels=1)
    assert np.array_equal(preprocess(a, (8, 8), channels=1), want)
    # a maxval-16 PGM as Pillow scales it, and as the same data's array
    pgm = rng.integers(0, 17, (8, 8)).astype(np.uint8)
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"dlnet-test-{os.getpid()}.pgm")
    try:
        with open(path, "wb") as f:
            f.write(b"P5\n8 8\n16\n" + pgm.tobytes())
        from_file = preprocess(read_image(path), (16, 16), channels=1)
    finally:
        os.unlink(path)
    assert np.array_equal(from_file, preprocess(pgm[:, :, None] / 16, (16, 16), channels=1))


def test_normalise_scale_and_bgr():
    img = Image.fromarray(np.full((10, 20, 3), (255, 51, 0), np.uint8))
    x = preprocess(img, (8, 8), mean=(0.5, 0.25, 0.0), std=(1, 0.5, 0.25))
    assert x.shape == (3, 8, 8) and np.allclose(x[:, 3, 3], [0.5, -0.1, 0.0], atol=1e-6)
    bgr = preprocess(img, (8, 8), bgr=True, mean=0, std=1, scale=255)
    assert np.allclose(bgr[:, 0, 0], [0, 51, 255], atol=1e-4)
    with pytest.raises(InputError, match="--resize 7 is smaller than the crop 8x8"):
        preprocess(img, (8, 8), resize=7)
    with pytest.raises(InputError, match="--std: a standard deviation of 0"):
        preprocess(img, (8, 8), std=0)


class Hung(BaseException):
    """Raised by within(): a BaseException, so no `except OSError` in the code under test swallows it."""


@contextlib.contextmanager
def within(seconds):
    """Fail (not hang) when the block takes longer than `seconds`."""
    def expire(signum, frame):
        raise Hung(f"took over {seconds} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def special_files(folder):
    """A FIFO, a link to /dev/zero and a listening socket, named like images."""
    os.mkfifo(folder / "fifo.png")
    os.symlink("/dev/zero", folder / "zero.jpg")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(folder / "sock.png"))
    except OSError as e:  # a temp folder's path too long for a socket
        sock.close()
        pytest.skip(f"cannot make a socket in {folder} ({e})")
    return sock


def test_only_regular_files_are_opened(tmp_path):
    sock = special_files(tmp_path)
    try:
        with within(3):
            for name, kind in [("fifo.png", "a FIFO"), ("zero.jpg", "a character device"), ("sock.png", "a socket")]:
                with pytest.raises(InputError, match=f"^{tmp_path / name}: {kind}, not an image file$"):
                    read_image(str(tmp_path / name))
            with pytest.raises(InputError, match="^/dev/zero: a character device"):
                read_image("/dev/zero")
            with pytest.raises(InputError, match=f"^{tmp_path}: a directory"):
                read_image(str(tmp_path))
            skipped = []
            Image.new("RGB", (3, 3)).save(tmp_path / "real.png")
            found = find_images([str(tmp_path)], skipped=lambda p, why: skipped.append((os.path.basename(p), why)))
    finally:
        sock.close()
    assert found == [str(tmp_path / "real.png")]
    assert skipped == [("fifo.png", "a FIFO, not an image file"), ("sock.png", "a socket, not an image file"),
                       ("zero.jpg", "a character device, not an image file")]


def png_claiming(width, height):
    """A tiny PNG whose header claims width x height (8-bit gray) with one row of data."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00" * (width + 1))) + chunk(b"IEND", b""))


@pytest.mark.parametrize("width, height", [(100_000, 100_000), (10_000, 10_000)])
def test_pixel_caps_are_errors(tmp_path, width, height):
    """Over twice Pillow's MAX_IMAGE_PIXELS Pillow raises; between one and two times it only warns: both refused."""
    assert Image.MAX_IMAGE_PIXELS < width * height
    path = tmp_path / "bomb.png"
    path.write_bytes(png_claiming(width, height))
    assert path.stat().st_size < 1000
    with pytest.raises(InputError) as e:
        read_image(str(path))
    assert str(e.value) == (f"{path}: too many pixels (the header says {width * height}; the limit is "
                            f"PIL.Image.MAX_IMAGE_PIXELS = {Image.MAX_IMAGE_PIXELS})")


def test_decoded_size_cap(tmp_path, monkeypatch):
    Image.new("RGBA", (40, 30)).save(tmp_path / "a.png")
    monkeypatch.setattr(images, "MAX_DECODED_BYTES", 40 * 30 * 4 - 1)
    with pytest.raises(InputError, match=r"a.png: PNG 40x30 \(RGBA\) decodes to 4800 bytes, over the limit of 4799"):
        read_image(str(tmp_path / "a.png"))
    monkeypatch.setattr(images, "MAX_DECODED_BYTES", 40 * 30 * 4)
    read_image(str(tmp_path / "a.png"))
    Image.new("L", (1, 300)).save(tmp_path / "thin.png")  # resizes to 256 x 76800: over the cap
    with pytest.raises(InputError, match="resizing 1x300 to 256x76800"):
        preprocess(read_image(str(tmp_path / "thin.png")), (224, 224))


@pytest.mark.parametrize("data, reason", [
    (b"definitely not an image", "not an image file Pillow reads (unknown format)"),
    (b"", "not an image file Pillow reads"),
    (b"P6\n4 4\n255\n\x00\x10", "truncated image data (PPM 4x4"),
    (b"P5\n8 8\n16\n\x00\x01\x02", "truncated image data (PPM 8x8"),
    (b"P6\n99999999 99999999\n255\n\x00", "too many pixels"),
])
def test_broken_files_name_the_path(tmp_path, data, reason):
    path = tmp_path / "x.img"
    path.write_bytes(data)
    with pytest.raises(InputError) as e:
        read_image(str(path))
    assert str(e.value).startswith(f"{path}: ") and reason in str(e.value) and "<_io" not in str(e.value)


def test_cut_png_and_missing_file(tmp_path):
    Image.new("RGB", (30, 20), (200, 10, 10)).save(tmp_path / "red.png")
    (tmp_path / "cut.png").write_bytes((tmp_path / "red.png").read_bytes()[:60])
    with pytest.raises(InputError, match=f"^{tmp_path / 'cut.png'}: (truncated image data|cannot decode) "):
        read_image(str(tmp_path / "cut.png"))
    with pytest.raises(InputError, match=r"nope.png: cannot read \(No such file or directory\)"):
        read_image(str(tmp_path / "nope.png"))


def test_animated_gif_gives_its_first_frame_with_a_note(tmp_path):
    frames = [Image.new("RGB", (12, 10), c) for c in [(250, 0, 0), (0, 250, 0), (0, 0, 250)]]
    frames[0].save(tmp_path / "a.gif", save_all=True, append_images=frames[1:], duration=50, loop=0)
    notes = []
    im = read_image(str(tmp_path / "a.gif"), note=notes.append)
    assert np.array_equal(np.asarray(im.convert("RGB"))[5, 5], [250, 0, 0])
    assert notes == [f"{tmp_path / 'a.gif'}: animated GIF; using its first frame"]
    frames[1].save(tmp_path / "still.gif")
    notes.clear()
    assert np.array_equal(np.asarray(read_image(str(tmp_path / "still.gif"), notes.append).convert("RGB"))[0, 0],
                          [0, 250, 0]) and notes == []


def test_find_images_by_extension_or_header_sorted(tmp_path):
    (tmp_path / "b").mkdir()
    for name, fmt in [("b/2.pgm", "PPM"), ("b/1.PNG", "PNG"), ("a.jpg", "JPEG"), ("c.bmp", "BMP"), ("d.tif", "TIFF"),
                      ("e.webp", "WEBP"), ("f.gif", "GIF"), ("noext", "PNG"), ("photo.dat", "JPEG")]:
        Image.new("L" if fmt == "PPM" else "RGB", (4, 4)).save(tmp_path / name, format=fmt)
    (tmp_path / "notes.txt").write_text("not an image")
    (tmp_path / "broken.png").write_bytes(b"not a png either")  # an image by its name: read, and reported, later
    found = [p[len(str(tmp_path)) + 1:] for p in find_images([str(tmp_path)])]
    assert found == ["a.jpg", "broken.png", "c.bmp", "d.tif", "e.webp", "f.gif", "noext", "photo.dat",  # a folder's
                     "b/1.PNG", "b/2.pgm"]  # files first, sorted, then its sub-folders
    assert find_images([str(tmp_path / "notes.txt")]) == [str(tmp_path / "notes.txt")]  # a file named is an input


def test_shipped_label_files():
    from .conftest import DIGITS_LABELS, MODELS

    with open(f"{MODELS}/imagenet_classes.txt") as f:
        names = f.read().splitlines()
    assert len(names) == 1000
    assert (names[0], names[1], names[281], names[291], names[948], names[963], names[999]) == (
        "tench", "goldfish", "tabby", "lion", "Granny Smith", "pizza", "toilet tissue")
    with open(DIGITS_LABELS) as f:
        assert f.read().split() == ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
