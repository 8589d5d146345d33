"""dlnet on the CPU (PoCL) against onnxruntime on the same machine, in one process and one run.

    python bench/cpu.py [--models resnet50,bert,...] [--iters 5] [--rounds 5] [--batch 1] [--threads N] [--quick]

Models: the reference CNNs the onnx package ships (real architectures). They build each weight with ConstantOfShape
(one value repeated, which makes every channel alike and the error column trivially 0): those are replaced by
random initializers of the same shapes, the same model for both engines. Then three transformers built in plain
torch with random weights and exported by torch 2.13's default exporter (dynamo=True), at batch 1: "bert" (a
BERT-base-shaped post-norm encoder, 12 layers of d 768, 12 heads, FF 3072, exact GELU, over 128 tokens), "gpt2"
(the GPT-2-small-shaped pre-norm decoder, causal, tanh GELU, next-token logits over a 128-token prompt through the
tied 50257-word embedding) and "vit" (ViT-B/16 at 224x224: 197 tokens, 12 layers of d 768). --quick keeps 2 of the
12 layers (the same layer shapes). onnxruntime runs with ORT_ENABLE_ALL (its transformer fusions: Attention,
LayerNorm, Gelu) and --threads as intra_op_num_threads; dlnet with Context(threads=--threads).

Time of one inference includes the copies in and out; per engine, --rounds alternating blocks, each a 0.3 s pause
(each engine's threads go idle), 0.25 s of warm-up calls and --iters timed calls. Each engine's ms: the median of
all its calls; the ratio: the median over the rounds of onnxruntime's block median / dlnet's (the two blocks of a
round are a second apart; "pooled", the ratio of the two medians, is printed too). Prints a table.
"""
import argparse
import itertools
import os
import statistics
import tempfile
import time
import warnings

import numpy as np
import onnx
from onnx import numpy_helper

import dlnet

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
CNNS = ["squeezenet", "shufflenet", "resnet50", "inception_v1", "bvlc_alexnet", "densenet121"]
TRANSFORMERS = ["bert", "gpt2", "vit"]
MODELS = CNNS + TRANSFORMERS


def with_random_weights(model, rng):
    """The model with each ConstantOfShape of a constant shape replaced by a random initializer of that shape:
    weights uniform with the variance of 1 / fan-in, 1-D tensors (biases, BatchNorm's) in [0.5, 1.5)."""
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    nodes = []
    for node in model.graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in consts:
            shape = [int(d) for d in consts[node.input[0]]]
            if len(shape) > 1:
                bound = np.sqrt(3.0 / max(1, int(np.prod(shape[1:]))))
                a = rng.uniform(-bound, bound, shape)
            else:
                a = rng.uniform(0.5, 1.5, shape)
            model.graph.initializer.append(numpy_helper.from_array(a.astype(np.float32), node.output[0]))
        else:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def timed_ms(fn, iters, pause=0.3, warmup_s=0.25):
    """iters timed calls after a pause and warm_up_s of warm-up calls (at least two). The pause lets the other
    engine's threads go idle: onnxruntime's intra-op threads spin-wait after each run, and on 2 cores they took one
    from dlnet's next calls (squeezenet 7.0-7.5 ms alone, 8.6-10.1 ms right after onnxruntime's, 6.9-7.3 after a
    0.3 s pause). The warm-up outlasts what an idle spell costs: after 0.1-1 s idle, dlnet's next 4-6 runs of
    squeezenet took 9-13 ms, then 6-7 (PoCL's workers sleep between kernels; onnxruntime's first run was 5-8 ms, then
    4.2)."""
    time.sleep(pause)
    start = time.perf_counter()
    for i in itertools.count():
        fn()
        if i >= 1 and time.perf_counter() - start >= warmup_s:
            break
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return times


