"""Probe: a training step (forward, cross-entropy, backward, Adam) of bench/cpu_transformers.py's vit or gpt2, or of a
small CNN (three 3x3 convolutions of 32, 64 and 128 channels over 64 x 64 images, pooled, a Linear head) on the
CPU device under two settings of an Options field, both trainers in one process, steps interleaved; beside them
PyTorch's CPU step of the same module (its own threads, the same batch, Adam) as the peer. Prints each one's median
step ms and first loss. Asserts nothing.

    python bench/probes/cpu_train_ab.py [--model vit|gpt2|cnn] [--layers 2] [--batch 2] [--flag gemm_cpu_pack]
                                        [--values False,True] [--steps 5]

--values: Python literals, split at ";" where there is one (tuples: --values "();('cpu',)"), else at ",".
"""
import argparse
import ast
import io
import os
import statistics
import sys
import time

import numpy as np
import onnx
import torch

import dlnet

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import cpu_transformers  # noqa: E402


def small_cnn():
    torch.manual_seed(0)
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1, stride=2),
                         nn.ReLU(), nn.Conv2d(64, 128, 3, padding=1, stride=2), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(128, 10)), torch.randn(1, 3, 64, 64)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="vit")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--flag", default="gemm_cpu_pack")
    ap.add_argument("--values", default="False,True")
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    model, x = small_cnn() if args.model == "cnn" else cpu_transformers.build(args.model, args.layers)
    x = x.repeat(args.batch, *([1] * (x.dim() - 1)))
    with torch.no_grad():
        classes = model(x).shape[-1]
    f = io.BytesIO()
    torch.onnx.export(model, (x,), f, opset_version=17, dynamo=False, input_names=["input"])
    proto = onnx.load_from_string(f.getvalue())
    target = np.random.default_rng(0).integers(0, classes, args.batch)
    feeds = {"input": x.numpy(), "target": target}
    runs = {}
    for value in (ast.literal_eval(v) for v in args.values.split(";" if ";" in args.values else ",")):
        ctx = dlnet.Context("cpu").with_options(**{args.flag: value})
        tr = dlnet.Trainer(dlnet.Net(ctx).load_onnx(proto), loss="cross_entropy", optimizer=dlnet.optim.Adam(lr=1e-4))
        runs[f"dlnet {args.flag}={value}"] = (lambda tr=tr: tr.step(feeds), [], [])
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    tt = torch.from_numpy(target)

    def torch_step():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), tt)
        loss.backward()
        opt.step()
        return float(loss)
    runs[f"torch {torch.__version__} CPU ({torch.get_num_threads()} threads)"] = (torch_step, [], [])
    for step, _, losses in runs.values():
        losses.append(float(step()))
    for _ in range(args.steps):
        for step, times, _ in runs.values():
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
    print(f"{args.model}, {args.layers} layers, batch {args.batch}: median step ms over {args.steps} (first loss)")
    for name, (_, times, losses) in runs.items():
        print(f"  {name:40s} {1e3 * statistics.median(times):9.1f}  ({losses[0]:.5f})")


if __name__ == "__main__":
    main()
