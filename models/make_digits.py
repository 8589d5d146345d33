"""Train a small CNN on scikit-learn's bundled 8x8 digits and export models/digits.onnx (opset 13).

The training inputs go through dlnet.images.preprocess with the CLI's defaults (shorter side to 18, centre crop
16x16, scale to [0, 1], gray mean/std), so `dlnet infer models/digits.onnx IMAGE.pgm` needs no preprocessing flags.
Also writes models/digits/<label>_<n>.pgm: correctly classified test digits (P5, maxval 16, the raw data).

    python models/make_digits.py        # ~20 s on 2 CPU cores; prints the test accuracy
"""
import os
import sys

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

from dlnet.images import preprocess

HERE = os.path.dirname(os.path.abspath(__file__))
SIZE = 16
SEED = 0


def model():
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * (SIZE // 4) ** 2, 10))


def inputs(images):
    """uint8 0..16 8x8 digits -> N x 1 x 16 x 16, exactly as `dlnet infer` preprocesses a maxval-16 PGM."""
    return np.stack([preprocess(im[:, :, None].astype(np.float32) / 16, (SIZE, SIZE), channels=1) for im in images])


def write_pgm(path, image):
    with open(path, "wb") as f:
        f.write(b"P5\n8 8\n16\n" + image.astype(np.uint8).tobytes())


def main():
    torch.manual_seed(SEED)
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(digits.images, digits.target, test_size=0.25,
                                                        random_state=SEED, stratify=digits.target)
    xt, yt = torch.from_numpy(inputs(x_train)), torch.from_numpy(y_train).long()
    xv = torch.from_numpy(inputs(x_test))
    net = model()
    opt = torch.optim.Adam(net.parameters(), lr=2e-3)
    gen = torch.Generator().manual_seed(SEED)
    for epoch in range(15):
        net.train()
        for idx in torch.randperm(len(xt), generator=gen).split(64):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
    net.eval()
    with torch.no_grad():
        pred = net(xv).argmax(1).numpy()
    accuracy = float((pred == y_test).mean())
    print(f"test accuracy: {accuracy:.4f} ({int((pred == y_test).sum())}/{len(y_test)})")
    if accuracy < 0.95:
        sys.exit("test accuracy below 0.95; not exporting")
    torch.onnx.export(net, xt[:1], os.path.join(HERE, "digits.onnx"), opset_version=13, dynamo=False,
                      input_names=["image"], output_names=["logits"], dynamic_axes={"image": {0: "batch"},
                                                                                   "logits": {0: "batch"}})
    out_dir = os.path.join(HERE, "digits")
    os.makedirs(out_dir, exist_ok=True)
    for label in range(10):
        hits = [i for i in np.flatnonzero(y_test == label) if pred[i] == label]
        write_pgm(os.path.join(out_dir, f"{label}_{hits[0]}.pgm"), x_test[hits[0]])
    with open(os.path.join(HERE, "digits_labels.txt"), "w") as f:
        f.write("".join(f"{name}\n" for name in ["zero", "one", "two", "three", "four", "five", "six", "seven",
                                                  "eight", "nine"]))
    print(f"wrote {os.path.join(HERE, 'digits.onnx')} and 10 test digits in {out_dir}")


if __name__ == "__main__":
    main()
