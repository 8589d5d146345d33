"""Probe: kernel time of every distinct convolution of torchvision nets in tf32 mode under several tensor-core tile
configs forced on every tf32 product, against the tile lowering picks itself: which tile each layer wants.

    python3 bench/probes/tf32_tiles.py [--nets alexnet,resnet18,resnet50,vgg16] [--batch 16]
                                       [--configs '128,128,16,2,2;64,64,16,2,2'] [--iters 15]
                                       [--layers 'cin,cout,k,s,p,h,w;...'] [--device gpu]

Each config is TM,TN,TK,WARPS_M,WARPS_N[,STAGES] of gemm_mma.cl. --as-gemm times each layer's product as a plain
MatMul (B dense along n) instead. All programs are compiled first, in parallel. Prints per
layer the milliseconds of each config (the layer's launches summed, median of --iters runs) and its error against
the default's output, then per net the default's total, each config's total and the total of the best config per
layer. Asserts nothing.
"""
import argparse
import os
import statistics

import numpy as np
import dlnet
from dlnet.kernels import lowering, runtime
from onnx import TensorProto, helper, numpy_helper

from tf32_convs import conv_model

DEFAULT_CONFIGS = "128,128,16,2,2;64,64,16,2,2;64,128,16,1,4;96,128,16,2,2;128,128,16,4,2;128,64,16,2,2;" \
    "192,128,16,4,2"
FORCE = [None]
_pick = lowering.pick_tiles


def forced_pick(ctx, M, N, K, *rest, **kw):
    core, tiles, lsize, grid = _pick(ctx, M, N, K, *rest, **kw)
    if core != "gemm_mma" or FORCE[0] is None:
        return core, tiles, lsize, grid
    t = dict(zip(["TM", "TN", "TK", "WARPS_M", "WARPS_N", "STAGES"], FORCE[0] + (tiles["STAGES"],)[len(FORCE[0]) - 5:]))
    nthreads = 32 * t["WARPS_M"] * t["WARPS_N"]
    return core, t, (nthreads, 1, 1), (-(-N // t["TN"]) * nthreads, -(-M // t["TM"]))


lowering.pick_tiles = forced_pick


def gemm_model(cin, cout, k, s, p, h, w, batch):
    """The convolution's product as a plain MatMul (weights [M, K] times an input [K, N]), and its input shape."""
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    M, K, N = cout, cin * k * k, batch * oh * ow
    wt = (np.random.default_rng(0).standard_normal((M, K)) / np.sqrt(K)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["w", "x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [K, N])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [M, N])], [numpy_helper.from_array(wt, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), (K, N)


def layers_of(net_name):
    import torch
    import torchvision
    model = getattr(torchvision.models, net_name)(weights=None).eval()
    seen = {}

    def hook(mod, inp, out):
        c = (mod.in_channels, mod.out_channels, mod.kernel_size[0], mod.stride[0], mod.padding[0],
             inp[0].shape[2], inp[0].shape[3])
        if mod.groups == 1:
            seen[c] = seen.get(c, 0) + 1
    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d):
            m.register_forward_hook(hook)
    with torch.no_grad():
        model(torch.zeros(1, 3, 224, 224))
    return seen


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nets", default="alexnet,resnet18,resnet50,vgg16")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--configs", default=DEFAULT_CONFIGS)
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--as-gemm", action="store_true", help="time each layer's product as a plain MatMul instead")
    ap.add_argument("--layers", default="", help="'cin,cout,k,s,p,h,w;...' instead of the nets' layers")
    args = ap.parse_args()
    configs = [None] + [tuple(int(v) for v in c.split(",")) for c in args.configs.split(";")]
    names = ["default"] + [c.replace(",16,", "/").replace(",", "x", 1).replace(",32,", "/32/")
                           for c in args.configs.split(";")]
    nets = {"layers": {tuple(int(v) for v in c.split(",")): 1 for c in args.layers.split(";")}} if args.layers \
        else {n: layers_of(n) for n in args.nets.split(",")}
    layers = list(dict.fromkeys(c for n in nets.values() for c in n))
    ctx = dlnet.Context(args.device, precision="tf32", profile=True)
    rng = np.random.default_rng(1)
    protos = {c: gemm_model(*c, args.batch)[0] if args.as_gemm else conv_model(*c, args.batch, False)[0]
              for c in layers}

    # compile every program first, in parallel
    keys = []
    build_all, bind = runtime.Context.build_all, runtime.PendingKernel.bind
    runtime.Context.build_all = lambda self, ks: keys.extend(ks)
    runtime.PendingKernel.bind = lambda self, c: self
    for c in layers:
        for cfg in configs:
            FORCE[0] = cfg
            net = dlnet.Net(ctx).load_onnx(protos[c])
            net.release()
    runtime.Context.build_all, runtime.PendingKernel.bind = build_all, bind
    os.environ.setdefault("DLNET_BUILD_PROCS", str(os.cpu_count()))
    ctx.build_all(keys)

    ms = {}
    print(f"{'cin':>4} {'cout':>4} {'k':>2} {'s':>1} {'hw':>3} " + " ".join(f"{n:>10}" for n in names), flush=True)
    for c in layers:
        cin, cout, k, s, p, h, w = c
        x = rng.standard_normal(gemm_model(*c, args.batch)[1] if args.as_gemm else (args.batch, cin, h, w)) \
            .astype(np.float32)
        ref, row = None, []
        for cfg, name in zip(configs, names):
            FORCE[0] = cfg
            net = dlnet.Net(ctx).load_onnx(protos[c])
            y = net.run({"x": x})["y"]
            ref = y if ref is None else ref
            err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
            per = {}
            for _ in range(args.iters):
                events = [(i, la.enqueue(ctx.queue)) for i, la in enumerate(net.launches)]
                ctx.queue.finish()
                for i, ev in events:
                    per.setdefault(i, []).append((ev.profile.end - ev.profile.start) * 1e-6)
            ms[c, name] = sum(statistics.median(v) for v in per.values())
            row.append(f"{ms[c, name]:6.3f}{'!' if err > 5e-3 else ' '}" + ("*" if cfg is None and any(
                "splitK" in la.label for la in net.launches) else " ") + "  ")
            net.release()
        best = min(names, key=lambda n: ms[c, n])
        print(f"{cin:4d} {cout:4d} {k:2d} {s:1d} {h:3d} " + " ".join(f"{r:>10}" for r in row) + f"  best {best}",
              flush=True)
    print("\n(* default split K; ! error against the default's output above 5e-3)")
    print(f"{'net':10s} " + " ".join(f"{n:>10}" for n in names) + f" {'best/layer':>10}")
    for net_name, counts in nets.items():
        tot = {n: sum(ms[c, n] * cnt for c, cnt in counts.items()) for n in names}
        oracle = sum(min(ms[c, n] for n in names) * cnt for c, cnt in counts.items())
        print(f"{net_name:10s} " + " ".join(f"{tot[n]:10.3f}" for n in names) + f" {oracle:10.3f}")


if __name__ == "__main__":
    main()
