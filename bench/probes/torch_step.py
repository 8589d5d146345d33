"""Probe: where PyTorch's GPU time goes in one eager training step (forward, cross-entropy, backward; no optimizer)
of a torchvision net, to hold dlnet's training profile (bench/gpu_profile.py) against.

    python3 bench/probes/torch_step.py [--net resnet50] [--batch 16] [--top 12]

CUDA kernel time by torch.profiler, median of 5 profiled steps, grouped by what the kernel's name says (cuDNN's
dgrad / wgrad / forward convolutions, batch norm, elementwise, reductions, other). Runs on the GPU machine; asserts
nothing.
"""
import argparse
import statistics

import torch
import torchvision
from torch.profiler import ProfilerActivity, profile

GROUPS = [("conv dgrad", ("dgrad",)), ("conv wgrad", ("wgrad",)),
          ("conv fwd", ("conv", "implicit_gemm", "xmma_fprop", "fprop", "winograd", "sm90_xmma", "cutlass")),
          ("batch norm", ("batch_norm", "bn_", "batchnorm")), ("gemm", ("gemm", "sgemm")),
          ("reduce", ("reduce",)), ("elementwise", ("elementwise", "vectorized", "unrolled"))]


def group(name):
    low = name.lower()
    for g, keys in GROUPS:
        if any(k in low for k in keys):
            return g
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--net", default="resnet50")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    model = getattr(torchvision.models, args.net)(weights=None).cuda().train()
    x = torch.randn(args.batch, 3, 224, 224, device="cuda")
    y = torch.randint(0, 1000, (args.batch,), device="cuda")

    def step():
        model.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    totals, groups, names = [], {}, {}
    for _ in range(5):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        tot, per = 0.0, {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                us = e.device_time
                tot += us
                per[group(e.name)] = per.get(group(e.name), 0.0) + us
                names[e.name[:90]] = names.get(e.name[:90], 0.0) + us / 5
        totals.append(tot / 1e3)
        for g, us in per.items():
            groups.setdefault(g, []).append(us / 1e3)
    print(f"{args.net} b{args.batch} eager training step (no optimizer): {statistics.median(totals):.2f} ms of CUDA "
          f"kernel time; cudnn.benchmark on, TF32 off")
    for g, v in sorted(groups.items(), key=lambda kv: -statistics.median(kv[1])):
        print(f"  {g:14s} {statistics.median(v):7.2f} ms")
    for n, us in sorted(names.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  {us / 1e3:7.2f} ms  {n}")


if __name__ == "__main__":
    main()
