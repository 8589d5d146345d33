"""Images in, model-ready arrays out: a PNM reader, Pillow for PNG/JPEG, ImageNet-style preprocessing."""
import os

import numpy as np

from .errors import InputError

IMAGE_EXTENSIONS = (".ppm", ".pgm", ".pnm", ".png", ".jpg", ".jpeg")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# One-channel models: the mean of the ImageNet channel statistics (torchvision's convention for grayscale).
GRAY_MEAN = (0.449,)
GRAY_STD = (0.226,)
CROP_FRACTION = 0.875  # resize to size / 0.875 (256 for 224), then centre-crop size, as in ImageNet training
MAX_PIXELS = 1 << 28  # refuse headers that promise more than this (a corrupt or hostile file)
_MAX_TOKEN = 20  # no PNM header number is longer than this

_PNM_KINDS = {b"P2": (1, False), b"P3": (3, False), b"P5": (1, True), b"P6": (3, True)}


def find_images(paths):
    """Files as given, directories walked recursively (sorted), keeping files with an image extension."""
    found = []
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, files in os.walk(p):
                dirs.sort()
                for f in sorted(files):
                    if f.lower().endswith(IMAGE_EXTENSIONS):
                        found.append(os.path.join(root, f))
        else:
            found.append(p)
    return found


def _pnm_header(data, path):
    """(magic, width, height, maxval, offset of the pixel data)."""
    magic = data[:2]
    pos, tokens = 2, []
    while len(tokens) < 3:
        while pos < len(data) and (data[pos:pos + 1].isspace() or data[pos:pos + 1] == b"#"):
            if data[pos:pos + 1] == b"#":
                end = data.find(b"\n", pos)
                pos = len(data) if end < 0 else end
            pos += 1
        start = pos
        while pos < len(data) and not data[pos:pos + 1].isspace() and data[pos:pos + 1] != b"#":
            pos += 1
        token = data[start:pos]
        if not token:
            raise InputError(f"{path}: truncated PNM header (expected width, height and maxval)")
        if len(token) > _MAX_TOKEN or not token.isdigit():
            raise InputError(f"{path}: bad PNM header field {token[:_MAX_TOKEN].decode('latin-1')!r} "
                             "(expected a decimal number)")
        tokens.append(int(token))
    width, height, maxval = tokens
    if width < 1 or height < 1:
        raise InputError(f"{path}: PNM size {width}x{height} (expected at least 1x1)")
    if width * height > MAX_PIXELS:
        raise InputError(f"{path}: PNM size {width}x{height} is over the limit of {MAX_PIXELS} pixels")
    if not 1 <= maxval <= 65535:
        raise InputError(f"{path}: PNM maxval {maxval} (expected 1..65535)")
    return magic, width, height, maxval, pos + 1  # exactly one whitespace byte ends the header


def read_pnm(data, path="<bytes>"):
    """P2/P3/P5/P6 with maxval up to 65535 -> float32 HxWxC in [0, 1] (Pillow keeps only 8 bits of 16-bit P6)."""
    magic = data[:2]
    if magic not in _PNM_KINDS:
        raise InputError(f"{path}: not a PPM/PGM file (magic {magic!r}, expected P2, P3, P5 or P6)")
    channels, binary = _PNM_KINDS[magic]
    magic, width, height, maxval, offset = _pnm_header(data, path)
    count = width * height * channels
    if binary:
        dtype = np.dtype(">u2") if maxval > 255 else np.dtype("u1")
        need = count * dtype.itemsize
        if len(data) - offset < need:
            raise InputError(f"{path}: truncated image data ({len(data) - offset} of {need} bytes for "
                             f"{width}x{height}x{channels})")
        pixels = np.frombuffer(data, dtype, count, offset)
    else:
        fields = data[offset:].split()
        if len(fields) < count:
            raise InputError(f"{path}: truncated image data ({len(fields)} of {count} values for "
                             f"{width}x{height}x{channels})")
        try:
            pixels = np.array([int(f) for f in fields[:count]], np.int64)
        except ValueError:
            raise InputError(f"{path}: bad pixel value in plain PNM data (expected decimal numbers)") from None
    if pixels.max(initial=0) > maxval:
        raise InputError(f"{path}: pixel value {int(pixels.max())} exceeds maxval {maxval}")
    return (pixels.astype(np.float32) / np.float32(maxval)).reshape(height, width, channels)


