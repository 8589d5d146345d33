"""One training step (forward, cross-entropy, backward, Adam) of dlnet (OpenCL) against PyTorch CUDA, one run.

    python bench/gpu_train.py [--nets alexnet,resnet18,resnet50,vgg16,mobilenet_v2] [--iters 10] [--batch 16]
                              [--precision fp32|tf32|fp16]

--nets also takes gpt2: bench/gpu.py's GPT-2-small-shaped decoder (plain torch, tied embedding) over 256 token ids,
trained on the next token's logits.

Protocol: torchvision definitions with their random initialisation (seed 0), exported to ONNX op-set 13 the way
tests/optim does (eval-mode export without constant folding, so BatchNormalization stays a node and dlnet trains it
on batch statistics). Dropout is set to p=0 on the torch side: the exported graph has no Dropout, so both sides
compute the same maths and the first-step losses are comparable. Both sides start from the same weights and see
the same batch (random images, random labels); a step includes copying the batch to the device and reading the loss
back. fp32, TF32 off (--precision tf32: TF32 on both sides; --precision fp16: dlnet's Context(precision="fp16"),
activations in half, float32 master weights and its dynamic loss scale, against PyTorch AMP, torch.autocast(
device_type="cuda", dtype=torch.float16) with torch.amp.GradScaler, both at GradScaler's defaults; the table adds
each side's skipped steps and final scale, and the values dlnet stores in half). Warm-up steps, then the median of
--iters steps. "loss rel diff" is |dlnet - torch| / |torch|
of the first step's loss (before any update). Prints tables; asserts nothing.
"""
import argparse
import io
import os
import statistics
import sys
import time
import traceback

import numpy as np

NETS = ["alexnet", "resnet18", "resnet50", "vgg16", "mobilenet_v2"]


def median_ms(step, iters, warmup):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        step()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


# decoders of bench/cpu_transformers.py (plain torch): name -> (vocabulary, tokens); the step's loss is the cross
# entropy of the next token's logits (bench/gpu.py's GPT-2-small-shaped decoder over 256 tokens)
TOKEN_NETS = {"gpt2": (50257, 256)}


def torch_model(name):
    import torch
    torch.manual_seed(0)
    if name in TOKEN_NETS:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import cpu_transformers
        return cpu_transformers.build(name)[0]
    import torchvision
    model = getattr(torchvision.models, name)(weights=None)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model


def export(model, x):
    """ONNX op-set 17 (SDPA needs 14): eval mode for tracing, no constant folding, batch dynamic."""
    import onnx
    import torch
    buf = io.BytesIO()
    model.eval()
    torch.onnx.export(model, (torch.from_numpy(x),), buf, opset_version=17, dynamo=False, do_constant_folding=False,
                      input_names=["input"], output_names=["output"],
                      dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}})
    model.train()
    return onnx.load_from_string(buf.getvalue())


def bench_torch(model, x, y, iters, warmup, lr, precision="fp32"):
    """(first loss, median ms, AMP note): with precision fp16, autocast to float16 and a GradScaler (PyTorch AMP)."""
    import torch
    model = model.cuda().train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)
    losses = []
    amp = precision == "fp16"
    scaler = torch.amp.GradScaler("cuda", enabled=amp)
    skipped = [0]

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cuda", dtype=torch.float16, enabled=amp):
            out = model(xs.cuda(non_blocking=False))
            loss = torch.nn.functional.cross_entropy(out, ys.cuda())
        scale = scaler.get_scale() if amp else 1.0
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())  # .item() synchronises: the step is done when it returns
        if amp and scaler.get_scale() < scale:
            skipped[0] += 1

    step()
    first = losses[0]
    ms = median_ms(step, iters, warmup)
    torch.cuda.synchronize()
    note = f"torch skipped {skipped[0]}, scale {scaler.get_scale():g}" if amp else ""
    return first, ms, note


