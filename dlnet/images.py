"""Images in, model-ready arrays out: files opened safely through Pillow, torchvision's ImageNet preprocessing.

Reading: only regular files are opened (a FIFO, a device, a socket or a directory is refused by name, never read);
Pillow decides the format from the file's header and reads what that header says, no more. Pillow's own
`Image.MAX_IMAGE_PIXELS` is an error here (Pillow only warns between one and two times it), and the decoded image
and its resized copy are capped at MAX_DECODED_BYTES. An animated image gives its first frame.

Preprocessing is torchvision's `Resize(short) -> CenterCrop(size) -> ToTensor -> Normalize` on the PIL image that
torchvision's loader gives (`img.convert("RGB")`, then `convert("L")` for one-channel models, as
`transforms.Grayscale()` does), step for step: the long side is int(short * long / short_side), the resize is
Pillow's BILINEAR (antialiased) on 8-bit pixels, the crop's corner is round((side - crop) / 2). A 16-bit or 32-bit
gray image ("I;16", "I") goes through Pillow's convert("RGB") as torchvision users' code does, which clips values
above 255 (rescale such images to 8 bits first when their range is wider).
"""
import os
import re
import stat
import warnings

import numpy as np

from .errors import InputError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# One-channel models: the mean of the ImageNet channel statistics (torchvision's convention for grayscale).
GRAY_MEAN = (0.449,)
GRAY_STD = (0.226,)
CROP_FRACTION = 0.875  # resize to size / 0.875 (256 for 224), then centre-crop size, as in ImageNet training
MAX_DECODED_BYTES = 1 << 30  # a decoded image, or its resized copy, larger than this is refused
# Pillow formats never opened: EPS is rendered by running Ghostscript, an outside program, on the file.
EXCLUDED_FORMATS = ("EPS",)

_FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
               (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _pil():
    from PIL import Image

    Image.init()  # every plugin registered, so OPEN and the extension table are complete
    return Image


def _formats():
    return [f for f in _pil().OPEN if f not in EXCLUDED_FORMATS]


def image_extensions():
    """The file extensions (lower case, with the dot) of every format Pillow opens here."""
    Image = _pil()
    return {ext for ext, fmt in Image.registered_extensions().items() if fmt in Image.OPEN
            and fmt not in EXCLUDED_FORMATS}


def file_kind(mode):
    """'a FIFO', 'a directory', ... for a stat mode that is not a regular file."""
    return next((name for test, name in _FILE_KINDS if test(mode)), "not a regular file")


def open_regular(path):
    """A binary file object for `path` when it is a regular file; InputError naming it otherwise. The open does not
    block (a FIFO with no writer opens at once) and the check is on the opened file (no swap after a stat)."""
    try:
        kind = os.stat(path).st_mode
        if not stat.S_ISREG(kind):
            raise InputError(f"{path}: {file_kind(kind)}, not an image file")
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):
            raise InputError(f"{path}: {file_kind(kind)}, not an image file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _open_header(f, path):
    """Pillow's Image.open on an opened file: reads the header only; bombs and unknown formats are InputError."""
    Image = _pil()
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)  # over MAX_IMAGE_PIXELS is an error here
        try:
            return Image.open(f, formats=_formats())
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
            claimed = re.search(r"\((\d+) pixels\)", str(e))
            raise InputError(f"{path}: too many pixels (the header says {claimed.group(1) if claimed else 'more'}; "
                             f"the limit is PIL.Image.MAX_IMAGE_PIXELS = {Image.MAX_IMAGE_PIXELS})") from None
        except Image.UnidentifiedImageError:
            raise InputError(f"{path}: not an image file Pillow reads (unknown format)") from None
        except Exception as e:  # noqa: BLE001 - a plugin's header parser raises SyntaxError, ValueError, struct.error
            raise InputError(f"{path}: bad image header ({_short(e)})") from None


def _short(e):
    return (str(e) or type(e).__name__)[:160]


def is_image(path):
    """Whether Pillow identifies `path` (a regular file) from its header; nothing past the header is read."""
    try:
        with open_regular(path) as f:
            _open_header(f, path).close()
        return True
    except InputError:
        return False


def decoded_bytes(im):
    """Bytes of `im` once decoded: width x height x bands x bytes per band."""
    from PIL import ImageMode

    try:
        itemsize = np.dtype(ImageMode.getmode(im.mode).typestr).itemsize
    except (KeyError, TypeError, ValueError):
        itemsize = 4
    return im.width * im.height * len(im.getbands()) * itemsize


def read_image(path, note=None):
    """A regular image file -> a loaded PIL image (the first frame of an animation: `note` hears about it);
    InputError naming the file otherwise."""
    with open_regular(path) as f:
        im = _open_header(f, path)
        fmt = im.format or "image"
        if im.width < 1 or im.height < 1:
            raise InputError(f"{path}: {fmt} of size {im.width}x{im.height} (expected at least 1x1)")
        if decoded_bytes(im) > MAX_DECODED_BYTES:
            raise InputError(f"{path}: {fmt} {im.width}x{im.height} ({im.mode}) decodes to {decoded_bytes(im)} "
                             f"bytes, over the limit of {MAX_DECODED_BYTES}")
        try:
            if getattr(im, "is_animated", False):
                if note is not None:
                    note(f"{path}: animated {fmt}; using its first frame")
                im.seek(0)
            im.load()
        except MemoryError:
            raise InputError(f"{path}: out of memory decoding {fmt} {im.width}x{im.height}") from None
        except Exception as e:  # noqa: BLE001 - decoders raise OSError, ValueError, SyntaxError, EOFError, ...
            what = "truncated image data" if "truncated" in str(e) or "not enough" in str(e) else "cannot decode"
            raise InputError(f"{path}: {what} ({fmt} {im.width}x{im.height}: {_short(e)})") from None
        return im


