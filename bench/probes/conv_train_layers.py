"""Per-layer kernel time and TFLOP/s of a training step's convolutions: each Conv, ConvGradX and ConvGradW node of
the plan, its geometry, the path it took (Winograd, implicit GEMM, flipped, depthwise) and its launches; other ops
named in --op (BatchNormTrain, BatchNormTrainGrad, ...) with their tensors' bytes per second.

    python3 bench/probes/conv_train_layers.py [--net alexnet] [--batch 16] [--iters 5] [--op ConvGradW]
                                              [--set name=value ...]

Runs on the GPU machine (torchvision there). FLOPs are the direct convolution's (2 per multiply-add), so a Winograd
layer's rate is an effective one. Prints a table; asserts nothing.
"""
import argparse
import ast
import os
import sys

import numpy as np

import dlnet
from dlnet.graph.ops.nn import conv_geometry

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from gpu_train import export, torch_model  # noqa: E402

CONVS = ("Conv", "ConvGradX", "ConvGradW")


def flops(node):
    g = conv_geometry(node)
    w = node.attrs["w_shape"] if node.op == "ConvGradW" else node.inputs[1].shape
    return 2 * g.N * g.OH * g.OW * int(np.prod(w))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--net", default="alexnet")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--op", default="Conv,ConvGradX,ConvGradW")
    ap.add_argument("--set", nargs="*", default=[], help="dlnet.Options fields, name=value (Python literals)")
    args = ap.parse_args()
    ctx = dlnet.Context("gpu", profile=True)
    ctx = ctx.with_options(**{k: ast.literal_eval(v) for k, v in (kv.split("=", 1) for kv in args.set)})
    xs = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    proto = export(torch_model(args.net), xs)
    trainer = dlnet.Trainer(dlnet.Net(ctx).load_onnx(proto), loss="cross_entropy", optimizer=dlnet.optim.Adam(lr=1e-4))
    name = trainer.net.inputs[0].name
    trainer.step({name: xs, "target": np.random.default_rng(0).integers(0, 1000, args.batch)})
    active = trainer._active
    launches = active.plan.launches + active.launches
    ms = {}
    total = 0.0
    for _ in range(args.iters):
        events = [(launch, launch.enqueue(ctx.queue)) for launch in launches]
        ctx.queue.finish()
        for launch, ev in events:
            t = (ev.profile.end - ev.profile.start) * 1e-6 / args.iters
            part = launch.label.split(" ", 2)[2] if launch.label.count(" ") >= 2 else "-"
            ms.setdefault(launch.layer, []).append((part, t))
            total += t
    kinds = {}
    for layer, parts in ms.items():
        kind = layer.split(" ")[-1] if layer else "-"
        kinds[kind] = kinds.get(kind, 0.0) + sum(t for _, t in parts)
    ops = args.op.split(",")
    print(f"{args.net} b{args.batch} training step: {total:.2f} ms of kernel time in {len(launches)} launches")
    print(f"{'node':14s} {'op':10s} {'x':>16s} {'w':>18s} {'s':>3s} {'path':10s} {'ms':>7s} {'TFLOP/s':>8s}  launches")
    sums = {}
    for node in active.graph.nodes:
        key = f"{node.name} {node.op}"
        if node.op not in ops or key not in ms:
            continue
        per = {}
        for label, t in ms.pop(key):
            per[label] = per.get(label, 0.0) + t
        t = sum(per.values())
        path = node.schedule.get("algo") or ("winograd" if node.attrs.get("winograd") else "")
        sums[node.op] = sums.get(node.op, 0.0) + t
        if node.op not in CONVS:  # a memory-bound op: its tensors' bytes (each read or written once) per second
            nbytes = sum(4 * v.size for v in node.inputs + node.outputs if v is not None and v.const is None)
            print(f"{node.name[-14:]:14s} {node.op:18s} {str(list(node.inputs[0].shape)):>20s} {t:7.3f} ms "
                  f"{nbytes / t * 1e-6:7.0f} GB/s  " + ", ".join(f"{label} {v:.3f}" for label, v in per.items()))
            continue
        g = conv_geometry(node)
        w = node.attrs["w_shape"] if node.op == "ConvGradW" else node.inputs[1].shape
        parts = ", ".join(f"{label} {v:.3f}" for label, v in list(per.items())[:4])
        print(f"{node.name[-14:]:14s} {node.op:10s} {str([g.N, g.C, g.H, g.W]):>16s} {str(list(w)):>18s} "
              f"{g.strides_2d[0]:3d} {str(path)[:10]:10s} {t:7.3f} {flops(node) / t * 1e-9:8.1f}  {parts}")
    print("sums: " + ", ".join(f"{op} {t:.2f} ms" for op, t in sums.items()))
    print("every op: " + ", ".join(f"{op} {t:.2f}" for op, t in sorted(kinds.items(), key=lambda kv: -kv[1])))


if __name__ == "__main__":
    main()
