"""Probe: where PyTorch's GPU time goes for one inference of a torchvision net or one of bench/gpu.py's
transformers (gpt2, bert) (torch.profiler, CUDA kernels), to hold dlnet's per-layer kernel times
(bench/gpu_profile.py) against.

    python3 bench/probes/torch_layers.py --net alexnet --batch 16 --precision tf32|fp32|fp16 [--top 25]

Prints the total CUDA kernel time of one inference (median of 5 profiled runs' sums), the slowest kernels in launch
order, and the time by kernel name (fp16: `model.half()`). Runs on the GPU machine; asserts nothing.
"""
import argparse
import os
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gpu import make_model  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--net", default="alexnet")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--precision", default="tf32")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    tf32 = args.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = False
    model, inputs = make_model(args.net)
    model = model.cuda()
    x = torch.from_numpy(inputs(args.batch)).cuda()
    if args.precision == "fp16":
        model = model.half()
        x = x.half() if x.is_floating_point() else x
    with torch.no_grad():
        for _ in range(5):
            model(x)
        torch.cuda.synchronize()
        sums, per = [], {}
        for _ in range(5):
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                with record_function("infer"):
                    model(x)
                torch.cuda.synchronize()
            evs = [e for e in prof.events() if e.device_type.name == "CUDA"]
            sums.append(sum(e.device_time for e in evs) * 1e-3)
            for i, e in enumerate(evs):
                per.setdefault((i, e.name[:70]), []).append(e.device_time * 1e-3)
    print(f"{args.net} batch {args.batch} {args.precision}: {statistics.median(sums):.3f} ms of CUDA kernel time, "
          f"{len(per)} kernels")
    rows = sorted(((statistics.median(v), k) for k, v in per.items()), reverse=True)[:args.top]
    for ms, (i, name) in sorted(rows, key=lambda r: r[1][0]):
        print(f"{i:4d} {ms:8.3f}  {name}")
    by_name = {}
    for (i, name), v in per.items():
        by_name.setdefault(name, [0.0, 0])
        by_name[name][0] += statistics.median(v)
        by_name[name][1] += 1
    print("by kernel name: ms, launches")
    for name, (ms, n) in sorted(by_name.items(), key=lambda r: -r[1][0])[:args.top]:
        print(f"{ms:8.3f} {n:5d}  {name}")


if __name__ == "__main__":
    main()
