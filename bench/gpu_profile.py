"""Where the time goes: per-op-kind GPU time of one inference and one training step, from OpenCL profiling events.

    python3 bench/gpu_profile.py [--net resnet50] [--batch 16] [--precision tf32] [--no-train] [--top 20]
                                 [--nodes ConvGradW] [--set winograd_whole_bytes=0 ...]

Prints two tables (inference, training step): kernel time grouped by the kind of node each launch belongs to, with
launch counts and % of the total. --net may also be gpt2 (bench/gpu_train.py's decoder, trained on the next token)
or another of bench/gpu.py's transformers over tokens (bert: inference only). Runs on the GPU machine (torchvision
there); asserts nothing.
"""
import argparse
import ast
import os
import sys

import numpy as np

import dlnet

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu  # noqa: E402
from gpu_train import TOKEN_NETS, export, torch_model  # noqa: E402


def table(title, launches, queue, iters=5, top=0, nodes=""):
    totals, counts, each = {}, {}, {}
    for _ in range(iters):
        events = [(launch, launch.enqueue(queue)) for launch in launches]
        queue.finish()
        for launch, ev in events:
            kind = (launch.layer or launch.label).split(" ")[-1] if launch.layer else launch.label.split(" ")[0]
            if launch.label.endswith(("im2col", "col2im", "reduce")):
                kind += "/" + launch.label.split(" ")[-1]
            elif "splitK" in launch.label:
                kind += "/splitK"
            totals[kind] = totals.get(kind, 0.0) + (ev.profile.end - ev.profile.start) * 1e-6 / iters
            counts[kind] = counts.get(kind, 0) + 1
            each[id(launch)] = each.get(id(launch), 0.0) + (ev.profile.end - ev.profile.start) * 1e-6 / iters
    total = sum(totals.values())
    print(f"\n{title}: {total:.2f} ms of kernel time in {len(launches)} launches")
    print(f"{'kind':28s} {'ms':>8} {'%':>6} {'launches':>8}")
    for kind, ms in sorted(totals.items(), key=lambda kv: -kv[1])[:16]:
        print(f"{kind:28s} {ms:8.2f} {100 * ms / total:6.1f} {counts[kind] // iters:8d}")
    if nodes:  # per node: the launches whose label holds this text, grouped by their node's name
        per = {}
        for launch in launches:
            if nodes in launch.label:
                name = launch.label.split(" ")[0]
                per[name] = per.get(name, 0.0) + each.get(id(launch), 0.0)
        print(f"per node, launches labelled '{nodes}':")
        for name, ms in per.items():
            print(f"  {ms:7.3f} ms  {name}")
    if top:
        print(f"slowest {top} launches:")
        by_id = {id(launch): launch for launch in launches}
        for key, ms in sorted(each.items(), key=lambda kv: -kv[1])[:top]:
            launch = by_id[key]
            print(f"  {ms:7.3f} ms  {launch.label}  global {launch.gsize} local {launch.lsize}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--net", default="resnet50")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--no-train", action="store_true", help="inference only")
    ap.add_argument("--top", type=int, default=0, help="also list the N slowest launches")
    ap.add_argument("--nodes", default="", help="also list kernel time per node of the launches labelled so")
    ap.add_argument("--set", nargs="*", default=[], help="dlnet.Options fields, name=value (Python literals)")
    ap.add_argument("--no-infer", action="store_true", help="training only")
    args = ap.parse_args()
    ctx = dlnet.Context("gpu", precision=args.precision, profile=True)
    ctx = ctx.with_options(**{k: ast.literal_eval(v) for k, v in (kv.split("=", 1) for kv in args.set)})
    labels = 1000
    if args.net in TOKEN_NETS:  # bench/gpu_train.py's decoder: ids in, the next token's logits out (trains too)
        model, (labels, tokens) = torch_model(args.net), TOKEN_NETS[args.net]
        xs = np.random.default_rng(0).integers(0, labels, (args.batch, tokens)).astype(np.int64)
        proto = export(model, xs[:1])
    elif args.net in gpu.TOKEN_NETS:  # (ids in, next-token logits out: inference only)
        model, inputs = gpu.make_model(args.net)
        xs, args.no_train = inputs(args.batch), True
        proto = gpu.export(model, args.batch, inputs)
    else:
        model = torch_model(args.net)
        xs = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
        proto = export(model, xs)
    net = dlnet.Net(ctx).load_onnx(proto)
    if not args.no_infer:
        net.run({net.inputs[0].name: xs})
        table(f"{args.net} inference, batch {args.batch}, {args.precision}", net.launches, ctx.queue, top=args.top,
              nodes=args.nodes)
    if args.no_train:
        return
    trainer = dlnet.Trainer(dlnet.Net(ctx).load_onnx(proto), loss="cross_entropy",
                            optimizer=dlnet.optim.Adam(lr=1e-4))
    y = np.random.default_rng(0).integers(0, labels, args.batch)
    trainer.step({net.inputs[0].name: xs, "target": y})
    plan = trainer._active
    table(f"{args.net} training step (Adam), batch {args.batch}", plan.plan.launches + plan.launches, ctx.queue,
          top=args.top, nodes=args.nodes)


if __name__ == "__main__":
    main()
