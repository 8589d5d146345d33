"""Probe: variants of the tf32 tensor-core core (gemm_mma.cl) side by side in one process: GEMM TFLOP/s against
cuBLAS TF32, then nets at batch 16 (ratio to PyTorch TF32), or with --repeat how far repeated runs move.

    git show 219c3cd^:dlnet/kernels/cl/gemm_mma.cl > bench/probes/old_mma.cl   # (in the tree: it travels along)
    python3 bench/probes/mma_variants.py --variants 'old=bench/probes/old_mma.cl;new=' \
        --gemm 4096,8192 --nets vgg16,resnet50 [--repeat 6]

A variant is name=path of a gemm_mma.cl to use in place of dlnet's (empty: dlnet's own), or path@COND, where COND
is prepended as `#define EPI_SMEM (COND)` (for a file that switches on it: how the split-K race was bisected).
"""
import argparse

import dlnet
from dlnet.kernels import lowering, runtime
import gpu

_own = runtime.kernel_source


def use(path):
    """path, or path@COND: COND (a preprocessor condition) is defined as EPI_SMEM before the file's text"""
    path, _, cond = path.partition("@")
    text = open(path).read() if path else None
    if cond:
        text = f"#define EPI_SMEM ({cond})\n" + text

    def source(name):
        return text if (name == "gemm_mma" and text is not None) else _own(name)
    lowering.kernel_source = source


def repeat(ctx, nets, batch, times):
    import numpy as np
    import torch
    import torchvision
    for name in nets:
        torch.manual_seed(0)
        model = getattr(torchvision.models, name)(weights=None).eval()
        net = dlnet.Net(ctx).load_onnx(gpu.export(model, 1))
        x = np.random.default_rng(batch).standard_normal((batch, 3, 224, 224)).astype(np.float32)
        with torch.no_grad():
            ref = model.double()(torch.from_numpy(x).double()).numpy()
        ys = [net.run({"x": x})["y"] for _ in range(times)]
        errs = [gpu.rel_l2(y, ref) for y in ys]
        spread = max(float(np.abs(y - ys[0]).max()) for y in ys) / float(np.abs(ys[0]).max())
        print(f"  {name}: err against float64 {min(errs):.1e}..{max(errs):.1e}, spread between runs {spread:.1e}",
              flush=True)
        net.release()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", required=True)
    ap.add_argument("--gemm", default="4096,8192")
    ap.add_argument("--nets", default="")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=0, help="instead of timing: run each net this many times on one "
                    "input and print how far the outputs move between runs (a race shows as a spread)")
    ap.add_argument("--rounds", type=int, default=1, help="repeat the variants this many times (noise)")
    args = ap.parse_args()
    ctx = dlnet.Context("gpu", precision="tf32")
    for rnd in range(args.rounds):
        for spec in args.variants.split(";"):
            name, _, path = spec.partition("=")
            use(path.strip())
            print(f"\n### {name} (round {rnd + 1})", flush=True)
            try:
                if args.gemm:
                    gpu.bench_gemm(ctx, [int(n) for n in args.gemm.split(",")])
                if args.nets and args.repeat:
                    repeat(ctx, args.nets.split(","), args.batch, args.repeat)
                elif args.nets:
                    gpu.bench_nets(ctx, args.nets.split(","), [args.batch], args.iters, [])
            except Exception as e:  # a variant that fails to build: say so, go on
                print(f"  failed: {str(e)[:1500]}")


if __name__ == "__main__":
    main()
