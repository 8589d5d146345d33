"""Probe: the training step of one causal self-attention layer (d 768, 12 heads, batch 2, a Linear head) on the CPU
device, attention's gradient fused (AttentionGrad: rows in vector lanes, attention_grad_lanes.cl, and with
Options.attention_cpu_lanes off 8 rows a work-item, attention_grad.cl, the forward's attention then too) against its
decomposition, alternated in one process; prints each one's median step, its loss, its AttentionGrad kernels' ms and
the kernel time of its slowest kinds. Asserts nothing.

    python3 bench/probes/attention_grad_cpu.py [--tokens 64,128,256,512] [--reps 7]
"""
import argparse
import io
import time

import numpy as np
import onnx
import torch

import dlnet

D, HEADS = 768, 12


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(D, 3 * D), torch.nn.Linear(D, 16)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (z.reshape(b, t, HEADS, D // HEADS).transpose(1, 2) for z in self.qkv(x).split(D, -1))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(a.transpose(1, 2).reshape(b, t, D)).mean(1)


def kernel_ms(ctx, plan, iters=3):
    totals = {}
    for _ in range(iters):
        events = [(launch, launch.enqueue(ctx.queue)) for launch in plan.launches]
        ctx.queue.finish()
        for launch, ev in events:
            key = "/".join(launch.label.split(" ")[1:]) or launch.label
            totals[key] = totals.get(key, 0.0) + (ev.profile.end - ev.profile.start) * 1e-6 / iters
    return totals


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", default="64,128,256,512")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    torch.manual_seed(0)
    print(f"{'T':>4} {'gradient':>19} {'step ms':>8} {'loss':>10} {'dq, dk dv ms':>13}  slowest kernels (ms)")
    for t in (int(s) for s in args.tokens.split(",")):
        model, x = Layer(), torch.randn(2, t, D)
        f = io.BytesIO()
        torch.onnx.export(model, (x,), f, opset_version=17, dynamo=False, input_names=["input"])
        proto = onnx.load_from_string(f.getvalue())
        feeds = {"input": x.numpy(), "target": np.random.default_rng(t).integers(0, 16, 2)}
        runs = {}
        for name, kinds, lanes in (("decomposed", (), True), ("AttentionGrad rows", ("cpu",), False),
                                   ("AttentionGrad lanes", ("cpu",), True)):
            ctx = dlnet.Context("cpu", profile=True).with_options(fused_attention_grad=kinds,
                                                                 attention_cpu_lanes=lanes)
            tr = dlnet.Trainer(dlnet.Net(ctx).load_onnx(proto), loss="cross_entropy",
                               optimizer=dlnet.optim.SGD(lr=0.0))
            tr.step(feeds)
            runs[name] = (ctx, tr, [])
        for _ in range(args.reps):
            for ctx, tr, times in runs.values():
                start = time.perf_counter()
                loss = tr.step(feeds)
                times.append(time.perf_counter() - start)
        for name, (ctx, tr, times) in runs.items():
            kinds = kernel_ms(ctx, tr._active.plan)
            grad = [kinds.get(k, 0.0) for k in ("AttentionGrad/dq", "AttentionGrad/dk/dv")]
            top = sorted(kinds.items(), key=lambda kv: -kv[1])[:3]
            print(f"{t:4d} {name:>19} {1e3 * np.median(times):8.1f} {loss:10.6f} {grad[0]:6.1f} {grad[1]:6.1f}  " +
                  ", ".join(f"{k} {v:.1f}" for k, v in top))


if __name__ == "__main__":
    main()
