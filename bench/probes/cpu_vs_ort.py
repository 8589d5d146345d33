"""Probe: where one CPU model's time goes in dlnet against onnxruntime, per op kind and per layer.

    python bench/probes/cpu_vs_ort.py [--model squeezenet|bert|gpt2|vit|...] [--iters 30] [--threads N] [--top 15]
                                      [--layers 12]

dlnet: each launch's median kernel time over --iters runs (OpenCL profiling events), and the median wall time of a
run without profiling. onnxruntime (ORT_ENABLE_ALL): each node's median `kernel_time` from SessionOptions'
enable_profiling, and its median wall time. Medians, not means: the machine is shared. Asserts nothing.
"""
import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import cpu  # noqa: E402

import dlnet  # noqa: E402


def wall_ms(fn, iters):
    for _ in range(10):
        fn()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def dlnet_layers(model, feeds, iters, threads):
    """({launch label: median ms}, wall ms, launches)."""
    net = dlnet.Net(dlnet.Context("cpu", threads=threads)).load_onnx(model, batch=1)
    wall = wall_ms(lambda: net.run(feeds), iters)
    pctx = dlnet.Context("cpu", profile=True, threads=threads)
    pnet = dlnet.Net(pctx).load_onnx(model, batch=1)
    pnet.run(feeds)
    times = collections.defaultdict(list)
    for _ in range(iters):
        events = [(f"{i:3d} {launch.label}", launch.enqueue(pctx.queue)) for i, launch in enumerate(pnet.launches)]
        pctx.queue.finish()
        for key, ev in events:
            times[key].append((ev.profile.end - ev.profile.start) * 1e-6)
    return {k: statistics.median(v) for k, v in times.items()}, wall, len(pnet.launches)


def ort_layers(model, feeds, iters, threads):
    """({node name (op): median ms}, wall ms)."""
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    wall = wall_ms(lambda: sess.run(None, feeds), iters)
    with tempfile.TemporaryDirectory(prefix="dlnet-ortprof-") as folder:
        opts.enable_profiling = True
        opts.profile_file_prefix = os.path.join(folder, "ort")
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        for _ in range(iters):
            sess.run(None, feeds)
        with open(sess.end_profiling()) as f:
            events = json.load(f)
    times, shapes = collections.defaultdict(list), {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            key = f"{e['name'][:-12]} ({e['args'].get('op_name')})"
            times[key].append(e["dur"] * 1e-3)
            shapes[key] = tuple(tuple(next(iter(t.values()))) for t in e["args"].get("input_type_shape", [])[:2])
    return {k: statistics.median(v[2:] or v) for k, v in times.items()}, wall, shapes


def conv_shapes(model, feeds):
    """({dlnet node name: (x shape, w shape)}, {(x shape, w shape): MFLOP of one such layer}) of model's Conv
    layers, from its graph before the passes."""
    net = dlnet.Net(dlnet.Context("cpu")).load_onnx(model, batch=1)
    graph = net.build_graph({k: v.shape for k, v in feeds.items()}, passes=False)
    node_key, mflop = {}, {}
    for node in graph.nodes:
        if node.op == "Conv":
            x, w, y = (tuple(t.shape) for t in (node.inputs[0], node.inputs[1], node.outputs[0]))
            node_key[node.name] = (x, w)
            mflop[(x, w)] = 2e-6 * np.prod(y) * np.prod(w[1:])
    return node_key, mflop


def by_shape(shapes, dl, ort, ort_shapes):
    """Conv layers matched by (x shape, w shape) (shapes: conv_shapes'): {key: [dlnet ms, ort ms, layers, MFLOP per
    layer]}, dlnet's launches summed per ONNX node (its label's node name), onnxruntime's nodes by their input
    shapes."""
    node_key, mflop = shapes
    rows = {key: [0.0, 0.0, 0, mf] for key, mf in mflop.items()}
    for key in node_key.values():
        rows[key][2] += 1
    for label, ms in dl.items():
        key = node_key.get(label.split()[1])
        if key:
            rows[key][0] += ms
    for label, ms in ort.items():
        if ort_shapes.get(label, ()) in rows:
            rows[ort_shapes[label]][1] += ms
    return rows


def kind(label):
    """The op kind of a dlnet launch label ("  3 n0 Conv pad" -> "Conv pad") or an ort key ("r1 (FusedConv)")."""
    if label.endswith(")"):
        op = label.rsplit("(", 1)[1][:-1]
        return {"FusedConv": "Conv", "NchwcConv": "Conv"}.get(op, op)
    return " ".join(label.split()[2:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="squeezenet")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--layers", type=int, default=12, help="the transformers' layers (bench/cpu.py: 12)")
    ap.add_argument("--by-shape", action="store_true", help="Conv layers side by side, matched by x and w shapes")
    args = ap.parse_args()
    if args.model in cpu.TRANSFORMERS:
        import onnx
        with tempfile.TemporaryDirectory(prefix="dlnet-probe-") as folder:
            path, feeds = cpu.transformer(args.model, args.layers, folder)
            model = onnx.load(path)
    else:
        model, feeds = cpu.cnn(args.model, 1)
    dl, dl_wall, n = dlnet_layers(model, feeds, args.iters, args.threads)
    ort, ort_wall, ort_shapes = ort_layers(model, feeds, args.iters, args.threads)
    print(f"{args.model}: dlnet wall {dl_wall:.2f} ms, kernels {sum(dl.values()):.2f} ms in {n} launches; "
          f"onnxruntime wall {ort_wall:.2f} ms, nodes {sum(ort.values()):.2f} ms in {len(ort)} nodes")
    kinds = collections.defaultdict(lambda: [0.0, 0, 0.0, 0])
    for label, ms in dl.items():
        kinds[kind(label)][0] += ms
        kinds[kind(label)][1] += 1
    for label, ms in ort.items():
        kinds[kind(label)][2] += ms
        kinds[kind(label)][3] += 1
    print(f"{'kind':24s} {'dlnet ms':>9} {'n':>4} {'ort ms':>9} {'n':>4}")
    for k, (a, na, b, nb) in sorted(kinds.items(), key=lambda kv: -max(kv[1][0], kv[1][2])):
        print(f"{k:24s} {a:9.3f} {na:4d} {b:9.3f} {nb:4d}")
    if args.by_shape:
        rows = by_shape(conv_shapes(model, feeds), dl, ort, ort_shapes)
        print(f"\n{'x shape':18s} {'w shape':18s} {'n':>3} {'dlnet ms':>9} {'ort ms':>8} {'ratio':>6} {'dl GF/s':>8} "
              f"{'ort GF/s':>8}")
        for (x, w), (a, b, n, mf) in sorted(rows.items(), key=lambda kv: -kv[1][0]):
            print(f"{str(list(x)):18s} {str(list(w)):18s} {n:3d} {a:9.3f} {b:8.3f} {b / a if a else 0:6.2f} "
                  f"{n * mf / a if a else 0:8.1f} {n * mf / b if b else 0:8.1f}")
    for title, table in (("dlnet", dl), ("onnxruntime", ort)):
        print(f"\n{title}: top {args.top} layers")
        for label, ms in sorted(table.items(), key=lambda kv: -kv[1])[:args.top]:
            print(f"  {label:44s} {ms:8.3f}")


if __name__ == "__main__":
    main()
