"""Where a torch.compile(backend="dlnet") training step spends its time, against the same plan's launches alone.

    python3 bench/probes/compile_step.py [--nets resnet50,mobilenet_v2] [--batch 16] [--iters 5]

GPU machine (torchvision, CUDA). For each net: the step's median (bench/gpu_compile_train.py's step), then the same
steps with dlnet.cuda_share's pieces timed (host time of each, the GPU work they wait for included in _hand_over),
then the VJP plan's launches run alone (run_launches + finish, no torch), and torch.optim.Adam alone. Prints a table.
"""
import argparse
import os
import statistics
import sys
import time
import warnings
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from gpu_compile_train import make, timed_steps  # noqa: E402

import dlnet  # noqa: E402
import dlnet.torch as dt  # noqa: E402
from dlnet import cuda_share  # noqa: E402

SPENT = defaultdict(float)
CALLS = defaultdict(int)


def timed(module, name):
    fn = getattr(module, name)

    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            SPENT[name] += time.perf_counter() - t
            CALLS[name] += 1
    setattr(module, name, wrapper)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nets", default="resnet50,mobilenet_v2")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    ctx = dlnet.Context("gpu")
    for name in ("vjp_forward", "vjp_backward", "copy_all", "_clones"):
        timed(cuda_share, name)

    def hand_over(share, plan, start, stop):  # cuda_share._hand_over, its three parts timed
        t0 = time.perf_counter()
        torch.cuda.current_stream().synchronize()
        t1 = time.perf_counter()
        plan.run_launches(start, stop)
        t2 = time.perf_counter()
        share.ctx.queue.finish()
        t3 = time.perf_counter()
        for k, a, b in (("torch sync", t0, t1), ("enqueue", t1, t2), ("finish", t2, t3)):
            SPENT[k] += b - a
        SPENT["_hand_over"] += t3 - t0
    cuda_share._hand_over = hand_over
    rows = []
    for net in args.nets.split(","):
        model = make(net)
        x = torch.randn(args.batch, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (args.batch,), device="cuda")
        torch._dynamo.reset()
        compiled = []

        def backend(gm, ex):
            fn = dt.backend(gm, ex, ctx=ctx)
            compiled.extend(c.compiled for n, c in fn.__self__.named_children() if n.startswith("fused_"))
            return fn
        cm = torch.compile(model, backend=backend)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t_step, _ = timed_steps(cm, x, y, args.iters)
            SPENT.clear()
            CALLS.clear()
            t_step2, _ = timed_steps(cm, x, y, args.iters)
        n = args.iters + 2
        plans = [p for c in compiled if c.runner for p in c.runner.plans.values()]
        vjp = plans[0]
        q = ctx.queue

        def alone(start, stop, reps=10):
            ts = []
            for _ in range(reps):
                q.finish()
                t = time.perf_counter()
                vjp.plan.run_launches(start, stop)
                q.finish()
                ts.append((time.perf_counter() - t) * 1e3)
            return statistics.median(ts)
        fwd, bwd = alone(0, vjp.split), alone(vjp.split, len(vjp.plan.launches))
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        ts = []
        for _ in range(7):
            torch.cuda.synchronize()
            t = time.perf_counter()
            opt.step()
            torch.cuda.synchronize()
            ts.append((time.perf_counter() - t) * 1e3)
        adam = statistics.median(ts)
        per = {k: SPENT[k] / n * 1e3 for k in SPENT}
        calls = {k: CALLS[k] / n for k in CALLS}
        print(f"{net}: step {t_step:.2f} / {t_step2:.2f} ms; launches {len(vjp.plan.launches)} (split {vjp.split}); "
              f"inputs {vjp.n_in}; per step ms {per}; calls {calls}; launches alone fwd {fwd:.2f} bwd {bwd:.2f}; "
              f"adam {adam:.2f}", flush=True)
        rows.append((net, t_step2, per.get("vjp_forward", 0), per.get("vjp_backward", 0), per.get("_hand_over", 0),
                     per.get("torch sync", 0), per.get("copy_all", 0), per.get("_clones", 0), fwd + bwd, adam))
        del model, cm
        torch.cuda.empty_cache()
    print("| net | step ms | vjp_forward | vjp_backward | of which _hand_over | its torch sync | copy_all | _clones | "
          "launches alone | Adam alone |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join([r[0]] + [f"{v:.2f}" for v in r[1:]]) + " |")


if __name__ == "__main__":
    main()
