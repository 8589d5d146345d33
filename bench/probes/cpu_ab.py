"""Probe: one CPU model under two settings of a boolean Options field, both plans in one process, timed interleaved (15 rounds
of 3 warm-up and 5 timed runs each); prints their outputs' relative difference, launch counts, best and median ms.
Asserts nothing.

    python bench/probes/cpu_ab.py [--model shufflenet] [--flag DW_CPU_PAD_IN]
"""
import argparse
import os
import statistics
import sys
import time

import numpy as np
import onnx

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import cpu

import dlnet


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="shufflenet")
    ap.add_argument("--flag", default="dw_cpu_pad_in", help="a boolean field of dlnet.Options")
    args = ap.parse_args()
    m = cpu.with_random_weights(onnx.load(os.path.join(cpu.LIGHT, f"light_{args.model}.onnx")),
                                np.random.default_rng(0))
    ctx = dlnet.Context()
    nets = {}
    for v in (False, True):
        nets[v] = dlnet.Net(ctx.with_options(**{args.flag: v})).load_onnx(m)
    inp = m.graph.input[0]
    x = np.random.default_rng(1).standard_normal([d.dim_value for d in inp.type.tensor_type.shape.dim]) \
        .astype(np.float32)
    outs = {v: next(iter(net.run({inp.name: x}).values())) for v, net in nets.items()}
    print(f"rel diff {np.linalg.norm(outs[True] - outs[False]) / np.linalg.norm(outs[False]):.1e}, launches "
          f"{len(nets[False].launches)} -> {len(nets[True].launches)}")
    times = {False: [], True: []}
    for _ in range(15):
        for v, net in nets.items():
            for _ in range(3):
                net.run({inp.name: x})
            t0 = time.perf_counter()
            for _ in range(5):
                net.run({inp.name: x})
            times[v].append((time.perf_counter() - t0) / 5 * 1e3)
    for v, t in times.items():
        print(f"{args.flag}={v}: best {min(t):.2f} ms, median {statistics.median(t):.2f} ms")


if __name__ == "__main__":
    main()
