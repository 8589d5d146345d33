"""Make models/digits.onnx with dlnet itself: a small CNN trained by `dlnet train` on scikit-learn's bundled digits.

Steps (each a file in models/):
  1. digits_train.npz: the training split (75%), upscaled to 16x16 through dlnet.images.preprocess with the CLI's
     defaults, so `dlnet infer models/digits.onnx IMAGE.pgm` needs no preprocessing flags;
  2. digits_init.onnx: the untrained network, exported from torch (op-set 13) with its random initialisation;
  3. `dlnet train models/digits_train.yaml` trains it (Adam, cosine schedule) and writes runs/digits/model.onnx,
     copied to digits.onnx once dlnet classifies the held-out 25% at >= 95%;
  4. digits/<label>_<n>.pgm: one correctly classified held-out digit per class (P5, maxval 16, the raw data).

    python models/make_digits.py        # needs scikit-learn and torch (pip install -e '.[test]'); ~1 min
"""
import os
import shutil
import sys

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import dlnet
from dlnet.images import preprocess

HERE = os.path.dirname(os.path.abspath(__file__))
SIZE = 16
SEED = 0
LABELS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def init_model(path):
    import torch
    from torch import nn
    torch.manual_seed(SEED)
    net = nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * (SIZE // 4) ** 2, 10))
    torch.onnx.export(net.eval(), (torch.zeros(1, 1, SIZE, SIZE),), path, opset_version=13, dynamo=False,
                      do_constant_folding=False, input_names=["image"], output_names=["logits"],
                      dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}})


def inputs(images):
    """uint8 0..16 8x8 digits -> N x 1 x 16 x 16, exactly as `dlnet infer` preprocesses a maxval-16 PGM."""
    return np.stack([preprocess(im[:, :, None].astype(np.float32) / 16, (SIZE, SIZE), channels=1) for im in images])


def write_pgm(path, image):
    with open(path, "wb") as f:
        f.write(b"P5\n8 8\n16\n" + image.astype(np.uint8).tobytes())


def main():
    from dlnet.cli.train import run_training
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(digits.images, digits.target, test_size=0.25,
                                                        random_state=SEED, stratify=digits.target)
    np.savez_compressed(os.path.join(HERE, "digits_train.npz"), x=inputs(x_train), y=y_train.astype(np.int64))
    init_model(os.path.join(HERE, "digits_init.onnx"))
    os.chdir(HERE)  # the config's paths are relative to models/
    run_training("digits_train.yaml", force=True)  # a run of its own each time
    trained = os.path.join(HERE, "runs", "digits", "model.onnx")
    net = dlnet.Net().load_onnx(trained)
    pred = net.run({"image": inputs(x_test)})["logits"].argmax(1)
    accuracy = float((pred == y_test).mean())
    print(f"held-out accuracy (dlnet): {accuracy:.4f} ({int((pred == y_test).sum())}/{len(y_test)})")
    if accuracy < 0.95:
        sys.exit("held-out accuracy below 0.95; digits.onnx left as it was")
    shutil.copyfile(trained, os.path.join(HERE, "digits.onnx"))
    out_dir = os.path.join(HERE, "digits")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    for label in range(10):
        hit = next(i for i in np.flatnonzero(y_test == label) if pred[i] == label)
        write_pgm(os.path.join(out_dir, f"{label}_{hit}.pgm"), x_test[hit])
    with open(os.path.join(HERE, "digits_labels.txt"), "w") as f:
        f.write("".join(f"{name}\n" for name in LABELS))
    print(f"wrote {os.path.join(HERE, 'digits.onnx')} and 10 held-out digits in {out_dir}")


if __name__ == "__main__":
    main()
