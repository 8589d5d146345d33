"""Probe: where the driver's part of a warm start goes, in fresh processes: importing pyopencl, then dlnet, the
driver's wake-up (platform and device lookup), clCreateContext, the queue, a first tiny kernel (from source through
the driver's cache).

    python3 bench/probes/context_time.py [--runs 4] [--contend]

--contend: the driver's wake-up and the context on a thread (as dlnet.Context does) while the main thread sleeps, spins
in Python, or allocates and fills fresh numpy arrays (page faults), 0.4 s; how long the thread's two steps took.
"""
import argparse
import subprocess
import sys

CHILD = r"""
import time
t0 = time.perf_counter()
import pyopencl as cl
t1 = time.perf_counter()
import dlnet
from dlnet.kernels import runtime
t2 = time.perf_counter()
runtime.wake_driver()
t3 = time.perf_counter()
dev = runtime.pick_device('gpu')
t4 = time.perf_counter()
ctx = runtime.open_context(dev.device)
t5 = time.perf_counter()
q = cl.CommandQueue(ctx)
t6 = time.perf_counter()
prg = cl.Program(ctx, '__kernel void k(__global float* x) { x[get_global_id(0)] += 1.0f; }').build()
buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4096)
prg.k(q, (1024,), None, buf)
q.finish()
t7 = time.perf_counter()
print(' '.join(f'{v:7.3f}' for v in (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t7 - t6, t7 - t0)))
"""


CONTEND = r"""
import threading, time
import numpy as np
import pyopencl as cl
from dlnet.kernels import runtime
done = {{}}
def work():
    t = time.perf_counter()
    runtime.wake_driver()
    done['wake'] = time.perf_counter() - t
    dev = runtime.pick_device('gpu')
    t = time.perf_counter()
    runtime.open_context(dev.device)
    done['context'] = time.perf_counter() - t
th = threading.Thread(target=work)
th.start()
t0 = time.perf_counter()
while time.perf_counter() - t0 < 0.4:
    if '{mode}' == 'python':
        sum(i * i for i in range(1000))
    elif '{mode}' == 'faults':
        a = np.frombuffer(bytearray(16 << 20), np.float32); a[::1024] = 1.0  # 16 MiB, each 4 KiB page touched
    else:
        time.sleep(0.01)
th.join()
print(f"{{'{mode}':>7}} {{done['wake']:7.3f}} {{done['context']:7.3f}}")
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--contend", action="store_true")
    args = ap.parse_args()
    if args.contend:
        print(f"{'main':>7} {'wake':>7} {'context':>7}  (s, the thread's steps while the main thread works)")
        for _ in range(args.runs):
            for mode in ("sleep", "python", "faults"):
                out = subprocess.run([sys.executable, "-c", CONTEND.format(mode=mode)], capture_output=True, text=True)
                print(out.stdout.strip() or out.stderr[-500:])
        return
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,persistence_mode,pstate,clocks.sm", "--format=csv"],
                         capture_output=True, text=True)
    print(smi.stdout.strip() or smi.stderr.strip())
    print(f"{'pyopencl':>7} {'dlnet':>7} {'wake':>7} {'device':>7} {'context':>7} {'queue':>7} {'kernel':>7} "
          f"{'total':>7}  (s, fresh processes)")
    for _ in range(args.runs):
        out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True)
        print(out.stdout.strip() or out.stderr[-500:])


if __name__ == "__main__":
    main()
