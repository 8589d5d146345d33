"""The training images: an .npz or a folder of class sub-folders, and the per-batch augmentation."""
import os

import numpy as np

from dlnet.errors import ConfigError


def load_dataset(cfg, channels=3):
    """(x float32 [N, C, H, W], y int64 [N], class names). A folder holds one sub-folder per class (sorted names
    give the class indices); its images are read as grey (channels 1) or RGB, scaled to [0, 1]."""
    p = cfg["dataset"]["path"]
    if p.endswith(".npz"):
        try:
            d = np.load(p)
            x, y = d["x"].astype(np.float32), d["y"]
        except (OSError, KeyError, ValueError) as e:
            raise ConfigError(f"dataset.path {p!r}: expected an .npz with arrays x and y ({e})") from None
        return x, y, [str(c) for c in range(int(y.max()) + 1 if y.ndim == 1 and len(y) else 0)]
    if os.path.isdir(p):
        from PIL import Image, UnidentifiedImageError
        classes = sorted(c for c in os.listdir(p) if os.path.isdir(os.path.join(p, c)))
        size = cfg["preprocess"]["resize"]
        xs, ys = [], []
        for k, c in enumerate(classes):
            for f in sorted(os.listdir(os.path.join(p, c))):
                if f.startswith("."):
                    continue
                file = os.path.join(p, c, f)
                try:
                    im = Image.open(file).convert("L" if channels == 1 else "RGB")
                except (OSError, UnidentifiedImageError) as e:
                    raise ConfigError(f"dataset {file}: not a readable image ({e})") from None
                if size:
                    im = im.resize((size[1], size[0]), Image.BILINEAR)
                a = np.asarray(im, np.float32) / 255.0
                a = a[None] if a.ndim == 2 else a.transpose(2, 0, 1)
                if xs and a.shape != xs[0].shape:
                    raise ConfigError(f"dataset {file}: image is {a.shape[2]}x{a.shape[1]}, the first one "
                                      f"{xs[0].shape[2]}x{xs[0].shape[1]}; set preprocess.resize: [height, width]")
                xs.append(a)
                ys.append(k)
        if not xs:
            raise ConfigError(f"dataset.path {p!r}: no images in class sub-folders")
        return np.stack(xs), np.array(ys, np.int64), classes
    raise ConfigError(f"dataset.path {p!r}: expected an .npz with arrays x, y or a folder with a sub-folder per class")


def augment(x, cfg, rng):
    """Random horizontal flips and pad-and-crop, one draw per image from `rng`, then normalise."""
    pre = cfg["preprocess"]
    if pre["flip"]:
        flip = rng.random(len(x)) < 0.5
        x = np.where(flip[:, None, None, None], x[..., ::-1], x)
    if pre["random_crop"]:
        pad = int(pre["random_crop"][0])
        h, w = x.shape[2], x.shape[3]
        xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        offsets = rng.integers(0, 2 * pad + 1, (len(x), 2))
        x = np.stack([xp[i, :, dy:dy + h, dx:dx + w] for i, (dy, dx) in enumerate(offsets)]) if len(x) else x
    return normalise(x, cfg)


def normalise(x, cfg):
    mean = np.asarray(cfg["preprocess"]["mean"], np.float32).reshape(-1, 1, 1)
    std = np.asarray(cfg["preprocess"]["std"], np.float32).reshape(-1, 1, 1)
    return np.ascontiguousarray((x - mean) / std, dtype=np.float32)


def check_dataset(x, y, cfg):
    """Raise a ConfigError naming the key when the data and the config do not fit together (before any folder is
    made): shapes, labels, the channels of preprocess.mean and std, a training set left by dataset.val_split."""
    p = cfg["dataset"]["path"]
    if x.ndim != 4 or len(x) == 0 or len(x) != len(y):
        raise ConfigError(f"dataset.path {p!r}: x is {list(x.shape)} and y {list(y.shape)}; expected x [N, C, H, W] "
                          f"with N >= 1 and y of N labels")
    if cfg["loss"] in ("cross_entropy", "nll") and (y.ndim != 1 or y.dtype.kind not in "iu" or (y < 0).any()):
        raise ConfigError(f"dataset.path {p!r}: y must hold class indices (integers >= 0) for loss {cfg['loss']}")
    for key in ("mean", "std"):
        v = cfg["preprocess"][key]
        if isinstance(v, list) and len(v) not in (1, x.shape[1]):
            raise ConfigError(f"preprocess.{key}: {len(v)} values, the images have {x.shape[1]} channels "
                              f"(give one value, or one per channel)")
    if len(x) - int(len(x) * cfg["dataset"]["val_split"]) < 1:
        raise ConfigError(f"dataset.val_split {cfg['dataset']['val_split']}: leaves none of the {len(x)} images to "
                          f"train on")
