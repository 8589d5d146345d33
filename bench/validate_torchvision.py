"""Validate the PyTorch bridge on the 19 torchvision networks DLPrimitives validated (GPU machine: torchvision there).

Each network (random weights, Dropout off, batch 2, training mode) goes through `dlnet.torch.Module` (from_module's
export run by dlnet.torch.Function: forward and dlnet's backward) and through `torch.compile(backend="dlnet")`;
its output, the loss sum(y * w) and every parameter gradient are compared with PyTorch in float64 on the GPU. A result
passes where dlnet's relative L2 error against float64 is at most max(10 x PyTorch float32's, 1e-4). Prints a
markdown table last.

    python3 bench/validate_torchvision.py [--nets resnet18,alexnet] [--device gpu]
"""
import argparse
import copy
import time
import traceback
import warnings

import numpy as np
import torch

import dlnet
import dlnet.torch as dt

NETS = ["alexnet", "resnet18", "resnet50", "convnext_small", "vgg16", "squeezenet1_0", "googlenet", "densenet161",
        "inception_v3", "shufflenet_v2_x1_0", "mobilenet_v2", "mobilenet_v3_large", "mobilenet_v3_small",
        "resnext50_32x4d", "wide_resnet50_2", "mnasnet1_0", "efficientnet_b0", "efficientnet_b4", "regnet_y_400mf"]


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def make(name):
    import torchvision
    kwargs = {"aux_logits": False, "init_weights": True} if name in ("googlenet", "inception_v3") else {}
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None, **kwargs)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if hasattr(m, "stochastic_depth_prob"):
            m.stochastic_depth_prob = 0.0
        if type(m).__name__ == "StochasticDepth":  # (its random mask: exported as RandomUniformLike)
            m.p = 0.0
    return model


def reference(model, x, w):
    """(output, {param: grad}) of `model` in float64 on the GPU, and the same in float32."""
    out = {}
    for dtype in (torch.float64, torch.float32):
        m = copy.deepcopy(model).to("cuda", dtype).train()
        y = m(x.to("cuda", dtype))
        (y * w.to("cuda", dtype)).sum().backward()
        out[dtype] = (y.detach().double().cpu().numpy(),
                      {n: p.grad.double().cpu().numpy() for n, p in m.named_parameters()})
    return out[torch.float64], out[torch.float32]


def check(got, ref64, ref32):
    """Worst (dlnet error / tolerance) over the output and every gradient, and the worst tensor's name."""
    y, grads = got
    worst, where = 0.0, "output"
    pairs = [("output", y, ref64[0], ref32[0])] + [(n, grads[n], ref64[1][n], ref32[1][n]) for n in ref64[1]]
    for name, a, b, c in pairs:
        ratio = rel(a, b) / max(10 * rel(c, b), 1e-4)
        if ratio > worst:
            worst, where = ratio, name
    return worst, where


def via_module(model, x, w, ctx):
    m = copy.deepcopy(model).train()
    wrapped = dt.Module(m, (x,), ctx=ctx)  # (from_module's export, run through dlnet.torch.Function)
    y = wrapped(x)
    (y * w).sum().backward()
    return y.detach().numpy(), {n: p.grad.numpy() for n, p in m.named_parameters()}


def via_compile(model, x, w, ctx):
    m = copy.deepcopy(model).train()
    torch._dynamo.reset()
    compiled = torch.compile(m, backend=lambda gm, ex: dt.backend(gm, ex, ctx=ctx))
    y = compiled(x)
    (y * w).sum().backward()
    return y.detach().numpy(), {n: p.grad.numpy() for n, p in m.named_parameters()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--batch", type=int, default=2)
    args = ap.parse_args()
    ctx = dlnet.Context(args.device)
    print(f"device: {ctx.info}; torch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)
    rows = []
    for name in args.nets.split(","):
        model = make(name)
        size = 299 if name == "inception_v3" else 224
        g = torch.Generator().manual_seed(1)
        x = torch.randn(args.batch, 3, size, size, generator=g)
        y0 = copy.deepcopy(model).eval()(x[:1])
        w = torch.randn(args.batch, *y0.shape[1:], generator=g)
        ref64, ref32 = reference(model, x, w)
        row = [name]
        for how in (via_module, via_compile):
            start = time.perf_counter()
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    worst, where = check(how(model, x, w, ctx), ref64, ref32)
                eager = [str(c.message) for c in caught if "stay in eager" in str(c.message)]
                verdict = "pass" if worst <= 1.0 else f"FAIL ({where} {worst:.1f}x tol)"
                row.append(verdict + (" (some in eager)" if eager else "") + f" {time.perf_counter() - start:.0f}s")
            except Exception as e:  # noqa: BLE001 (the table names what fails and why)
                row.append(f"ERROR {type(e).__name__}: {str(e).splitlines()[0][:90]}")
                traceback.print_exc()
        rows.append(row)
        print(" | ".join(row), flush=True)
    print()
    print("| net | from_module (forward, backward) | torch.compile (forward, backward) |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} |")


if __name__ == "__main__":
    main()
