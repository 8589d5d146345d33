"""Kernel launches per training step (forward, loss, backward, optimizer), counted by kind. Needs torch, not a GPU.

    python bench/train_launches.py [--nets alexnet,resnet18,resnet50,vgg16,mobilenet_v2] [--batch 2] [--size 224]
                                   [--optimizer adam] [--clip 0] [--run] [--as-gpu]

The nets are bench/gpu_train.py's torchvision models written out in plain torch with the same layer structure (so
torchvision is not needed), random weights, exported to ONNX as bench/gpu_train.py does; "vit" is
bench/cpu_transformers.py's ViT-B/16. The count
depends on the graph, not on the image size (224 keeps AlexNet's and VGG's adaptive pooling exportable); it does
depend on the device class: CPUs add an im2col launch per convolution, GPUs split K of some weight gradients (two
launches). By default the step is planned (kernels built and bound), not run; --run runs one. --as-gpu plans for
an H100-like device (132 compute units) on whatever device there is. Prints tables; asserts nothing.
"""
import argparse
import dataclasses
import os
import sys
from collections import Counter

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import dlnet  # noqa: E402


def resnet(name, classes=10):
    """torchvision.models.resnet18 / resnet50 with their layer structure (BasicBlock / Bottleneck)."""
    import torch
    from torch import nn

    class Basic(nn.Module):
        expansion = 1

        def __init__(self, cin, c, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, c, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(c)
            self.conv2 = nn.Conv2d(c, c, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(c)
            self.down = None
            if stride != 1 or cin != c:
                self.down = nn.Sequential(nn.Conv2d(cin, c, 1, stride, bias=False), nn.BatchNorm2d(c))

        def forward(self, x):
            h = torch.relu(self.bn1(self.conv1(x)))
            h = self.bn2(self.conv2(h))
            return torch.relu(h + (x if self.down is None else self.down(x)))

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, cin, c, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, c, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(c)
            self.conv2 = nn.Conv2d(c, c, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(c)
            self.conv3 = nn.Conv2d(c, 4 * c, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(4 * c)
            self.down = None
            if stride != 1 or cin != 4 * c:
                self.down = nn.Sequential(nn.Conv2d(cin, 4 * c, 1, stride, bias=False), nn.BatchNorm2d(4 * c))

        def forward(self, x):
            h = torch.relu(self.bn1(self.conv1(x)))
            h = torch.relu(self.bn2(self.conv2(h)))
            h = self.bn3(self.conv3(h))
            return torch.relu(h + (x if self.down is None else self.down(x)))

    block, counts = {"resnet18": (Basic, [2, 2, 2, 2]), "resnet50": (Bottleneck, [3, 4, 6, 3])}[name]
    torch.manual_seed(0)
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for i, n in enumerate(counts):
        for j in range(n):
            layers.append(block(cin, 64 * 2 ** i, 2 if i > 0 and j == 0 else 1))
            cin = 64 * 2 ** i * block.expansion
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def alexnet(classes=10):
    from torch import nn
    conv = [(3, 64, 11, 4, 2), (64, 192, 5, 1, 2), (192, 384, 3, 1, 1), (384, 256, 3, 1, 1), (256, 256, 3, 1, 1)]
    layers = []
    for i, (cin, c, k, s, p) in enumerate(conv):
        layers += [nn.Conv2d(cin, c, k, s, p), nn.ReLU()] + ([nn.MaxPool2d(3, 2)] if i in (0, 1, 4) else [])
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(6), nn.Flatten(), nn.Linear(256 * 36, 4096), nn.ReLU(),
                         nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, classes))


def vgg16(classes=10):
    from torch import nn
    layers, cin = [], 3
    for c in [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]:
        if c == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            layers += [nn.Conv2d(cin, c, 3, 1, 1), nn.ReLU()]
            cin = c
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(7), nn.Flatten(), nn.Linear(512 * 49, 4096), nn.ReLU(),
                         nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, classes))


def mobilenet_v2(classes=10):
    """torchvision.models.mobilenet_v2: inverted residual blocks (expand 1x1, depthwise 3x3, project 1x1)."""
    from torch import nn

    def conv_bn(cin, c, k=1, stride=1, groups=1, relu=True):
        return [nn.Conv2d(cin, c, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(c)] + \
            ([nn.ReLU6()] if relu else [])

    class Inverted(nn.Module):
        def __init__(self, cin, c, stride, t):
            super().__init__()
            hidden = cin * t
            layers = (conv_bn(cin, hidden) if t != 1 else []) + conv_bn(hidden, hidden, 3, stride, hidden) + \
                conv_bn(hidden, c, relu=False)
            self.body = nn.Sequential(*layers)
            self.residual = stride == 1 and cin == c

        def forward(self, x):
            return x + self.body(x) if self.residual else self.body(x)

    layers, cin = conv_bn(3, 32, 3, 2), 32
    for t, c, n, s in [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                       (6, 320, 1, 1)]:
        for i in range(n):
            layers.append(Inverted(cin, c, s if i == 0 else 1, t))
            cin = c
    layers += conv_bn(cin, 1280) + [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1280, classes)]
    return nn.Sequential(*layers)


