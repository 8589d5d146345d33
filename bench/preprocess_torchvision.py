"""dlnet's image preprocessing against torchvision's own, on a folder of images (for the GPU machine, where
torchvision is installed; it is imported only when this script runs).

    python bench/preprocess_torchvision.py FOLDER [--model resnet18 [--weights FILE.pth]] [--device cuda]

For each image Pillow reads in FOLDER: torchvision's Compose([Resize(256), CenterCrop(224), ToTensor(),
Normalize(ImageNet mean, std)]) on Image.open(path).convert("RGB") (its ImageFolder loader), against
dlnet.images.preprocess(read_image(path), (224, 224)), the path `dlnet infer` takes. Prints the maximum and mean
absolute difference (normalised units: one 8-bit step is about 0.017, the target is <= 1/255), and with --model the
top-1 class a torchvision classifier gives each tensor and the relative L2 difference of its logits. Weights:
--weights FILE (a state_dict), else torchvision's DEFAULT weights where they are in torch's hub cache already
(nothing is downloaded), else the random initialisation (seed 0), which the output says. Prints a table; asserts
nothing.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dlnet.images import IMAGENET_MEAN, IMAGENET_STD, find_images, preprocess, read_image  # noqa: E402


def torchvision_transform():
    try:
        from torchvision import transforms
    except ImportError:
        sys.exit("preprocess_torchvision.py: torchvision is not installed here (the GPU machine has it)")

    return transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(),
                               transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])


def load_classifier(name, weights_file, device):
    """(torchvision model in eval mode on `device`, where its weights came from)."""
    import torch
    import torchvision

    model = torchvision.models.get_model(name, weights=None)
    source = "random initialisation (seed 0): top-1 agreement measures sensitivity, not accuracy"
    if weights_file:
        model.load_state_dict(torch.load(weights_file, map_location="cpu", weights_only=True))
        source = weights_file
    else:
        default = torchvision.models.get_model_weights(name).DEFAULT
        cached = os.path.join(torch.hub.get_dir(), "checkpoints", os.path.basename(default.url))
        if os.path.exists(cached):
            model.load_state_dict(torch.load(cached, map_location="cpu", weights_only=True))
            source = f"{default} (hub cache)"
        else:
            torch.manual_seed(0)
            model = torchvision.models.get_model(name, weights=None)
    return model.eval().to(device), source


def logits(model, x, device):
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(np.ascontiguousarray(x))[None].to(device))[0].double().cpu().numpy()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder")
    ap.add_argument("--model", default=None, help="a torchvision classifier name, e.g. resnet18")
    ap.add_argument("--weights", default=None, help="a state_dict file for --model")
    ap.add_argument("--device", default="cuda", help="torch device for --model (default cuda)")
    args = ap.parse_args()

    from PIL import Image

    transform = torchvision_transform()
    model, source = load_classifier(args.model, args.weights, args.device) if args.model else (None, None)
    if model is not None:
        print(f"model: {args.model}, weights: {source}")
    rows, worst, agree = [], 0.0, 0
    for path in find_images([args.folder]):
        with Image.open(path) as im:
            size, mode = f"{im.width}x{im.height}", im.mode
            want = transform(im.convert("RGB")).numpy()
        got = preprocess(read_image(path), (224, 224))
        diff = np.abs(got - want)
        worst = max(worst, float(diff.max()))
        row = [os.path.relpath(path, args.folder), size, mode, f"{diff.max():.2e}", f"{diff.mean():.2e}"]
        if model is not None:
            ya, yb = logits(model, want, args.device), logits(model, got, args.device)
            a, b = int(ya.argmax()), int(yb.argmax())
            agree += a == b
            rel = np.linalg.norm(yb - ya) / max(np.linalg.norm(ya), 1e-30)
            row += [str(a), str(b), "yes" if a == b else "NO", f"{rel:.1e}"]
        rows.append(row)
    header = ["image", "size", "mode", "max |diff|", "mean |diff|"]
    header += ["top-1 torchvision", "top-1 dlnet", "agree", "logits rel. L2"] if model is not None else []
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    for r in [header, ["-" * w for w in widths]] + rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    verdict = "within" if worst <= 1 / 255 else "OVER"
    print(f"\n{len(rows)} images: largest difference {worst:.2e} ({verdict} 1/255 = {1 / 255:.2e})"
          + (f"; top-1 agreement {agree}/{len(rows)}" if model is not None else ""))


if __name__ == "__main__":
    main()
