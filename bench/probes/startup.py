"""Probe: where a cold start of resnet50 (batch 1) spends its compile time, and whether pyopencl lets other Python
threads run while an OpenCL context is being created.

    python3 bench/probes/startup.py --programs     a one-line program, then each program of the plan, one at a
                                                    time, from source with empty caches, in build order
    python3 bench/probes/startup.py --trace         a cold start with DLNET_BUILD_TRACE: when each compiling process
                                                    started, had its context, built each program
    python3 bench/probes/startup.py --gil           Python loop rate while a context is created in another thread,
                                                    against the rate with nothing else running
    python3 bench/probes/startup.py --warm N        a cold start, then N warm ones, each with the main thread's
                                                    timeline (when parsing, planning, the context, the builds, the
                                                    first run ended)
"""
import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

PROGRAMS = """
import time, sys, io, hashlib
import onnx, torch, torchvision
import dlnet
from dlnet.kernels import runtime
torch.manual_seed(0)
m = torchvision.models.resnet50(weights=None).eval()
buf = io.BytesIO()
torch.onnx.export(m, (torch.randn(1, 3, 224, 224),), buf, opset_version=13, dynamo=False, input_names=['x'],
                  output_names=['y'])
proto = onnx.load_from_string(buf.getvalue())
ctx = dlnet.Context('gpu')
t = time.perf_counter()
ctx.program('__kernel void warm(__global float* x) { x[get_global_id(0)] += 1.0f; }')
print(f'a one-line program first: {time.perf_counter() - t:.3f} s')
times = []
build = runtime.Context._build
def timed(self, source, opts, binary=None):
    t = time.perf_counter()
    prg = build(self, source, opts, binary)
    times.append((time.perf_counter() - t, len(source), hashlib.sha1(source.encode()).hexdigest()[:8],
                  ' '.join(o for o in opts if not o.startswith('-cl-fp32'))[:90]))
    return prg
runtime.Context._build = timed
t = time.perf_counter()
net = dlnet.Net(ctx).load_onnx(proto, batch=1)
total = time.perf_counter() - t
print(f'{len(times)} programs, {sum(x[0] for x in times):.2f} s of builds one at a time, plan + build {total:.2f} s')
for s, n, h, o in times:  # in build order
    print(f'{s:6.3f} s  {n:6d} chars  {h}  {o}')
"""


def gil():
    import pyopencl as cl
    device = [d for p in cl.get_platforms() for d in p.get_devices()][0]

    def spin(seconds):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            n += 1
        return n / seconds

    alone = spin(0.2)
    made = {}
    t0 = time.perf_counter()
    th = threading.Thread(target=lambda: made.update(ctx=cl.Context([device]), t=time.perf_counter()))
    th.start()
    n, t1 = 0, time.perf_counter()
    while th.is_alive():
        n += 1
        time.perf_counter()
    rate = n / max(time.perf_counter() - t1, 1e-9)
    print(f"context created in a thread in {made['t'] - t0:.3f} s; Python loop rate meanwhile {rate / alone:.2f} of "
          f"its rate alone ({device.name})")


COLD = """
import time, dlnet, numpy as np
t = time.perf_counter()
net = dlnet.Net(dlnet.Context('gpu')).load_onnx({path!r}, batch=1)
net.run({{'x': np.ones((1, 3, 224, 224), np.float32)}})
print(f'cold start: {{time.perf_counter() - t:.2f}} s (Context, load, plan, build, first run)')
"""


def trace_cold(env_extra):
    import onnx
    import torch
    import torchvision
    from gpu import export
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "resnet50.onnx")
        onnx.save(export(torchvision.models.resnet50(weights=None).eval(), 1), path)
        log = os.path.join(d, "trace")
        env = dict(os.environ, DLNET_CACHE=os.path.join(d, "cache"), CUDA_CACHE_PATH=os.path.join(d, "nv"),
                   DLNET_BUILD_TRACE=log, **env_extra)
        t0 = time.time()
        out = subprocess.run([sys.executable, "-c", COLD.format(path=path)], env=env, capture_output=True, text=True)
        print(out.stdout.strip(), out.stderr[-2000:] if out.returncode else "")
        events = [line.split(None, 2) for line in open(log).read().splitlines()]
        pids = list(dict.fromkeys(e[1] for e in events))
        for pid in pids:
            mine = [(float(t) - t0, what) for t, p, what in events if p == pid]
            print(f"  {pid:>8}: " + ", ".join(f"{what} {t:.2f}" for t, what in mine))


