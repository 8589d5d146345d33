"""Where dlnet's end-to-end time goes beyond its kernels (enqueueing, flushes), and PyTorch's kernel times.

    python3 bench/gpu_overhead.py

For alexnet and resnet50 at batch 16, vgg16 and alexnet at batch 1: net.run from a pinned array, the same without
run()'s flushes (one flush at the end only), the host time of the enqueue loop, the kernels' sum (profiling events),
and PyTorch's run and kernel times (torch.profiler) with its 12 heaviest kernels. Runs on the GPU machine; asserts
nothing.
"""
import os
import statistics
import sys
import time

import numpy as np
import torch
import torchvision
from torch.profiler import ProfilerActivity, profile

import dlnet
from dlnet import net as net_module

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu import export, median_ms

CASES = [("alexnet", 16), ("resnet50", 16), ("vgg16", 1), ("alexnet", 1)]


def dlnet_times(ctx, pctx, proto, batch, x):
    net = dlnet.Net(ctx).load_onnx(proto, batch=batch)
    xp = net.input_array("x", x.shape)
    xp[...] = x
    plan = net._last
    t_run = median_ms(lambda: net.run({"x": xp}), 30)
    every = net_module.FLUSH_EVERY
    net_module.FLUSH_EVERY = 1 << 30  # only the flush after the uploads and after the first launch
    t_noflush = median_ms(lambda: net.run({"x": xp}), 30)
    net_module.FLUSH_EVERY = every

    def enqueue_ms():
        t = time.perf_counter()
        for launch in plan.launches:
            launch.enqueue(ctx.queue)
        dt = time.perf_counter() - t
        ctx.queue.finish()
        return dt * 1e3
    t_enq = statistics.median(enqueue_ms() for _ in range(30))
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
    return t_run, t_noflush, t_enq, statistics.median(sums), statistics.median(spans), n


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
    ctx = dlnet.Context("gpu")
    pctx = dlnet.Context("gpu", profile=True)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    for name, batch in CASES:
        torch.manual_seed(0)
        model = getattr(torchvision.models, name)(weights=None).eval()
        x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)
        t_run, t_noflush, t_enq, ksum, span, n = dlnet_times(ctx, pctx, export(model, 1), batch, x)
        t_torch, t_torch_dev, rows = torch_times(model, x)
        print(f"\n{name} b{batch}: dlnet run pinned {t_run:.3f} ms, fewer flushes {t_noflush:.3f}, enqueue loop "
              f"{t_enq:.3f} (host), kernel sum {ksum:.3f}, first start to last end {span:.3f} ({n} launches) | "
              f"torch pinned {t_torch:.3f}, input already on the device {t_torch_dev:.3f}, kernel sum "
              f"{sum(r[0] for r in rows) / 5e3:.3f}")
        for us, count, key in sorted(rows, key=lambda r: -r[0])[:12]:
            print(f"   torch {us / 5e3:7.3f} ms x{count // 5:3d} {key[:100]}")
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
