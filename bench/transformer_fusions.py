"""The transformer fusions (graph/passes/transformer.py: residual Add + LayerNorm as AddLayerNorm, Q/K/V projections
as one product read in place, a packed in-projection's split as views) on and off: launches per op kind and median
latency, in one process.

    python bench/transformer_fusions.py [--nets vit_b_16,swin_t,bert,gpt] [--batches 16,1] [--iters 20] [--device gpu]
    python bench/transformer_fusions.py --tiny     # the test builders' small models on the CPU device (no torchvision)

vit_b_16 and swin_t: torchvision definitions, random initialisation, exported at op-set 17 (bench/gpu_train.py's
export). bert and gpt: BERT-base- and GPT-2-small-shaped blocks (12 layers, d 768, 12 heads, 128 tokens) built from
tests/onnx/test_transformers.py's modules with separate q, k, v Linears (as Hugging Face's BERT writes them);
vit_encoder: ViT-B/16's encoder (nn.MultiheadAttention's packed in-projection) without torchvision. "off"
runs the inference passes without the three. Times include copies in and out. Asserts nothing.
"""
import argparse
import io
import os
import statistics
import sys
import time

import numpy as np
import onnx

import dlnet
import dlnet.graph.passes as passes

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
FUSIONS = (passes.fuse_residual_norm, passes.fuse_qkv, passes.split_packed_projections)


def torchvision_model(name, batch):
    import torch
    import torchvision
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpu_train import export
    torch.manual_seed(0)
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    return export(getattr(torchvision.models, name)(weights=None), x), {"input": x}


def builder_model(name, batch, tiny):
    """The tests' Encoder (bert: causal off; gpt: causal with an LM head) at BERT-base / GPT-2-small size."""
    import torch

    import tests.onnx.test_transformers as tt
    if not tiny:
        tt.D, tt.HEADS, tt.FF, tt.VOCAB, tt.MAX_POS = 768, 12, 3072, 30522, 512
    torch.manual_seed(0)
    module = tt.Encoder(causal=name == "gpt", lm_head=name == "gpt")
    layers = 2 if tiny else 12
    module.blocks = torch.nn.Sequential(*[tt.Block(tt.SelfAttention(name == "gpt")) for _ in range(layers)])
    ids = tt._tokens((batch, 16 if tiny else 128), 0)
    buf = io.BytesIO()
    torch.onnx.export(module.eval(), (torch.from_numpy(ids),), buf, opset_version=17, dynamo=False,
                      input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch"}})
    return onnx.load_from_string(buf.getvalue()), {"x": ids}


def mha_model(batch, tiny):
    """torchvision's ViT encoder without torchvision: pre-LN blocks of nn.MultiheadAttention (batch_first, one packed
    in-projection) and an MLP, a final LayerNorm; 197 tokens of d 768 in 12 layers (tiny: 17 of 32 in 2)."""
    import torch
    nn = torch.nn
    d, layers, tokens = (32, 2, 17) if tiny else (768, 12, 197)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.self_attention = nn.MultiheadAttention(d, max(d // 64, 4), batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            y = self.ln_1(x)
            x = x + self.self_attention(y, y, y, need_weights=False)[0]
            return x + self.mlp(self.ln_2(x))

    torch.manual_seed(0)
    module = nn.Sequential(*[Block() for _ in range(layers)], nn.LayerNorm(d)).eval()
    x = np.random.default_rng(0).standard_normal((batch, tokens, d)).astype(np.float32)
    buf = io.BytesIO()
    torch.onnx.export(module, (torch.from_numpy(x),), buf, opset_version=17, dynamo=False, input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "batch"}})
    return onnx.load_from_string(buf.getvalue()), {"x": x}


def measure(ctx, model, feeds, fused, iters):
    default = list(passes.INFERENCE_PASSES)
    passes.INFERENCE_PASSES[:] = [p for p in default if fused or p not in FUSIONS]
    try:
        net = dlnet.Net(ctx).load_onnx(model)
        out = net.run(feeds)
    finally:
        passes.INFERENCE_PASSES[:] = default
    kinds = {}
    for launch in net.launches:
        kind = launch.label.split()[-1]
        kinds[kind] = kinds.get(kind, 0) + 1
    for _ in range(3):
        net.run(feeds)
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        net.run(feeds)
        times.append(time.perf_counter() - t)
    net.release()
    return statistics.median(times) * 1e3, kinds, next(iter(out.values()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nets", default="vit_b_16,swin_t,bert,gpt,vit_encoder")
    ap.add_argument("--batches", default="16,1")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--device", default=None)
    ap.add_argument("--tiny", action="store_true", help="the small test models on the CPU device")
    args = ap.parse_args()
    nets = ["bert", "gpt", "vit_encoder"] if args.tiny else args.nets.split(",")
    ctx = dlnet.Context("cpu" if args.tiny else args.device)
    print(f"device: {ctx.dev.name if hasattr(ctx.dev, 'name') else ctx.dev}")
    print(f"{'net':10s} {'batch':>5s} {'launches off':>12s} {'on':>5s} {'ms off':>8s} {'ms on':>8s} {'rel L2':>9s}  "
          "launches per kind (off -> on, where they differ)")
    for name in nets:
        for batch in [int(b) for b in args.batches.split(",")]:
            if name in ("bert", "gpt"):
                model, feeds = builder_model(name, batch, args.tiny)
            elif name == "vit_encoder":
                model, feeds = mha_model(batch, args.tiny)
            else:
                model, feeds = torchvision_model(name, batch)
            ms_off, off, y_off = measure(ctx, model, feeds, False, args.iters)
            ms_on, on, y_on = measure(ctx, model, feeds, True, args.iters)
            err = float(np.linalg.norm(y_on - y_off) / max(np.linalg.norm(y_off), 1e-30))
            diff = ", ".join(f"{k} {off.get(k, 0)}->{on.get(k, 0)}" for k in sorted(set(off) | set(on))
                             if off.get(k, 0) != on.get(k, 0))
            print(f"{name:10s} {batch:5d} {sum(off.values()):12d} {sum(on.values()):5d} {ms_off:8.3f} {ms_on:8.3f} "
                  f"{err:9.2e}  {diff}")


if __name__ == "__main__":
    main()
