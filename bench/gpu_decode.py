"""Greedy decoding with a KV cache: dlnet.generate against PyTorch eager, in one process and one run.

    python bench/gpu_decode.py [--tokens 128] [--prompt 8] [--precision fp32,tf32] [--repeats 3]
    python bench/gpu_decode.py --tiny          # 2 layers, d 64, vocab 97, 16 tokens, on the CPU: known to work

A GPT-2-small-shaped decoder (12 layers, d 768, 12 heads, vocab 50257, random weights) written in plain torch, with
two forms of one forward over the same weights: PyTorch eager decodes with a growing cache (torch.cat of the past and
the new keys, as HF's DynamicCache does; each step's token stays on the GPU, one synchronisation at the end), dlnet
runs the form exported (TorchScript, op-set 17) with a static cache of prompt + tokens positions, the new keys and
values written in place by a one-hot Where at a `position` input, so that every step, the prompt's tokens included,
runs one plan with the cache kept on the device (Net.run(keep=...); each present key is computed over its past
one, so no step copies the cache). Batch 1. The time of a whole generate() call
(prompt and every token, logits to the host each step on dlnet's side), best of --repeats after a warm-up; tokens/s
= new tokens / that time. fp32: PyTorch with TF32 off; tf32: both in TF32. The tokens must be PyTorch's (asserted
after the table prints).
"""
import argparse
import io
import math
import sys
import time

import numpy as np
import torch
from torch import nn

import dlnet

GPT2_SMALL = dict(layers=12, d=768, heads=12, vocab=50257)
TINY = dict(layers=2, d=64, heads=4, vocab=97)


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, past_k, past_v, update, mask):
        b, t, d = x.shape
        q, k, v = (y.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for y in self.qkv(self.ln1(x)).split(d, dim=-1))
        k, v = update(past_k, k), update(past_v, v)
        a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // self.heads) + mask, dim=-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(nn.functional.gelu(self.fc(self.ln2(x)))), k, v


class Decoder(nn.Module):
    """forward(input_ids, *past) with a growing cache, or forward(input_ids, position, *past) with `static`."""

    def __init__(self, layers, d, heads, vocab, tmax):
        super().__init__()
        self.static, self.tmax, self.heads, self.d = False, tmax, heads, d
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(tmax, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, input_ids, *rest):
        if self.static:
            position, past = rest[0], rest[1:]
            keys = torch.arange(self.tmax, device=input_ids.device)
            hot = (keys == position).reshape(1, 1, self.tmax, 1)
            update = lambda old, new: torch.where(hot, new, old)
            mask = torch.where(keys <= position, 0.0, float("-inf"))
            pos = position.reshape(1, 1)
        else:
            past = rest
            tp, t = past[0].shape[2], input_ids.shape[1]
            update = lambda old, new: torch.cat([old, new], dim=2)
            mask = torch.triu(torch.full((t, tp + t), float("-inf"), device=input_ids.device), diagonal=tp + 1)
            pos = torch.arange(tp, tp + t, device=input_ids.device).reshape(1, t)
        x = self.wte(input_ids) + self.wpe(pos)
        present = []
        for i, block in enumerate(self.blocks):
            x, k, v = block(x, past[2 * i], past[2 * i + 1], update, mask)
            present += [k, v]
        return (self.head(self.ln(x)), *present)


def export_static(model):
    n = len(model.blocks)
    past = [f"past_key_values.{i}.{kv}" for i in range(n) for kv in ("key", "value")]
    present = [f"present.{i}.{kv}" for i in range(n) for kv in ("key", "value")]
    dh = model.d // model.heads
    args = (torch.zeros(1, 1, dtype=torch.long), torch.tensor([0]),
            *[torch.zeros(1, model.heads, model.tmax, dh) for _ in past])
    model.static = True
    f = io.BytesIO()
    try:
        torch.onnx.export(model, args, f, opset_version=17, dynamo=False, input_names=["input_ids", "position"] + past,
                          output_names=["logits"] + present)
    finally:
        model.static = False
    return f.getvalue()


