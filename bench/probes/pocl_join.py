"""Probe: does PoCL's second worker thread work on back-to-back kernels, and is the second core free for it?

    python bench/probes/pocl_join.py [--rounds 6]

Per case (work-groups x iterations of a busy loop: 256 x 8000 is about 2.2 ms of work on one core, 16 x 20000
about 0.35 ms, 64 x 2000 about 0.15 ms), 0.5 s of kernels enqueued back to back or each after the host waited:
the median kernel time (profiling events), this process's CPU seconds per wall second (2.0: both workers busy)
and the machine's idle cores over the same wall time (/proc/stat: what other processes left free). A kernel at
one core's time while a core sat idle is PoCL's worker not joining; one at one core's time with no idle core is
another process holding it. Linux only; asserts nothing.
"""
import argparse
import os
import statistics
import time

import numpy as np
import pyopencl as cl

SRC = """__kernel void k(__global float* a, int n) {
    const int i = get_global_id(0);
    float s = a[i];
    for (int j = 0; j < n; j++) s = s * 0.999f + 1.0f;
    a[i] = s;
}"""


def idle_seconds():
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    return (int(fields[3]) + int(fields[4])) / os.sysconf("SC_CLK_TCK")  # idle + iowait, all cores


def run(q, kernel, groups, wait_each):
    t0, c0, i0 = time.perf_counter(), sum(os.times()[:2]), idle_seconds()
    events = []
    while time.perf_counter() - t0 < 0.5:
        events.append(cl.enqueue_nd_range_kernel(q, kernel, (groups,), (1,)))
        if wait_each:
            q.finish()
        elif len(events) % 8 == 0:
            q.finish()
    q.finish()
    wall = time.perf_counter() - t0
    ms = statistics.median((e.profile.end - e.profile.start) * 1e-6 for e in events)
    return ms, (sum(os.times()[:2]) - c0) / wall, (idle_seconds() - i0) / wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    ctx = cl.create_some_context(False)
    q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    kernel = cl.Program(ctx, SRC).build().k
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * 4096)
    print(f"device {ctx.devices[0].name}, {ctx.devices[0].max_compute_units} compute units")
    print(f"{'case':>12} {'one core ms':>11} {'round':>5} {'mode':>12} {'kernel ms':>10} {'our cores':>10} "
          f"{'idle cores':>11}")
    for groups, loop in ((256, 8000), (16, 20000), (64, 2000)):
        kernel.set_args(buf, np.int32(loop))
        one = run(q, kernel, 1, True)[0] * groups
        for r in range(args.rounds):
            for mode in ("back-to-back", "host waits"):
                ms, busy, idle = run(q, kernel, groups, mode == "host waits")
                print(f"{f'{groups} x {loop}':>12} {one:11.3f} {r:5d} {mode:>12} {ms:10.3f} {busy:10.2f} {idle:11.2f}",
                      flush=True)


if __name__ == "__main__":
    main()
