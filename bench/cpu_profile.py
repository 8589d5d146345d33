"""Where the time goes on the CPU device: per-op-kind kernel time of one inference, from OpenCL profiling events.

    python bench/cpu_profile.py [--model resnet50|bert|gpt2|vit] [--batch 1] [--iters 5] [--layers 12] [--threads N]

Models are the onnx package's reference CNNs with random weights and the transformers (--layers of their 12), as in
bench/cpu.py. Prints one table; asserts nothing.
"""
import argparse
import tempfile

import dlnet


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--by", choices=["kind", "launch"], default="kind")
    ap.add_argument("--layers", type=int, default=12, help="transformers: blocks of their 12")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    ctx = dlnet.Context("cpu", profile=True, threads=args.threads)
    from cpu import TRANSFORMERS, cnn, transformer
    with tempfile.TemporaryDirectory(prefix="dlnet-profile-") as folder:
        if args.model in TRANSFORMERS:
            model, feeds = transformer(args.model, args.layers, folder)
        else:
            model, feeds = cnn(args.model, args.batch)
        net = dlnet.Net(ctx).load_onnx(model, batch=None if args.model in TRANSFORMERS else args.batch)
    net.run(feeds)
    totals, counts = {}, {}
    for _ in range(args.iters):
        events = [(launch, launch.enqueue(ctx.queue)) for launch in net.launches]
        ctx.queue.finish()
        for index, (launch, ev) in enumerate(events):
            if args.by == "launch":
                key = f"{index:3d} {launch.label}"
            else:
                key = "/".join(launch.label.split(" ")[1:]) or launch.label  # "n19 Conv im2col" -> "Conv/im2col"
            totals[key] = totals.get(key, 0.0) + (ev.profile.end - ev.profile.start) * 1e-6 / args.iters
            counts[key] = counts.get(key, 0) + 1
    total = sum(totals.values())
    print(f"{args.model} batch {args.batch}: {total:.2f} ms of kernel time in {len(net.launches)} launches")
    print(f"{'kind':40s} {'ms':>8} {'%':>6} {'launches':>8}")
    for key, ms in sorted(totals.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"{key:40s} {ms:8.2f} {100 * ms / total:6.1f} {counts[key] // args.iters:8d}")


if __name__ == "__main__":
    main()