def paired_medians(fns, iters, rounds):
    """(each engine's median over `rounds` alternating blocks of `iters` calls, the median over the rounds of the
    first engine's block median / the second's). The machine's load changes over seconds (a shared 2-core VM:
    squeezenet 5.3 to 11 ms within a minute), so one block each would compare two different loads; and the medians
    pooled over all rounds compare two loads too where a slow spell takes one engine's block but not the other's
    (shufflenet's pooled ratio 0.43 and 1.28 in two runs of the same code, onnxruntime's median 2.72 and 5.63 ms), so
    the ratio is taken within each round, whose two blocks are a second apart."""
    times = [[] for _ in fns]
    ratios = []
    for _ in range(rounds):
        blocks = [timed_ms(fn, iters) for fn in fns]
        for t, block in zip(times, blocks):
            t += block
        ratios.append(statistics.median(blocks[0]) / statistics.median(blocks[-1]))
    return [statistics.median(t) for t in times], statistics.median(ratios)


def cnn(name, batch):
    """(model, feeds) of one of the onnx package's reference CNNs with random weights."""
    model = with_random_weights(onnx.load(os.path.join(LIGHT, f"light_{name}.onnx")), np.random.default_rng(1))
    inits = {i.name for i in model.graph.initializer}
    info = next(i for i in model.graph.input if i.name not in inits)  # (old models list their weights as inputs)
    shape = [batch] + [d.dim_value for d in info.type.tensor_type.shape.dim[1:]]
    return model, {info.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}


def transformer(name, layers, folder):
    """(path, feeds) of a transformer exported by torch's default exporter into `folder`."""
    import torch
    from cpu_transformers import build
    torch.manual_seed(0)
    model, x = build(name, layers)
    path = os.path.join(folder, f"{name}.onnx")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), (x,), path, dynamo=True, input_names=["x"], output_names=["y"])
    return path, {"x": x.numpy()}


def main():
    import onnxruntime as ort
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5, help="alternating blocks of --iters calls per engine")
    ap.add_argument("--batch", type=int, default=1, help="the CNNs' batch (transformers run batch 1)")
    ap.add_argument("--threads", type=int, default=0, help="both engines' threads (0: each one's default)")
    ap.add_argument("--quick", action="store_true", help="transformers with 2 of their 12 layers")
    args = ap.parse_args()
    ctx = dlnet.Context("cpu", threads=args.threads)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = args.threads
    opts.log_severity_level = 3  # (not a warning per unused initializer of the old models)
    print(f"device: {ctx.info}, {ctx.threads} threads; onnxruntime {ort.__version__} (CPUExecutionProvider, "
          f"ORT_ENABLE_ALL, intra_op_num_threads={args.threads or 'default'}){'; --quick' if args.quick else ''}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="dlnet-bench-") as folder:
        for name in args.models.split(","):
            if name in TRANSFORMERS:
                model, feeds = transformer(name, 2 if args.quick else 12, folder)
                net = dlnet.Net(ctx).load_onnx(model)
                sess = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
            else:
                model, feeds = cnn(name, args.batch)
                net = dlnet.Net(ctx).load_onnx(model, batch=args.batch)
                sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
            (t_ort, t_dl), ratio = paired_medians([lambda: sess.run(None, feeds), lambda: net.run(feeds)],
                                                  args.iters, args.rounds)
            ref = sess.run(None, feeds)[0]
            got = list(net.run(feeds).values())[0]
            err = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)
            rows.append((name, t_ort, t_dl, ratio, t_ort / t_dl, err))
            print(f"{name:14s} onnxruntime {t_ort:9.2f} ms  dlnet {t_dl:9.2f} ms  ratio {ratio:5.2f}  "
                  f"(pooled {t_ort / t_dl:5.2f})  err {err:.1e}", flush=True)
            net.release()
    print("\nratio: the median over the rounds of onnxruntime's block median / dlnet's (paired_medians); pooled: the "
          "ratio of the medians over all rounds")
    print(f"\n{'model':14s} {'ort ms':>9} {'dlnet ms':>9} {'ratio':>6} {'pooled':>6} {'rel err':>8}")
    for r in rows:
        print(f"{r[0]:14s} {r[1]:9.2f} {r[2]:9.2f} {r[3]:6.2f} {r[4]:6.2f} {r[5]:8.1e}")
    print(f"median ratio {statistics.median(r[3] for r in rows):.2f} "
          f"(pooled {statistics.median(r[4] for r in rows):.2f})")


if __name__ == "__main__":
    main()
