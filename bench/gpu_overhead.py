"""Where dlnet's end-to-end time goes beyond its kernels (enqueueing, flushes, the output's download), and PyTorch's
kernel times.

    python3 bench/gpu_overhead.py [--cases alexnet:16,resnet50:16,vgg16:1,alexnet:1] [--precision fp32]

Per case (a torchvision net or one of bench/gpu.py's transformers, gpt2 / bert, at a batch): net.run from a pinned
array, the same without run()'s flushes (one flush at the end only), the host time of the enqueue loop, the launches
alone (enqueued and awaited, no copies), the kernels' sum and their span (profiling events), the outputs' download
alone (into a new array, as run() does), and PyTorch's run and kernel times (torch.profiler; fp16: `model.half()`)
with its 12 heaviest kernels. Runs on the GPU machine; asserts nothing.
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

import dlnet
from dlnet import plan as plan_module

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu import TOKEN_NETS, export, make_model, median_ms, set_tf32

CASES = "alexnet:16,resnet50:16,vgg16:1,alexnet:1"


def dlnet_times(ctx, pctx, proto, batch, x):
    net = dlnet.Net(ctx).load_onnx(proto, batch=batch)
    xp = net.input_array("x", x.shape)
    xp[...] = x
    plan = net._last
    t_run = median_ms(lambda: net.run({"x": xp}), 30)
    every = plan_module.FLUSH_EVERY
    plan_module.FLUSH_EVERY = 1 << 30  # only the flush after the uploads and after the first launch
    t_noflush = median_ms(lambda: net.run({"x": xp}), 30)
    plan_module.FLUSH_EVERY = every

    def enqueue_ms():
        t = time.perf_counter()
        for launch in plan.launches:
            launch.enqueue(ctx.queue)
        dt = time.perf_counter() - t
        ctx.queue.finish()
        return dt * 1e3
    t_enq = statistics.median(enqueue_ms() for _ in range(30))

    def launches_ms():
        t = time.perf_counter()
        for launch in plan.launches:
            launch.enqueue(ctx.queue)
        ctx.queue.finish()
        return (time.perf_counter() - t) * 1e3
    t_launch = statistics.median(launches_ms() for _ in range(30))

    def download_ms():
        t = time.perf_counter()
        for index in range(len(plan.graph.outputs)):
            plan.download(index)
        return (time.perf_counter() - t) * 1e3
    t_down = statistics.median(download_ms() for _ in range(30))
    pnet = dlnet.Net(pctx).load_onnx(proto, batch=batch)
    pnet.run({"x": x})
    sums, spans = [], []
    for _ in range(10):
        events = [launch.enqueue(pctx.queue) for launch in pnet.launches]
        pctx.queue.finish()
        sums.append(sum(e.profile.end - e.profile.start for e in events) * 1e-6)
        spans.append((events[-1].profile.end - events[0].profile.start) * 1e-6)
    n = len(plan.launches)
    net.release()
    pnet.release()
    return t_run, t_noflush, t_enq, t_launch, t_down, statistics.median(sums), statistics.median(spans), n


def torch_times(model, x):
    cm = model.cuda()
    xt = torch.from_numpy(x).pin_memory()
    with torch.no_grad():
        t_run = median_ms(lambda: (cm(xt.cuda(non_blocking=True)).cpu(), torch.cuda.synchronize()), 30)
        xg = xt.cuda()
        t_dev = median_ms(lambda: (cm(xg), torch.cuda.synchronize()), 30)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                cm(xg)
            torch.cuda.synchronize()
    rows = [(getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0), e.count, e.key)
            for e in prof.key_averages()]
    return t_run, t_dev, [r for r in rows if r[0] > 0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default=CASES)
    ap.add_argument("--precision", default="fp32", choices=("fp32", "tf32", "fp16"))
    args = ap.parse_args()
    ctx = dlnet.Context("gpu", precision=args.precision)
    pctx = dlnet.Context("gpu", precision=args.precision, profile=True)
    set_tf32(args.precision == "tf32")
    for case in args.cases.split(","):
        name, batch = case.split(":")
        batch = int(batch)
        torch.manual_seed(0)
        model, inputs = make_model(name)
        x = inputs(batch)
        t_run, t_noflush, t_enq, t_launch, t_down, ksum, span, n = dlnet_times(
            ctx, pctx, export(model, 1, inputs if name in TOKEN_NETS else None), batch, x)
        if args.precision == "fp16":
            model = model.half()
            x = x.astype(np.float16) if x.dtype == np.float32 else x
        t_torch, t_torch_dev, rows = torch_times(model, x)
        print(f"\n{name} b{batch} {args.precision}: dlnet run pinned {t_run:.3f} ms, fewer flushes {t_noflush:.3f}, "
              f"enqueue loop {t_enq:.3f} (host), launches alone {t_launch:.3f}, download alone {t_down:.3f}, kernel "
              f"sum {ksum:.3f}, first start to last end {span:.3f} ({n} launches) | torch pinned {t_torch:.3f}, input "
              f"already on the device {t_torch_dev:.3f}, kernel sum {sum(r[0] for r in rows) / 5e3:.3f}")
        for us, count, key in sorted(rows, key=lambda r: -r[0])[:12]:
            print(f"   torch {us / 5e3:7.3f} ms x{count // 5:3d} {key[:100]}")
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
