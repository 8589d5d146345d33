"""A torch.compile(backend="dlnet") training step against PyTorch CUDA eager, one run (GPU machine: torchvision).

    python3 bench/gpu_compile_train.py [--nets alexnet,resnet18,resnet50,vgg16,mobilenet_v2] [--batch 16] [--iters 5]

Each torchvision network (random weights, seed 0, Dropout off, training mode) lives on the GPU in PyTorch twice: one
copy runs eagerly, the other through torch.compile with dlnet's backend (dlnet.torch.backend: the forward and its
backward run on dlnet's OpenCL device; on NVIDIA, in memory shared with PyTorch's CUDA tensors: dlnet/cuda_share.py).
A step: zero_grad, cross-entropy of a fixed random batch, backward, torch.optim.Adam (lr 1e-4, on CUDA in both).
fp32, TF32 off. Median of --iters steps after 2 warm-up steps; the first step's losses compared. Prints a table.
"""
import argparse
import copy
import statistics
import time
import warnings

import numpy as np
import torch

import dlnet
import dlnet.torch as dt

NETS = ["alexnet", "resnet18", "resnet50", "vgg16", "mobilenet_v2"]


def make(name):
    import torchvision
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model.cuda().train()


def timed_steps(model, x, y, iters):
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    losses, times = [], []

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        return float(loss)

    for i in range(iters + 2):
        t = time.perf_counter()
        losses.append(step())
        if i >= 2:
            times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), losses[0]


def compiled_step(model, ctx, x, y, iters):
    """(median ms, first loss, dynamo graphs, dlnet partitions per graph, warnings of nodes left in eager)."""
    torch._dynamo.reset()
    parts = []

    def backend(gm, ex):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn = dt.backend(gm, ex, ctx=ctx)
        fused = fn.__self__
        parts.append((sum(n.startswith("fused_") for n, _ in fused.named_children()),
                      [str(w.message) for w in caught if "dlnet" in str(w.message)]))
        return fn
    compiled = torch.compile(model, backend=backend)
    t, loss = timed_steps(compiled, x, y, iters)
    return t, loss, parts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--also", default="", help="a second compiled column on a Context with these dlnet.Options "
                    "('name=value,...'), same run, same nets")
    args = ap.parse_args()
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    ctx = dlnet.Context("gpu")
    ctx2 = dlnet.Context("gpu", options=ctx.options.parse(args.also, "--also")) if args.also else None
    rows = []
    for name in args.nets.split(","):
        eager = make(name)
        rng = np.random.default_rng(0)
        x = torch.from_numpy(rng.standard_normal((args.batch, 3, 224, 224)).astype(np.float32)).cuda()
        y = torch.from_numpy(rng.integers(0, 1000, args.batch)).cuda()
        compiled_model = copy.deepcopy(eager)
        second_model = copy.deepcopy(eager) if ctx2 else None
        t_eager, loss_eager = timed_steps(eager, x, y, args.iters)
        t_dl, loss_dl, parts = compiled_step(compiled_model, ctx, x, y, args.iters)
        t2 = compiled_step(second_model, ctx2, x, y, args.iters)[0] if ctx2 else None
        rows.append((name, t_eager, t_dl, t_eager / t_dl, abs(loss_dl - loss_eager) / abs(loss_eager), t2))
        print(f"{name}: eager {t_eager:.2f} ms, compiled (dlnet) {t_dl:.2f} ms; dynamo graphs {len(parts)}, dlnet "
              f"partitions {[p for p, _ in parts]}, left in eager: {[w for _, w in parts if w]}", flush=True)
        del eager, compiled_model, second_model
        torch.cuda.empty_cache()
    print(f"\ntorch.compile(backend=dlnet) training step, batch {args.batch}, Adam, fp32; device {ctx.info}; "
          f"torch {torch.__version__}")
    also = f" | with {args.also}: ms | ratio" if ctx2 else ""
    print(f"| net | PyTorch eager ms | compiled on dlnet ms | ratio (eager / dlnet) | first loss rel diff{also} |")
    print("|---|---|---|---|---|" + ("---|---|" if ctx2 else ""))
    for name, te, td, r, d, t2 in rows:
        extra = f" | {t2:.2f} | {te / t2:.2f}" if t2 else ""
        print(f"| {name} | {te:.2f} | {td:.2f} | {r:.2f} | {d:.1e}{extra} |")


if __name__ == "__main__":
    main()