def find_images(paths, skipped=None):
    """Files as given (each one is an input, whatever it is); directories walked recursively in sorted order,
    keeping each regular file whose extension is one Pillow opens, or else whose header Pillow identifies.
    Entries that are not regular files (FIFOs, devices, sockets, links to them) are passed over, each told to
    `skipped(path, reason)`; symbolic links to directories are not followed."""
    extensions = image_extensions()
    found = []
    for p in paths:
        if not os.path.isdir(p):
            found.append(p)
            continue
        for root, dirs, files in os.walk(p):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(root, name)
                try:
                    mode = os.stat(path).st_mode
                except OSError as e:
                    if skipped is not None:
                        skipped(path, f"cannot read ({e.strerror or e})")
                    continue
                if not stat.S_ISREG(mode):
                    if skipped is not None:
                        skipped(path, f"{file_kind(mode)}, not an image file")
                elif os.path.splitext(name)[1].lower() in extensions or is_image(path):
                    found.append(path)
    return found


def as_pil(img):
    """A PIL image as it is; a numpy array (HxW or HxWxC, C = 1 or 3; uint8, or float in [0, 1] rounded to 8 bits
    the way Pillow scales a PNM's maxval) as an "L" or "RGB" image."""
    Image = _pil()
    if isinstance(img, Image.Image):
        return img
    a = np.asarray(img)
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[:, :, 0]
    if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[2] != 3):
        raise InputError(f"an image array of shape {list(a.shape)} (expected HxW, HxWx1 or HxWx3)")
    if a.dtype != np.uint8:
        a = np.floor(np.clip(np.asarray(a, np.float64), 0, 1) * 255 + 0.5).astype(np.uint8)
    return Image.fromarray(np.ascontiguousarray(a), "L" if a.ndim == 2 else "RGB")


def model_mode(img, channels):
    """torchvision's loader (convert("RGB")), then convert("L") for a one-channel model (transforms.Grayscale)."""
    if channels not in (1, 3):
        raise InputError(f"the model wants {channels} channels; images give 1 (gray) or 3 (RGB)")
    try:
        rgb = img if img.mode == "RGB" else img.convert("RGB")
    except (ValueError, OSError) as e:
        raise InputError(f"cannot convert a {img.mode} image to RGB ({_short(e)})") from None
    return rgb if channels == 3 else rgb.convert("L")


def resized_size(height, width, short):
    """(height, width) after torchvision's Resize(short): the shorter side becomes `short`, the longer one
    int(short * long / short_side), truncated (transforms.functional._compute_resized_output_size)."""
    if width <= height:
        return int(short * height / width), short
    return short, int(short * width / height)


def center_box(height, width, crop_h, crop_w):
    """The (left, top, right, bottom) box of torchvision's CenterCrop: corner round((side - crop) / 2.0)."""
    top = int(round((height - crop_h) / 2.0))
    left = int(round((width - crop_w) / 2.0))
    return left, top, left + crop_w, top + crop_h


def _per_channel(values, channels, name):
    v = np.asarray(values, np.float32).ravel()
    if v.size == 1:
        return np.repeat(v, channels)
    if v.size != channels:
        raise InputError(f"--{name}: {v.size} values for a {channels}-channel input (expected 1 or {channels})")
    return v


def crop_image(img, size, resize=None, channels=3):
    """A PIL image (any mode) or array -> uint8 HxWxC: the model's mode, Resize(resize), CenterCrop(size)."""
    Image = _pil()
    crop_h, crop_w = size
    if resize is None:
        resize = round(max(crop_h, crop_w) / CROP_FRACTION)
    if resize < max(crop_h, crop_w):
        raise InputError(f"--resize {resize} is smaller than the crop {crop_h}x{crop_w}")
    img = model_mode(as_pil(img), channels)
    new_h, new_w = resized_size(img.height, img.width, resize)
    if new_h * new_w * channels > MAX_DECODED_BYTES:
        raise InputError(f"resizing {img.width}x{img.height} to {new_w}x{new_h} (shorter side {resize}) makes "
                         f"{new_h * new_w * channels} bytes, over the limit of {MAX_DECODED_BYTES}")
    if (new_h, new_w) != (img.height, img.width):
        img = img.resize((new_w, new_h), Image.BILINEAR)
    pixels = np.asarray(img.crop(center_box(new_h, new_w, crop_h, crop_w)), np.uint8)
    return pixels.reshape(crop_h, crop_w, channels)


def preprocess(img, size, resize=None, channels=3, mean=None, std=None, scale=1.0, bgr=False):
    """A PIL image (any mode) or array (see as_pil) -> float32 CxHxW, as torchvision's Resize(resize) ->
    CenterCrop(size) -> ToTensor -> Normalize(mean, std) gives it.

    size: (height, width) of the crop; resize: shorter side before cropping (default max(size) / 0.875).
    channels: 3 (RGB) or 1 (Pillow's ITU-R 601 luma, before the resize); scale: ToTensor's [0, 1] times this;
    mean/std default to ImageNet's and are given in the model's channel order (BGR with bgr=True).
    """
    pixels = crop_image(img, size, resize, channels)
    x = pixels.astype(np.float32) / np.float32(255)  # ToTensor
    if scale != 1.0:
        x = x * np.float32(scale)
    if bgr and channels == 3:
        x = x[:, :, ::-1]
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
    x = (x - mean) / std
    return np.ascontiguousarray(x.transpose(2, 0, 1), np.float32)