WARM = """
import time, torch, torchvision, onnx, sys, threading  # (as gpu.bench_startup's child does)
T0 = time.perf_counter()
marks = []
def mark(what):
    marks.append((what, time.perf_counter() - T0))
if {switch}:
    sys.setswitchinterval({switch})
if {early}:
    import pyopencl
    from dlnet.kernels import runtime
    threading.Thread(target=runtime.wake_driver, daemon=True).start()
import dlnet, numpy as np
from dlnet import net as netmod
from dlnet.kernels import runtime, lowering
mark('import')
def wrap(owner, name, label, enter=False):
    f = getattr(owner, name)
    def g(*a, **k):
        if enter:
            mark(label + ' <')
        r = f(*a, **k)
        mark(label)
        return r
    setattr(owner, name, g)
wrap(netmod, 'read_model', 'onnx parsed')
wrap(netmod.Net, 'build_graph', 'graph + passes')
wrap(netmod, 'plan_memory', 'memory planned')
wrap(runtime.Context, '_wait_open', 'context ready', enter=True)
wrap(runtime.Context, 'build_all', 'programs built', enter=True)
wrap(lowering.Lowerer, 'finish', 'kernels bound')
wrap(runtime, 'wake_driver', 'thread: driver awake')
wrap(runtime, 'pick_device', 'thread: device found')
wrap(runtime, 'open_context', 'thread: context created')
ctx = dlnet.Context('gpu')
mark('Context()')
if {serial}:
    ctx.cl
    mark('context waited for')
net = dlnet.Net(ctx).load_onnx({path!r}, batch=1)
mark('load_onnx')
net.run({{'x': np.ones((1, 3, 224, 224), np.float32)}})
mark('first run')
seen = set()
print(', '.join(f'{{w}} {{t:.3f}}' for w, t in marks if not (w in seen or seen.add(w))))
"""


def trace_warm(n, serial=False, switch=0, early=False, cold=True):
    import onnx
    import torch
    import torchvision
    from gpu import export
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "resnet50.onnx")
        onnx.save(export(torchvision.models.resnet50(weights=None).eval(), 1), path)
        env = dict(os.environ, DLNET_CACHE=os.path.join(d, "cache"), CUDA_CACHE_PATH=os.path.join(d, "nv"))
        for i in range(n + 1):
            code = WARM.format(path=path, serial=serial and i > 0, switch=switch if i else 0, early=early and i > 0)
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
            if i or cold:
                print("cold" if i == 0 else "warm", out.stdout.strip(), out.stderr[-2000:] if out.returncode else "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--warm", type=int, default=0)
    ap.add_argument("--variants", action="store_true", help="with --warm: also the context waited for first, a "
                    "shorter switch interval, the driver woken before dlnet is imported")
    ap.add_argument("--trace", action="store_true")
    ap.add_argument("--programs", action="store_true")
    ap.add_argument("--gil", action="store_true")
    args = ap.parse_args()
    if args.gil:
        gil()
    if args.warm:
        trace_warm(args.warm)
        if args.variants:
            print("the same, the context waited for before the model is read:")
            trace_warm(args.warm, serial=True, cold=False)
            print("the same, Python's switch interval 0.5 ms (5 ms by default):")
            trace_warm(args.warm, switch=0.0005, cold=False)
            print("the same, the driver woken on a thread before dlnet is imported:")
            trace_warm(args.warm, early=True, cold=False)
            print("both:")
            trace_warm(args.warm, switch=0.0005, early=True, cold=False)
    if args.trace:
        trace_cold({})
    if args.programs:
        with tempfile.TemporaryDirectory() as d:
            env = dict(os.environ, DLNET_CACHE=os.path.join(d, "cache"), CUDA_CACHE_PATH=os.path.join(d, "nv"),
                       DLNET_BUILD_PROCS="1", DLNET_BUILD_THREADS="1")
            out = subprocess.run([sys.executable, "-c", PROGRAMS], env=env, capture_output=True, text=True)
            print(out.stdout, out.stderr[-3000:] if out.returncode else "")


if __name__ == "__main__":
    main()