def build(name):
    import torch
    if name in ("resnet18", "resnet50"):
        return resnet(name)
    torch.manual_seed(0)
    if name == "vit":  # bench/cpu_transformers.py's ViT-B/16 (op-set 17 export: LayerNormalization a node)
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import cpu_transformers
        return cpu_transformers.build("vit")[0]
    return {"alexnet": alexnet, "vgg16": vgg16, "mobilenet_v2": mobilenet_v2}[name]()


def export(model, x):
    """gpu_train.py's export (its heavy imports are lazy), so both count the same graph."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpu_train import export as gpu_train_export
    return gpu_train_export(model, x)


def kind_of(launch):
    """A short name for what a launch does: the kernel, with the node's op for generated kernels."""
    fn = launch.kernel.function_name
    grad = "/grad" in (launch.layer or "")
    if fn == "ew":
        op = launch.label.split(" ")[-1]
        kind = "elementwise " + (op if len(op) < 40 else op[:37] + "...")
    elif fn == "red":
        kind = "reduce"
    else:
        kind = fn
    return ("bwd " if grad else "") + kind


def count(ctx, proto, batch, size, opt, clip, run):
    net = dlnet.Net(ctx).load_onnx(proto)
    optimizer = {"adam": dlnet.optim.Adam(lr=1e-3, clip_norm=clip or None),
                 "sgd": dlnet.optim.SGD(lr=0.1, momentum=0.9, clip_norm=clip or None)}[opt]
    trainer = dlnet.Trainer(net, loss="cross_entropy", optimizer=optimizer)
    rng = np.random.default_rng(0)
    feeds = {"input": rng.standard_normal((batch, 3, size, size)).astype(np.float32),
             "target": rng.integers(0, 10, batch)}
    if run:
        trainer.step(feeds)
    else:  # plan only: kernels built and bound, nothing enqueued
        _, shapes, _ = trainer._split(feeds)
        trainer._activate(tuple(shapes[i.name] for i in net.inputs), shapes)
    plan = trainer._active
    graph_launches, update_launches = list(plan.plan.launches), list(plan.launches)
    return graph_launches, update_launches, len(plan.params)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nets", default="alexnet,resnet18,resnet50,vgg16,mobilenet_v2")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--size", type=int, default=224, help="image height and width")
    ap.add_argument("--run", action="store_true", help="run one step (default: plan it only)")
    ap.add_argument("--optimizer", default="adam", choices=["adam", "sgd"])
    ap.add_argument("--clip", type=float, default=0.0, help="clip gradients by global norm (0: off)")
    ap.add_argument("--as-gpu", action="store_true", help="plan as for a GPU with 132 compute units")
    ap.add_argument("--top", type=int, default=25, help="kinds listed per net")
    args = ap.parse_args(argv)
    ctx = dlnet.Context(os.environ.get("DLNET_DEVICE") or "cpu")
    if args.as_gpu:
        ctx.is_cpu = False
        ctx.info = dataclasses.replace(ctx.info, compute_units=132)
    where = "as a 132-unit GPU" if args.as_gpu else str(ctx.info)
    print(f"launches per training step, batch {args.batch}, {args.size}x{args.size}, {args.optimizer}"
          f"{f', clip {args.clip}' if args.clip else ''}; device {where}; {'run' if args.run else 'planned'}")
    for name in [n.strip() for n in args.nets.split(",") if n.strip()]:
        x = np.zeros((1, 3, args.size, args.size), np.float32)
        proto = export(build(name), x)
        graph_l, update_l, n_params = count(ctx, proto, args.batch, args.size, args.optimizer, args.clip,
                                            args.run and not args.as_gpu)
        kinds = Counter(kind_of(launch) for launch in graph_l)
        fwd = sum(n for k, n in kinds.items() if not k.startswith("bwd "))
        print(f"\n{name}: {len(graph_l) + len(update_l)} launches = {fwd} forward+loss, {len(graph_l) - fwd} "
              f"backward, {len(update_l)} update ({n_params} trained parameters)")
        print(f"  {'kind':52s} {'launches':>8}")
        for kind, n in kinds.most_common(args.top):
            print(f"  {kind:52s} {n:8d}")
        rest = len(kinds) - args.top
        if rest > 0:
            print(f"  ({rest} more kinds, {sum(n for _, n in kinds.most_common()[args.top:])} launches)")
        for kind, n in Counter(launch.label.split(" ")[0] for launch in update_l).most_common():
            print(f"  {'update: ' + kind:52s} {n:8d}")


if __name__ == "__main__":
    main()
