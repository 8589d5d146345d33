"""Probe: the cost of a launch on an OpenCL device (the first one pyopencl finds: PoCL on CI-like machines): an empty
kernel, and one or two work-groups of a busy loop, 200 launches each; prints the median kernel time (profiling
events), the median gap between launches and the wall time per launch. Two work-groups of equal work taking longer
than one shows a second worker joining late. Asserts nothing.

    python bench/probes/pocl_launch.py
"""
import itertools
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


def main():
    ctx = cl.create_some_context(False)
    q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    kernel = cl.Program(ctx, SRC).build().k
    buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE, 4 * 4096)
    for n, groups in [(0, 1), (0, 2), (2000, 1), (2000, 2), (20000, 1), (20000, 2)]:
        kernel.set_args(buf, np.int32(n))
        for _ in range(3):  # the last of three rounds is printed
            t0 = time.perf_counter()
            evs = [cl.enqueue_nd_range_kernel(q, kernel, (groups,), (1,)) for _ in range(200)]
            q.finish()
            wall = (time.perf_counter() - t0) / 200
        ts = [(e.profile.end - e.profile.start) * 1e-3 for e in evs]
        gaps = [(b.profile.start - a.profile.end) * 1e-3 for a, b in itertools.pairwise(evs)]
        print(f"loop {n:6d}, {groups} work-group(s): kernel {statistics.median(ts):7.1f} us, gap "
              f"{statistics.median(gaps):6.1f} us, wall per launch {wall * 1e6:7.1f} us")


if __name__ == "__main__":
    main()