def read_image(path):
    """Any supported file -> float32 HxWxC (C = 1 or 3) in [0, 1]; InputError naming the file otherwise."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_PIXELS * 6 + 4096)
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror or e})") from None
    if not data:
        raise InputError(f"{path}: empty file")
    if data[:2] in _PNM_KINDS:
        return read_pnm(data, path)
    if data[:8] != b"\x89PNG\r\n\x1a\n" and data[:3] != b"\xff\xd8\xff":
        raise InputError(f"{path}: unsupported image format (expected PPM/PGM P2/P3/P5/P6, PNG or JPEG)")
    import io

    from PIL import Image

    Image.MAX_IMAGE_PIXELS = MAX_PIXELS
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            if im.mode in ("I;16", "I;16B", "I"):
                a = np.asarray(im, np.float32) / np.float32(65535)
                return np.clip(a, 0, 1)[:, :, None]
            if im.mode in ("L", "1"):
                return (np.asarray(im.convert("L"), np.float32) / np.float32(255))[:, :, None]
            return np.asarray(im.convert("RGB"), np.float32) / np.float32(255)
    except Exception as e:  # noqa: BLE001 - Pillow raises OSError, SyntaxError, DecompressionBombError, ...
        raise InputError(f"{path}: cannot decode image ({str(e)[:160]})") from None


def _resize(img, height, width):
    """Bilinear resize of float HxWxC, channel by channel in Pillow's float mode."""
    from PIL import Image

    if img.shape[:2] == (height, width):
        return img
    chans = [np.asarray(Image.fromarray(np.ascontiguousarray(img[:, :, c]), "F")
                        .resize((width, height), Image.BILINEAR)) for c in range(img.shape[2])]
    return np.stack(chans, axis=2).astype(np.float32)


def _per_channel(values, channels, name):
    v = np.asarray(values, np.float32).ravel()
    if v.size == 1:
        return np.repeat(v, channels)
    if v.size != channels:
        raise InputError(f"--{name}: {v.size} values for a {channels}-channel input (expected 1 or {channels})")
    return v


def preprocess(img, size, resize=None, channels=3, mean=None, std=None, scale=1.0, bgr=False):
    """float HxWxC in [0, 1] -> float32 CxHxW: resize the shorter side, centre-crop, scale, normalise.

    size: (height, width) of the crop; resize: shorter side before cropping (default max(size) / 0.875).
    channels: 1 converts colour to luma (ITU-R 601), 3 repeats a gray image; mean/std default to ImageNet's
    and are given in the model's channel order (BGR with bgr=True).
    """
    crop_h, crop_w = size
    if resize is None:
        resize = round(max(crop_h, crop_w) / CROP_FRACTION)
    if resize < max(crop_h, crop_w):
        raise InputError(f"--resize {resize} is smaller than the crop {crop_h}x{crop_w}")
    h, w = img.shape[:2]
    if h <= w:
        new_h, new_w = resize, max(resize, round(w * resize / h))
    else:
        new_h, new_w = max(resize, round(h * resize / w)), resize
    img = _resize(img, new_h, new_w)
    top, left = (new_h - crop_h) // 2, (new_w - crop_w) // 2
    img = img[top:top + crop_h, left:left + crop_w]
    if channels == 1 and img.shape[2] == 3:
        img = img @ np.array([0.299, 0.587, 0.114], np.float32)[:, None]
    elif channels == 3 and img.shape[2] == 1:
        img = np.repeat(img, 3, axis=2)
    elif channels not in (1, 3):
        raise InputError(f"the model wants {channels} channels; images give 1 (gray) or 3 (RGB)")
    if bgr and channels == 3:
        img = img[:, :, ::-1]
    # mean/std are in the model's channel order; the ImageNet defaults are RGB, so they flip with bgr
    order = -1 if bgr else 1
    if mean is None:
        mean = GRAY_MEAN if channels == 1 else IMAGENET_MEAN[::order]
    if std is None:
        std = GRAY_STD if channels == 1 else IMAGENET_STD[::order]
    mean = _per_channel(mean, channels, "mean")
    std = _per_channel(std, channels, "std")
    if np.any(std == 0):
        raise InputError("--std: a standard deviation of 0")
    x = (img * np.float32(scale) - mean) / std
    return np.ascontiguousarray(x.transpose(2, 0, 1), np.float32)
