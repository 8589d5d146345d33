"""The ldmatrix-fed tensor-core GEMM core (dlnet/kernels/cl/gemm_ldsm.cl) alone, against cuBLAS (torch.matmul on
CUDA tensors: half for --mode f16, float with TF32 on for --mode tf32) in the same process: correctness (relative L2
against torch's fp32 product of the same inputs, TF32 off) and TFLOP/s for a sweep of tile shapes. On the GPU machine:

    python3 bench/probes/ldsm_gemm.py [--mode f16|tf32] [--nk] [--sizes 4096,8192,3152x3072x768] [--iters 20]

A size is n (an n x n x n product) or MxNxK. Prints a table; asserts nothing.
"""
import argparse
import statistics

import numpy as np
import pyopencl as cl

from dlnet.kernels.runtime import kernel_source

ARGS = """#define KERNEL_NAME gemm_f16
#define KERNEL_ARGS __global const ELEM* a, __global const ELEM* b, __global float* y, int M, int NN, int KK
#define PROLOGUE
#define PTR_A(m, k) (a + (long)(m) * KK + (k))
#ifdef B_NK
#define PTR_B(k, n) (b + (long)(n) * KK + (k))
#else
#define PTR_B(k, n) (b + (long)(k) * NN + (n))
#endif
#define STORE2(m, n, v0, v1) { __global float* p_ = y + (long)(m) * NN + (n); p_[0] = v0; if ((n) + 1 < NN) p_[1] = v1; }
"""
CONFIGS = [  # TM TN TK WARPS_M WARPS_N STAGES GROUP_M (0: none)
    (128, 128, 64, 2, 2, 3, 0), (128, 128, 64, 2, 2, 3, 8), (128, 128, 64, 2, 2, 4, 8), (128, 256, 64, 2, 4, 3, 8),
    (256, 128, 64, 4, 2, 3, 8), (128, 128, 32, 4, 2, 4, 8), (128, 256, 32, 2, 4, 4, 8), (64, 128, 64, 2, 2, 4, 8),
]


def sass(prg, cfg, folder):
    """PTX of a build into folder, and (with triton's ptxas and nvdisasm) its registers, spills and SASS."""
    import os
    import subprocess
    os.makedirs(folder, exist_ok=True)
    name = os.path.join(folder, "_".join(str(c) for c in cfg).replace("+", "-").replace("=", "") or "base")
    ptx = prg.get_info(cl.program_info.BINARIES)[0].decode(errors="replace").replace("\0", "")
    ptx = ptx.split(".metadata_section")[0]  # (NVIDIA OpenCL's; ptxas rejects it)
    with open(name + ".ptx", "w") as f:
        f.write(ptx)
    try:
        import triton
        tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
        for version in ("9.0", "8.8", "8.7", "8.6", "8.5", "8.4", "8.3"):  # (the driver's PTX may be newer)
            with open(name + ".v.ptx", "w") as f:
                f.write(ptx.replace(".version 9.0", f".version {version}"))
            r = subprocess.run([os.path.join(tools, "ptxas"), "-arch=sm_90", "-v", name + ".v.ptx", "-o",
                                name + ".cubin"], capture_output=True, text=True)
            if r.returncode == 0:
                break
        print("  ptxas:", " ".join(ln.strip() for ln in (r.stdout + r.stderr).splitlines() if "registers" in ln
                                     or "spill" in ln or "rror" in ln or "atal" in ln))
        with open(name + ".sass", "w") as f:
            subprocess.run([os.path.join(tools, "nvdisasm"), "-c", "-g", name + ".cubin"], stdout=f,
                           stderr=subprocess.STDOUT)
    except (ImportError, OSError) as e:
        print("  no ptxas:", e)


def parse(s):
    if "x" in s:
        m, n, k = (int(v) for v in s.split("x"))
        return m, n, k
    return int(s), int(s), int(s)


