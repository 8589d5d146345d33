"""Per-layer rates of the matrix kernels: each convolution / GEMM launch's kernel time and TFLOP/s, with the
registers and spills the device compiler reports for its program.

    python3 bench/gpu_kernels.py [--nets vgg16,resnet50] [--batch 16] [--gemm 4096,8192] [--precision fp32]
                                 [--ptx DIR]

Runs on the GPU machine (torchvision there). On NVIDIA, set DLNET_BUILD_OPTIONS=-cl-nv-verbose to get the
register counts in the table; --ptx DIR writes each matrix program's binary (PTX on NVIDIA) and build log there.
Prints tables; asserts nothing.
"""
import argparse
import os
import statistics
import sys

import numpy as np

import dlnet
from dlnet.kernels import launch, runtime

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

KEYS = {}  # id(cl.Kernel) -> (source, options) of its program
_bind = launch.PendingKernel.bind


def _recording_bind(self, ctx):
    k = _bind(self, ctx)
    KEYS[id(k)] = self.key
    return k


launch.PendingKernel.bind = _recording_bind


def node_flops(graph):
    """{"name Op": (FLOPs, M, N, K)} of the convolution and matrix nodes (2 FLOPs per multiply-add; a convolution's
    GEMM per group: M output channels, N pixels of the batch, K window elements)."""
    out = {}
    for n in graph.nodes:
        y = n.outputs[0]
        if n.op == "Conv":
            w = n.inputs[1]
            g = n.attrs.get("group", 1)
            cout, k = (w.shape[2], 9 * w.shape[3]) if n.attrs.get("winograd") else (w.shape[0], int(np.prod(w.shape[1:])))
            out[f"{n.name} {n.op}"] = (2 * y.size * k, cout // g, y.size // cout, k)  # Winograd: direct FLOPs
        elif n.op in ("Gemm", "MatMul"):
            a = n.inputs[0]
            k = a.shape[-2] if n.attrs.get("transA", 0) else a.shape[-1]
            out[f"{n.name} {n.op}"] = (2 * y.size * k, y.shape[-2], y.shape[-1], k)
    return out


def build_log(ctx, key):
    prg = ctx._programs.get(key)
    if prg is None:
        return ""
    try:
        return prg.get_build_info(ctx.device, runtime.cl.program_build_info.LOG)
    except runtime.cl.Error:
        return ""


def regs(log, name):
    """'R regs S spill' for kernel `name` from an NVIDIA -cl-nv-verbose log."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if f"'{name}'" in line and "Compiling entry" in line or f"for '{name}'" in line:
            for nxt in lines[i:i + 6]:
                if "registers" in nxt:
                    r = nxt.split("Used ")[1].split(" registers")[0]
                    spill = [s for s in lines[i:i + 6] if "spill" in s]
                    sp = spill[0].split("bytes stack frame, ")[1].split(" bytes spill stores")[0] if spill else "?"
                    return f"{r}r/{sp}s"
    return "-"


def profile(ctx, launches, flops, iters, ptx_dir, tag):
    per = {}
    for _ in range(iters):
        events = [(launch, launch.enqueue(ctx.queue)) for launch in launches]
        ctx.queue.finish()
        for launch, ev in events:
            per.setdefault(id(launch), []).append((ev.profile.end - ev.profile.start) * 1e-6)
    total = sum(statistics.median(v) for v in per.values())
    layers = {}
    for launch in launches:
        layers.setdefault(launch.layer, []).append(launch)
    print(f"\n{tag}: {total:.2f} ms of kernel time in {len(launches)} launches")
    print(f"{'layer':34s} {'ms':>7} {'TFLOP/s':>8} {'%':>5} {'M':>5} {'N':>7} {'K':>5}  kernels (regs/spill)")
    rows = []
    for layer, ls in layers.items():
        if layer not in flops:
            continue
        f, M, N, K = flops[layer]
        ms = sum(statistics.median(per[id(x)]) for x in ls)
        names = []
        for x in ls:
            key = KEYS.get(id(x.kernel))
            log = build_log(ctx, key) if key else ""
            kname = x.kernel.function_name
            names.append(f"{x.label.split(' ', 1)[-1]}[{regs(log, kname)}]")
            if ptx_dir and key:
                h = abs(hash(key)) % 10**8
                path = os.path.join(ptx_dir, f"{tag}_{kname}_{h}")
                if not os.path.exists(path + ".ptx"):
                    prg = ctx._programs[key]
                    with open(path + ".ptx", "wb") as fh:
                        fh.write(prg.get_info(runtime.cl.program_info.BINARIES)[0])
                    with open(path + ".cl", "w") as fh:
                        fh.write(key[0])
                    with open(path + ".log", "w") as fh:
                        fh.write(log)
        rows.append((layer, ms, f / ms / 1e9, names, M, N, K))
    for layer, ms, tf, names, M, N, K in rows:
        print(f"{layer[-34:]:34s} {ms:7.3f} {tf:8.1f} {100 * ms / total:5.1f} {M:5d} {N:7d} {K:5d}  {' '.join(names)}")
    mat = sum(r[1] for r in rows)
    print(f"matrix layers {mat:.2f} ms ({100 * mat / total:.0f}%), {sum(flops[r[0]][0] for r in rows) / mat / 1e9:.1f} "
          f"TFLOP/s over them")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nets", default="vgg16,resnet50")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--gemm", default="4096")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--ptx", default="")
    ap.add_argument("--device", default="gpu")
    ap.add_argument("--tiles", default="", help="force one fp32 tile config 'TM,TN,TK,WM,WN' on every layer")
    args = ap.parse_args()
    if args.ptx:
        os.makedirs(args.ptx, exist_ok=True)
    if args.tiles:
        from dlnet.kernels import rules
        v = [int(t) for t in args.tiles.split(",")]
        tiles = dict(zip(["TM", "TN", "TK", "WM", "WN"], v))
        rules.GEMM_TILES["gpu"] = dict(rules.GEMM_TILES["gpu"], huge=tiles, mid=tiles, big=tiles)
        print(f"tiles forced: {tiles}")
    ctx = dlnet.Context(args.device, precision=args.precision, profile=True)
    print(f"device: {ctx.info}; {args.precision}; build options {ctx.options.build_options}")
    for name in [n for n in args.nets.split(",") if n]:
        from gpu_train import export, torch_model
        x = np.random.default_rng(0).standard_normal((args.batch, 3, 224, 224)).astype(np.float32)
        net = dlnet.Net(ctx).load_onnx(export(torch_model(name).eval(), x))
        net.run({net.inputs[0].name: x})
        profile(ctx, net.launches, node_flops(net._last.graph), args.iters, args.ptx, f"{name}_b{args.batch}")
        print(f"memory: {net.memory}")
        net.release()
    for n in [int(v) for v in args.gemm.split(",") if v]:
        from gpu import matmul_model
        net = dlnet.Net(ctx).load_onnx(matmul_model(n))
        a = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
        out = net.run({"a": a, "b": a})["y"]
        ref = a.astype(np.float64) @ a.astype(np.float64) if n <= 4096 else None
        err = np.linalg.norm(out - ref) / np.linalg.norm(ref) if ref is not None else float("nan")
        print(f"\nGEMM n={n}: rel err {err:.1e}")
        profile(ctx, net.launches, node_flops(net._last.graph), 10, args.ptx, f"gemm{n}")
        net.release()


if __name__ == "__main__":
    main()
