"""attention_grad_mma.cl alone on the GPU machine (AttentionGrad on the tensor cores), in f16 (half q, k, v, y, dy and
gradients) or tf32 (float): each kernel's time (dq, then dk dv) against PyTorch's scaled_dot_product_attention
backward in the same process (half, or float with TF32 on), relative L2 error of dq, dk, dv against float64, and
what ptxas says of each program (registers, spills: -cl-nv-verbose). [B, H, T, D] contiguous operands.

    python3 bench/probes/attention_grad_mma.py [--shapes 16x12x256x64c,16x12x197x64] [--modes f16,tf32]
        [--warps 4] [--bt 0] [--iters 20] [--set NAME=V ...]

A shape ending in c is causal. --bt 0: the lowering's tile (families/attention.py grad_mma_tile); --set: extra
defines. Prints a table; asserts nothing.
"""
import argparse
import statistics
from types import SimpleNamespace

import numpy as np
import pyopencl as cl

from dlnet.kernels.families.attention import grad_mma_tile
from dlnet.kernels.options import Options
from dlnet.kernels.runtime import kernel_source


def oracle(q, k, v, dy, causal):
    """(y, dq, dk, dv) in float64."""
    scale = 1.0 / np.sqrt(q.shape[-1])
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    y = np.einsum("bhqk,bhkd->bhqd", p, v)
    dp = np.einsum("bhqd,bhkd->bhqk", dy, v)
    ds = p * (dp - (dy * y).sum(-1, keepdims=True))
    return (y, np.einsum("bhqk,bhkd->bhqd", ds, k) * scale, np.einsum("bhqk,bhqd->bhkd", ds, q) * scale,
            np.einsum("bhqk,bhqd->bhkd", p, dy))


def rel(a, b):
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b))


