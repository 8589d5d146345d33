"""Probe: one CPU model under two settings of an Options field, both plans in one process, timed interleaved (15 rounds
of 3 warm-up and 5 timed runs each); prints their outputs' relative difference, launch counts, best and median ms;
with --kernels also the summed kernel time of one run (OpenCL profiling events, a second pair of plans in a profiling
context, interleaved the same way); with --by-shape (CNNs) also each Conv shape's median kernel ms in both settings
(cpu_vs_ort.by_shape; separate processes or contexts per setting gave one setting 18% against itself). Asserts
nothing.

    python bench/probes/cpu_ab.py [--model shufflenet|...|bert|gpt2|vit] [--flag DW_CPU_PAD_IN] [--values False,True]
                                  [--layers 12]
"""
import argparse
import ast
import collections
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cpu
import cpu_vs_ort

import dlnet


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="shufflenet")
    ap.add_argument("--flag", default="dw_cpu_pad_in", help="a field of dlnet.Options")
    ap.add_argument("--values", default="False,True", help="its two settings, A then B (Python literals)")
    ap.add_argument("--kernels", action="store_true", help="also the summed kernel ms per run")
    ap.add_argument("--layers", type=int, default=12, help="transformers (bert, gpt2, vit): blocks of their 12")
    ap.add_argument("--by-shape", action="store_true", help="also per Conv shape (CNNs), with --kernels")
    args = ap.parse_args()
    args.flag = args.flag.lower()
    a, b = (ast.literal_eval(v) for v in args.values.split(","))
    folder = tempfile.mkdtemp(prefix="dlnet-ab-")
    if args.model in cpu.TRANSFORMERS:  # (bench/cpu.py's, --layers of their 12 blocks)
        m, feeds = cpu.transformer(args.model, args.layers, folder)
        batch = None
    else:
        m, feeds = cpu.cnn(args.model, 1)  # (the old models list their weights as inputs too)
        batch = 1
    ctx = dlnet.Context("cpu")
    nets = {}
    for v in (a, b):
        nets[v] = dlnet.Net(ctx.with_options(**{args.flag: v})).load_onnx(m, batch=batch)
    outs = {v: next(iter(net.run(feeds).values())) for v, net in nets.items()}
    print(f"rel diff {np.linalg.norm(outs[b] - outs[a]) / np.linalg.norm(outs[a]):.1e}, launches "
          f"{len(nets[a].launches)} -> {len(nets[b].launches)}")
    times = {a: [], b: []}
    for _ in range(15):
        for v, net in nets.items():
            for _ in range(3):
                net.run(feeds)
            t0 = time.perf_counter()
            for _ in range(5):
                net.run(feeds)
            times[v].append((time.perf_counter() - t0) / 5 * 1e3)
    for v, t in times.items():
        print(f"{args.flag}={v}: best {min(t):.2f} ms, median {statistics.median(t):.2f} ms")
    if args.kernels:
        pctx = dlnet.Context("cpu", profile=True)
        pnets = {v: dlnet.Net(pctx.with_options(**{args.flag: v})).load_onnx(m, batch=batch) for v in (a, b)}
        for net in pnets.values():
            net.run(feeds)
        ktimes = {a: [], b: []}
        layers = {a: collections.defaultdict(list), b: collections.defaultdict(list)}
        for _ in range(15):
            for v, net in pnets.items():
                runs = []
                for _ in range(4):
                    events = [(f"{i:3d} {launch.label}", launch.enqueue(pctx.queue))
                              for i, launch in enumerate(net.launches)]
                    pctx.queue.finish()
                    runs.append(sum((e.profile.end - e.profile.start) * 1e-6 for _, e in events))
                    for key, e in events:
                        layers[v][key].append((e.profile.end - e.profile.start) * 1e-6)
                ktimes[v].append(min(runs[1:]))
        for v, t in ktimes.items():
            print(f"{args.flag}={v}: kernel sum best {min(t):.3f} ms, median {statistics.median(t):.3f} ms")
        if args.by_shape and batch is not None:
            shapes = cpu_vs_ort.conv_shapes(m, feeds)  # (one graph for both settings)
            rows = {v: cpu_vs_ort.by_shape(shapes, {k: statistics.median(t) for k, t in layers[v].items()}, {}, {})
                    for v in (a, b)}
            print(f"\n{'x shape':20s} {'w shape':20s} {'n':>3} {'A ms':>8} {'B ms':>8} {'B/A':>5}")
            for key in sorted(rows[a], key=lambda k: -rows[a][k][0]):
                ta, tb = rows[a][key][0], rows[b].get(key, [0.0])[0]
                print(f"{str(list(key[0])):20s} {str(list(key[1])):20s} {rows[a][key][2]:3d} {ta:8.3f} {tb:8.3f} "
                      f"{tb / ta if ta else 0:5.2f}")


if __name__ == "__main__":
    main()
