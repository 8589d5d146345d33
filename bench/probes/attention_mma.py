"""attention_mma.cl alone on the GPU machine, in tf32 (float q, k, v) and F16 (half q, k, v, fp32 accumulation);
K and V through registers, or with a mode ending in cp (tf32cp, f16cp) by cp.async (KV_ASYNC): relative L2 error
against float64 attention of the same inputs, and kernel time against PyTorch's scaled_dot_product_attention (float with TF32 on /
half) in the same process, each the median of --iters, PyTorch's over 20 back-to-back calls (no launch gap).
[B, H, T, D] contiguous operands.

    python3 bench/probes/attention_mma.py [--shapes 16x12x197x64,8x12x256x64c] [--modes tf32,tf32cp,f16,f16cp]
        [--warps 8,4] [--bk 64] [--iters 20]

A shape ending in c is causal. Prints a table; asserts nothing.
"""
import argparse
import statistics

import numpy as np
import pyopencl as cl

from dlnet.kernels.runtime import kernel_source


def oracle(q, k, v, causal):
    s = np.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhqk,bhkd->bhqd", e / e.sum(-1, keepdims=True), v)


def main():
    import torch
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="16x12x197x64,8x12x256x64c,1x12x1024x64c,4x16x512x128")
    ap.add_argument("--modes", default="tf32,tf32cp,f16,f16cp")
    ap.add_argument("--warps", default="8")
    ap.add_argument("--bk", type=int, default=0, help="keys a tile (0: 64, 32 past head dim 64)")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    plat = next(p for p in cl.get_platforms() if "NVIDIA" in p.name)
    dev = plat.get_devices()[0]
    ctx = cl.Context([dev])
    queue = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    mf = cl.mem_flags
    rows = []
    for spec in args.shapes.split(","):
        causal = spec.endswith("c")
        B, H, T, D = (int(x) for x in spec.rstrip("c").split("x"))
        rng = np.random.default_rng(0)
        q, k, v = (rng.standard_normal((B, H, T, D)).astype(np.float32) for _ in range(3))
        for mode, nw in ((m, int(w)) for m in args.modes.split(",") for w in args.warps.split(",")):
            f16 = mode.startswith("f16")
            xs = [a.astype(np.float16) for a in (q, k, v)] if f16 else [q, k, v]
            want = oracle(*(a.astype(np.float64) for a in xs), causal)
            bk = args.bk or (64 if D <= 64 else 32)
            warps = min(nw, -(-T // 16))
            defs = {"D": D, "DV": D, "WARPS": warps, "BK": bk, "CAUSAL": int(causal), "MASK": 0, "MASK_T": "float",
                    "SOFTCAP": 0}
            if f16:
                defs.update(F16=1, Y_HALF=1, **({"Y_PAIRS": 1} if mode == "f16cp" else {}))
            if mode.endswith("cp"):
                defs["KV_ASYNC"] = 1
            src = "".join(f"#define {a} {b}\n" for a, b in defs.items()) + kernel_source("mma_tf32") + \
                kernel_source("ptx_lanes") + kernel_source("tf32_store") + kernel_source("attention_mma")
            knl = cl.Kernel(cl.Program(ctx, src).build(), "attention_mma")
            bufs = [cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(a)) for a in xs]
            ybuf = cl.Buffer(ctx, mf.READ_WRITE, B * H * T * D * (2 if f16 else 4))
            dummy = cl.Buffer(ctx, mf.READ_ONLY, 16)
            st = [np.int64(s) for s in (H * T * D, T * D, D)]
            kargs = [bufs[0], np.uint64(0), bufs[1], np.uint64(0), bufs[2], np.uint64(0), dummy, np.uint64(0), ybuf,
                     np.uint64(0), np.int32(T), np.int32(T), np.int32(H), np.int32(H), np.float32(1 / np.sqrt(D)),
                     np.float32(0), np.int32(0)] + [np.int64(0)] * 4 + st * 4
            knl.set_args(*kargs)
            gsize, lsize = (-(-T // (16 * warps)) * 32 * warps, B * H), (32 * warps, 1)
            for _ in range(3):
                cl.enqueue_nd_range_kernel(queue, knl, gsize, lsize)
            y = np.empty((B, H, T, D), np.float16 if f16 else np.float32)
            cl.enqueue_copy(queue, y, ybuf, is_blocking=True)
            err = float(np.linalg.norm(y.astype(np.float64) - want) / np.linalg.norm(want))
            ts = []
            for _ in range(args.iters):
                ev = cl.enqueue_nd_range_kernel(queue, knl, gsize, lsize)
                ev.wait()
                ts.append((ev.profile.end - ev.profile.start) * 1e-6)
            t = statistics.median(ts)
            torch.backends.cuda.matmul.allow_tf32 = not f16
            tq, tk, tv = (torch.from_numpy(a).cuda() for a in xs)
            for _ in range(3):
                torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
            tts = []
            for _ in range(args.iters):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(20):
                    torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
                e.record()
                torch.cuda.synchronize()
                tts.append(s.elapsed_time(e) / 20)
            tt = statistics.median(tts)
            flop = 4.0 * B * H * T * T * D / (2 if causal else 1)
            rows.append((spec, mode, warps, t, flop / t * 1e-9, tt, tt / t, err))
    print("\n| shape (BxHxTxD, c causal) | mode | warps | dlnet ms | TFLOP/s | torch SDPA ms | ratio | rel err |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.4f} | {r[4]:.0f} | {r[5]:.4f} | {r[6]:.2f} | {r[7]:.1e} |")


if __name__ == "__main__":
    main()