def torch_greedy(model, prompt, n, device):
    """PyTorch eager with its growing cache: the prompt in one step, then a token a step, all on `device`."""
    with torch.no_grad():
        tokens = torch.from_numpy(prompt).to(device)
        empty = torch.zeros(1, model.heads, 0, model.d // model.heads, device=device)
        out = model(tokens, *[empty] * (2 * len(model.blocks)))
        for _ in range(n):
            new = out[0][:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, new], dim=1)
            out = model(new, *out[1:])
        return tokens.cpu().numpy()


def best_seconds(fn, repeats, sync=lambda: None):
    fn()  # warm-up: dlnet plans and builds, PyTorch loads its kernels
    times = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        result = fn()
        sync()
        times.append(time.perf_counter() - t)
    return min(times), result


def set_tf32(on):
    torch.backends.cudnn.allow_tf32 = on
    torch.backends.cuda.matmul.allow_tf32 = on


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=8)
    ap.add_argument("--precision", default="fp32,tf32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default=None, help="dlnet's device (ocl:N, gpu, cpu); default: the first GPU")
    ap.add_argument("--tiny", action="store_true", help="2 layers, d 64, vocab 97, 16 tokens, fp32, on the CPU")
    args = ap.parse_args()
    shape = TINY if args.tiny else GPT2_SMALL
    tokens = 16 if args.tiny else args.tokens
    precisions = ["fp32"] if args.tiny else args.precision.split(",")
    torch_device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    dl_device = "cpu" if args.tiny else args.device
    torch.manual_seed(0)
    tmax = args.prompt + tokens
    model = Decoder(**shape, tmax=tmax).eval()
    t = time.perf_counter()
    onnx_bytes = export_static(model)
    print(f"decoder {shape}, static cache of {tmax} positions: exported in {time.perf_counter() - t:.1f} s "
          f"({len(onnx_bytes) / 2**20:.0f} MiB)", file=sys.stderr)
    model = model.to(torch_device)
    prompt = np.random.default_rng(0).integers(0, shape["vocab"], (1, args.prompt))
    sync = torch.cuda.synchronize if torch_device == "cuda" else (lambda: None)
    rows, failures = [], []
    for precision in precisions:
        set_tf32(precision == "tf32")
        t_torch, want = best_seconds(lambda: torch_greedy(model, prompt, tokens, torch_device), args.repeats, sync)
        with dlnet.Net(dlnet.Context(dl_device, precision=precision)).load_onnx(onnx_bytes) as net:
            net.release()  # (the plan made at load: generate's has the cache's outputs tied to its inputs)
            t_dl, got = best_seconds(lambda: dlnet.generate(net, prompt, tokens), args.repeats)
            device, plans = str(net.ctx.info), len(net.plans)
        same = np.array_equal(got, want)
        if not same:
            first = int(np.argmax(got[0] != want[0]))
            failures.append(f"{precision}: dlnet's tokens differ from PyTorch's from position {first} "
                            f"({got[0, first:first + 4]} against {want[0, first:first + 4]})")
        rows.append((precision, tokens / t_dl, tokens / t_torch, t_torch / t_dl, plans, same, device))
    print(f"\n{tokens} greedy tokens at batch 1 after a {args.prompt}-token prompt (best of {args.repeats}); "
          f"PyTorch eager on {torch_device}, torch {torch.__version__}")
    print("| precision | dlnet tokens/s | PyTorch tokens/s | ratio (dlnet/PyTorch) | dlnet plans | same tokens | dlnet "
          "device |")
    print("|---|---|---|---|---|---|---|")
    for precision, dl, pt, ratio, plans, same, device in rows:
        print(f"| {precision} | {dl:.1f} | {pt:.1f} | {ratio:.2f} | {plans} | {'yes' if same else 'NO'} | {device} |")
    assert not failures, "; ".join(failures)


if __name__ == "__main__":
    main()