def main():
    import torch
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="16x12x256x64c,16x12x197x64")
    ap.add_argument("--modes", default="f16,tf32")
    ap.add_argument("--warps", default="4")
    ap.add_argument("--bt", default="0")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--set", nargs="*", default=[], help="extra defines NAME=V")
    args = ap.parse_args()
    plat = next(p for p in cl.get_platforms() if "NVIDIA" in p.name)
    dev_cl = plat.get_devices()[0]
    ctx = cl.Context([dev_cl])
    queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    mf = cl.mem_flags
    extra = dict(s.split("=") for s in args.set)
    rows = []
    for spec in args.shapes.split(","):
        causal = spec.endswith("c")
        B, H, T, D = (int(x) for x in spec.rstrip("c").split("x"))
        rng = np.random.default_rng(0)
        q, k, v, dy = (rng.standard_normal((B, H, T, D)).astype(np.float32) for _ in range(4))
        for mode, nw, bt in ((m, int(w), int(b)) for m in args.modes.split(",") for w in args.warps.split(",")
                             for b in args.bt.split(",")):
            f16 = mode == "f16"
            dt = np.float16 if f16 else np.float32
            xs = [a.astype(dt) for a in (q, k, v, dy)]
            y, *want = oracle(*(a.astype(np.float64) for a in xs), causal)
            xs.insert(3, y.astype(dt))
            size = 2 if f16 else 4
            dev = SimpleNamespace(half_storage=f16, tensor_cores=not f16, is_nvidia=True, is_cpu=False,
                                  local_mem=dev_cl.local_mem_size)
            bt = bt or grad_mma_tile(dev, Options(), D, D)
            warps = min(nw, -(-T // 16))
            defs = {"D": D, "DV": D, "WARPS": warps, "BT": bt, "CAUSAL": int(causal), "MASK": 0, "MASK_T": "float",
                    **{f"{n}_H": int(f16) for n in ("Q", "K", "V", "Y", "G", "GQ", "GK", "GV")}, **extra}
            if f16:
                defs["F16"] = 1
            src = "".join(f"#define {n} {v}\n" for n, v in defs.items()) + kernel_source("mma_tf32") + \
                kernel_source("ptx_lanes") + kernel_source("attention_grad_mma")
            prg = cl.Program(ctx, src).build(options=["-cl-nv-verbose"])
            log = prg.get_build_info(dev_cl, cl.program_build_info.LOG)
            print(f"== {spec} {mode} warps {warps} bt {bt}\n" + "\n".join(
                ln for ln in log.splitlines() if "registers" in ln or "spill" in ln), flush=True)
            bufs = [cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(a)) for a in xs]
            outs = [cl.Buffer(ctx, mf.READ_WRITE, q.size * size) for _ in range(3)]
            stats = cl.Buffer(ctx, mf.READ_WRITE, B * H * T * 2 * 4)
            mask = cl.Buffer(ctx, mf.READ_ONLY, 4)
            st = [np.int64(s) for s in (H * T * D, T * D, D)]
            head = [np.int32(T), np.int32(T), np.int32(H), np.int32(H), np.float32(1.0 / np.sqrt(D)), np.int32(0)] + \
                [np.int64(0)] * 4
            z = np.uint64(0)
            kq = prg.attention_grad_mma_q
            kq.set_args(*[x for b in bufs for x in (b, z)], mask, z, outs[0], z, stats, z, *head, *st * 6)
            kkv = prg.attention_grad_mma_kv
            kkv.set_args(bufs[0], z, bufs[1], z, bufs[2], z, bufs[4], z, mask, z, stats, z, outs[1], z, outs[2], z,
                         *head, *st * 6)
            grid = (-(-T // (16 * warps)) * 32 * warps, B * H)
            times = []
            for _ in range(args.iters + 2):
                e1 = cl.enqueue_nd_range_kernel(queue, kq, grid, (32 * warps, 1))
                e2 = cl.enqueue_nd_range_kernel(queue, kkv, grid, (32 * warps, 1))
                queue.finish()
                times.append(((e1.profile.end - e1.profile.start) * 1e-6, (e2.profile.end - e2.profile.start) * 1e-6))
            tq, tkv = (statistics.median(t[i] for t in times[2:]) for i in (0, 1))
            got = []
            for o in outs:
                h = np.empty(q.shape, dt)
                cl.enqueue_copy(queue, h, o)
                got.append(h)
            errs = [rel(g, w) for g, w in zip(got, want, strict=True)]
            torch.backends.cuda.matmul.allow_tf32 = not f16
            tdt = torch.float16 if f16 else torch.float32
            tq_, tk_, tv_ = (torch.from_numpy(a).cuda().to(tdt).requires_grad_() for a in (q, k, v))
            tdy = torch.from_numpy(dy).cuda().to(tdt)
            ty = torch.nn.functional.scaled_dot_product_attention(tq_, tk_, tv_, is_causal=causal)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            tt = []
            for _ in range(args.iters + 2):
                start.record()
                torch.autograd.grad(ty, (tq_, tk_, tv_), tdy, retain_graph=True)
                end.record()
                torch.cuda.synchronize()
                tt.append(start.elapsed_time(end))
            rows.append((spec, mode, warps, bt, tq, tkv, statistics.median(tt[2:]), errs))
    print(f"\n{'shape':16s} {'mode':5s} {'warps':>5} {'bt':>3} {'dq ms':>7} {'dk dv ms':>8} {'sum':>7} "
          f"{'torch ms':>8} {'ratio':>6}  rel err dq / dk / dv")
    for spec, mode, warps, bt, tq, tkv, tt, errs in rows:
        print(f"{spec:16s} {mode:5s} {warps:5d} {bt:3d} {tq:7.4f} {tkv:8.4f} {tq + tkv:7.4f} {tt:8.4f} "
              f"{tt / (tq + tkv):6.2f}  " + " / ".join(f"{e:.1e}" for e in errs))


if __name__ == "__main__":
    main()
