"""Today's torchvision models through torch's default exporter (GPU machine; torchvision there).

Each network (random weights, Dropout and stochastic depth off) is exported with `torch.onnx.export(..., dynamo=True)`
to a file (weights in external data where large), loaded by dlnet on the GPU and compared with PyTorch CUDA fp32 (TF32
off) at batch 2; then one Adam step through dlnet.Trainer, whose first loss is
compared with PyTorch's (eval mode, as the export) on the same weights and batch. Prints a table.

    python3 bench/gpu_today_models.py [--nets vit_b_16,convnext_small,swin_t,mobilenet_v3_large]
"""
import argparse
import os
import tempfile
import time
import traceback
import warnings

import numpy as np
import torch

import dlnet

NETS = ["vit_b_16", "convnext_small", "swin_t", "mobilenet_v3_large"]


def make(name):
    import torchvision
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        if hasattr(m, "stochastic_depth_prob"):
            m.stochastic_depth_prob = 0.0
        if type(m).__name__ == "StochasticDepth":
            m.p = 0.0
        if isinstance(m, torch.nn.Linear) and not m.weight.detach().any():  # (ViT's head starts at zero: outputs
            torch.nn.init.normal_(m.weight, std=0.02)  # would be 0 whatever the engine computed)
    return model


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def one(name, ctx, folder, batch):
    model = make(name).eval()
    x = torch.randn(batch, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 1000, (batch,), generator=torch.Generator().manual_seed(2))
    path = os.path.join(folder, f"{name}.onnx")
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), path, dynamo=True, input_names=["x"],
                          dynamic_shapes=({0: torch.export.Dim("batch")},))
    export_s = time.perf_counter() - start
    with torch.no_grad():
        want = model.cuda()(x.cuda()).cpu().numpy()
    net = dlnet.Net(ctx).load_onnx(path)
    got = list(net.run({net.inputs[0].name: x.numpy()}).values())[0]
    err = rel(got, want)
    net.close()
    # one Adam step: the first loss against PyTorch's on the same weights and batch. The default exporter writes the
    # eval-mode graph (BatchNorm folded into the convolutions), so PyTorch's loss is the eval-mode one
    loss_t = torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda()).item()
    net = dlnet.Net(ctx).load_onnx(path, batch=batch)
    with dlnet.Trainer(net, loss="cross_entropy", optimizer=dlnet.optim.Adam(lr=1e-4)) as trainer:
        loss_d = trainer.step({net.inputs[0].name: x.numpy(), "target": y.numpy()})
        loss_2 = trainer.step({net.inputs[0].name: x.numpy(), "target": y.numpy()})
    net.close()
    ops = sorted({n.op_type for n in __import__("onnx").load(path, load_external_data=False).graph.node})
    return err, loss_d, loss_t, loss_2, export_s, ops


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--device", default="gpu")
    args = ap.parse_args()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    ctx = dlnet.Context(args.device)
    print(f"device: {ctx.info}; torch {torch.__version__}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name in args.nets.split(","):
            try:
                err, ld, lt, l2, secs, ops = one(name, ctx, folder, args.batch)
                rows.append(f"| {name} | {err:.1e} | {ld:.5f} / {lt:.5f} ({abs(ld - lt) / abs(lt):.1e}) | {l2:.5f} | "
                            f"{secs:.0f} s | {len(ops)} |")
            except Exception as e:  # noqa: BLE001 (the table says what failed)
                traceback.print_exc()
                rows.append(f"| {name} | ERROR {type(e).__name__}: {str(e).splitlines()[0][:100]} | | | | |")
            print(rows[-1], flush=True)
    print("\n| net | output rel err vs PyTorch fp32 | first loss dlnet / torch (rel) | second loss | export "
          "| ONNX ops |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