def main():
    import torch
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4096,8192,3152x3072x768,3152x768x3072,1000x1000x1000")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--nk", action="store_true", help="B stored [N][K] (a transposed weight; always so in tf32)")
    ap.add_argument("--mode", default="f16", choices=("f16", "tf32"))
    ap.add_argument("--configs", default="", help="TM,TN,TK,WM,WN,ST,GM;... (default: a sweep)")
    ap.add_argument("--variants", default="", help="defines each config is also built with: NAME[=V]+NAME;... "
                                                    "(an empty item: none), e.g. ';LDSM_PIPE'")
    ap.add_argument("--sass", default="", help="a folder for each build's PTX, and where triton's ptxas and nvdisasm "
                                               "are found, its registers and SASS")
    args = ap.parse_args()
    f16 = args.mode == "f16"
    args.nk = args.nk or not f16
    configs = [tuple(int(v) for v in c.split(",")) for c in args.configs.split(";")] if args.configs else CONFIGS
    configs = [c + (v,) for c in configs for v in args.variants.split(";")]
    plat = next(p for p in cl.get_platforms() if "NVIDIA" in p.name)
    dev = plat.get_devices()[0]
    ctx = cl.Context([dev])
    q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    progs = {}
    for cfg in configs:
        d = dict(zip(("TM", "TN", "TK", "WARPS_M", "WARPS_N", "STAGES", "GROUP_M"), cfg[:7]))
        d.update(dict((kv + "=1").split("=")[:2] for kv in cfg[7].split("+") if kv))
        if not d["GROUP_M"]:
            del d["GROUP_M"]
        if args.nk:
            d["B_NK"] = 1
        d["F16" if f16 else "TF32"] = 1
        d["ELEM"] = "ushort" if f16 else "float"
        src = "".join(f"#define {k} {v}\n" for k, v in d.items()) + ARGS + kernel_source("mma_tf32") + kernel_source("ptx_lanes") + kernel_source("gemm_ldsm")
        try:
            progs[cfg] = cl.Program(ctx, src).build(options="-cl-nv-verbose")
            log = progs[cfg].get_build_info(dev, cl.program_build_info.LOG)
            print(cfg, " ".join(ln.strip() for ln in log.splitlines() if "registers" in ln or "spill" in ln))
            if args.sass:
                sass(progs[cfg], cfg, args.sass)
        except cl.RuntimeError as e:
            print("build failed", cfg, str(e)[:2000])
    rows = []
    for size in args.sizes.split(","):
        M, N, K = parse(size)
        g = torch.Generator().manual_seed(0)
        at = torch.randn(M, K, generator=g)
        bt = torch.randn(K, N, generator=g)
        if f16:
            at, bt = at.half(), bt.half()
        a_np = at.numpy().view(np.uint16 if f16 else np.float32)
        b_np = (bt.t().contiguous() if args.nk else bt).numpy().view(np.uint16 if f16 else np.float32)
        mf = cl.mem_flags
        a_buf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(a_np))
        b_buf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(b_np))
        y_buf = cl.Buffer(ctx, mf.READ_WRITE, M * N * 4)
        ac, bc = at.cuda(), bt.cuda()
        torch.backends.cuda.matmul.allow_tf32 = False
        ref = (ac.float() @ bc.float()).cpu().numpy()
        torch.backends.cuda.matmul.allow_tf32 = not f16
        # cuBLAS fp16 / tf32
        for _ in range(3):
            ac @ bc
        torch.cuda.synchronize()
        ts = []
        for _ in range(args.iters):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            ac @ bc
            e.record()
            torch.cuda.synchronize()
            ts.append(s.elapsed_time(e))
        t_cublas = statistics.median(ts)
        flop = 2.0 * M * N * K
        best = None
        for cfg, prg in progs.items():
            TM, TN = cfg[0], cfg[1]
            args_ = (a_buf, b_buf, y_buf, np.int32(M), np.int32(N), np.int32(K))
            gsz = (-(-N // TN) * 32 * cfg[3] * cfg[4], -(-M // TM))
            knl = cl.Kernel(prg, "gemm_f16")
            lsz = (32 * cfg[3] * cfg[4], 1)
            try:
                for _ in range(3):
                    knl(q, gsz, lsz, *args_)
                q.finish()
            except cl.Error as e:
                print("launch failed", cfg, e)
                continue
            y = np.empty((M, N), np.float32)
            cl.enqueue_copy(q, y, y_buf)
            err = float(np.linalg.norm(y - ref) / np.linalg.norm(ref))
            ts = []
            for _ in range(args.iters):
                ev = knl(q, gsz, lsz, *args_)
                ev.wait()
                ts.append((ev.profile.end - ev.profile.start) * 1e-6)
            t = statistics.median(ts)
            rows.append((f"{M}x{N}x{K}", cfg, t, flop / t * 1e-9, flop / t_cublas * 1e-9, t_cublas / t, err))
            if best is None or t < best[0]:
                best = (t, cfg)
        print(f"{M}x{N}x{K}: best {best}", flush=True)
    print(f"\n| product | tile (TM TN TK WM WN ST GM) | dlnet ms | dlnet TFLOP/s | cuBLAS {args.mode} TFLOP/s | ratio | rel err |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {' '.join(map(str, r[1]))} | {r[2]:.3f} | {r[3]:.0f} | {r[4]:.0f} | {r[5]:.2f} | {r[6]:.1e} |")


if __name__ == "__main__":
    main()