def bench_dlnet(ctx, proto, x, y, iters, warmup, lr):
    import dlnet
    net = dlnet.Net(ctx).load_onnx(proto)
    trainer = dlnet.Trainer(net, loss="cross_entropy", optimizer=dlnet.optim.Adam(lr=lr))
    feeds = {"input": x, "target": y}
    t = time.perf_counter()
    first = trainer.step(feeds)  # builds and plans the training graph, then runs the first step
    build_s = time.perf_counter() - t
    ms = median_ms(lambda: trainer.step(feeds), iters, warmup)
    note = ""
    if trainer.scaler is not None:  # precision fp16: the loss scale, and what the training graph stores in half
        values = list(trainer._active.graph.values())
        half = sum(v.dtype == "float16" for v in values)
        note = f"dlnet skipped {trainer.scaler.skipped}, scale {trainer.scaler.scale:g}, {half}/{len(values)} half"
    net.close()  # the next net needs the memory: weights, activations, Adam moments (the trainer's too)
    return first, ms, build_s, note


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nets", default=",".join(NETS), help="comma-separated torchvision model names")
    ap.add_argument("--iters", type=int, default=10, help="timed steps per side (median reported)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps after the first")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--device", default="gpu", help="dlnet device: gpu, cpu or ocl:N")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "fp16"],
                    help="fp16: dlnet fp16 training against PyTorch AMP (autocast + GradScaler)")
    args = ap.parse_args(argv)

    import torch

    import dlnet
    if not torch.cuda.is_available():
        sys.exit("bench/gpu_train.py: PyTorch sees no CUDA device")
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = args.precision == "tf32"
    torch.backends.cudnn.benchmark = True
    ctx = dlnet.Context(args.device, precision=args.precision)
    print(f"dlnet device: {ctx.info.name if hasattr(ctx, 'info') else args.device}; "
          f"torch {torch.__version__} on {torch.cuda.get_device_name()}; batch {args.batch}, Adam lr {args.lr}, "
          f"precision {args.precision}{' (torch: autocast + GradScaler)' if args.precision == 'fp16' else ''}, "
          f"median of {args.iters} steps", flush=True)
    rng = np.random.default_rng(0)
    images = rng.standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
    labels = rng.integers(0, 1000, args.batch).astype(np.int64)

    rows = []
    for name in [n.strip() for n in args.nets.split(",") if n.strip()]:
        x, y = images, labels
        if name in TOKEN_NETS:  # token ids in, the next token's id as the label
            vocab, tokens = TOKEN_NETS[name]
            x = rng.integers(0, vocab, (args.batch, tokens)).astype(np.int64)
            y = rng.integers(0, vocab, args.batch).astype(np.int64)
        try:
            model = torch_model(name)
            proto = export(model, x[:1])
            t_loss, t_ms, t_note = bench_torch(model, x, y, args.iters, args.warmup, args.lr, args.precision)
            del model
            torch.cuda.empty_cache()
            d_loss, d_ms, build_s, d_note = bench_dlnet(ctx, proto, x, y, args.iters, args.warmup, args.lr)
            rel = abs(d_loss - t_loss) / max(abs(t_loss), 1e-30)
            rows.append((name, t_ms, d_ms, t_ms / d_ms, rel, build_s, t_loss, d_loss,
                         "; ".join(n for n in (t_note, d_note) if n)))
        except Exception as e:  # noqa: BLE001  (one net failing still prints the others)
            traceback.print_exc()
            rows.append((name, float("nan"), float("nan"), float("nan"), float("nan"), float("nan"),
                         float("nan"), float("nan"), f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"))
        r = rows[-1]
        print(f"{r[0]}: torch {r[1]:.2f} ms, dlnet {r[2]:.2f} ms, ratio {r[3]:.3f}, loss rel diff {r[4]:.2e} "
              f"(torch {r[6]:.6f}, dlnet {r[7]:.6f}), dlnet build {r[5]:.1f} s {r[8]}", flush=True)

    print()
    print(f"training step, batch {args.batch}, Adam, {args.precision} (ratio = torch ms / dlnet ms; > 1 means dlnet "
          "is faster)")
    print(f"{'net':<14} {'torch ms':>10} {'dlnet ms':>10} {'ratio':>8} {'loss rel diff':>14} {'build s':>8}  note")
    for name, t_ms, d_ms, ratio, rel, build_s, _, _, note in rows:
        print(f"{name:<14} {t_ms:>10.2f} {d_ms:>10.2f} {ratio:>8.3f} {rel:>14.2e} {build_s:>8.1f}  {note}")


if __name__ == "__main__":
    main()
