"""Probe: a Hopper wgmma GEMM from OpenCL. NVIDIA's OpenCL C compiler targets sm_90, where ptxas rejects wgmma, but
the driver builds sm_90a PTX handed to it as a program binary (bench/probes/ptx_sm90a.py). So the kernel is written
in OpenCL C with each wgmma instruction inside a PTX comment of its inline asm (the compiler wires its operands and
keeps the accumulators in registers), built once, and its PTX is uncommented, retargeted to sm_90a and built again
from the binary. A and B half (--mode tf32: float32, which wgmma reads as tf32, truncating; ROUND_TF32 rounds A
(ROUND_B: B too; else B is rounded on the host, as dlnet rounds weights at load) to nearest in shared memory first, =1
before each slice's products, =2 the next slice while this one's run), both K-major (A [M][K], B [N][K]),
fp32 accumulation and output; tiles come by 16-byte cp.async into shared memory in wgmma's K-major layout (SW128: the
128-byte swizzle, rows of 128 bytes; else 8 x 16-byte core matrices), STAGES deep; WG warpgroups per work-group,
each 64 x WGM rows of the TM x TN tile. Checks against torch's fp32 product, times against cuBLAS (fp16, or TF32) in
the same process. Asserts nothing.

    python3 bench/probes/wgmma_gemm.py [--mode f16|tf32] [--sizes 4096,3152x3072x768]
                                       [--configs TM,TN,TK,STAGES,WG[,DEF[=V]...];...] [--ptx DIR]
"""
import argparse
import os
import statistics

import numpy as np
import pyopencl as cl

KERNEL = r"""
#define CORE 128                     // bytes of a core matrix (8 rows x 16 bytes)
#define CE (16 / EB)                 // elements a 16-byte chunk (EB: bytes an element, 2 f16 or 4 tf32)
#define CPR (TK * EB / 16)           // chunks a row of a slice
#define A_BYTES (TM * TK * EB)
#define B_BYTES (TN * TK * EB)
#define STAGE_BYTES (A_BYTES + B_BYTES)
#define CP16(dst, src, nbytes) \
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(nbytes) : "memory")
#define STR_(x) #x
#define STR(x) STR_(x)
#if defined(SW128)
// 128-byte swizzle (TK 64: a row's 64 halves are one 128-byte line): row r at r * 128, its 16-byte chunk kc at
// chunk kc ^ (r % 8); 8-row groups 1024 bytes apart; a k16 step 32 bytes further along the line
#if TK * EB != 128
#error "SW128 needs rows of 128 bytes (TK 64 in f16, 32 in tf32)"
#endif
#define SBO 1024
#define TILE_OFF(r, kc) ((r) * 128 + (((kc) ^ ((r) & 7)) << 4))
#define KSTEP_OFF(s) ((s) * 32)
inline ulong desc(uint addr) {
    return (ulong)((addr & 0x3FFFF) >> 4) | (1ul << 16) | ((ulong)(SBO >> 4) << 32) | (1ul << 62);
}
#else
// no swizzle: 8 x 16-byte core matrices; a row group's TK / 8 of them along k, then the next row group
#define SBO (TK * EB * 8)
#define TILE_OFF(r, kc) (((r) >> 3) * SBO + (kc) * CORE + ((r) & 7) * 16)
#define KSTEP_OFF(s) ((s) * 2 * CORE)
inline ulong desc(uint addr) {
    return (ulong)((addr & 0x3FFFF) >> 4) | ((ulong)(CORE >> 4) << 16) | ((ulong)(SBO >> 4) << 32);
}
#endif
#define NT (128 * WG)
// chunk c (16 bytes) of A's TM rows and B's TN rows of slice k0 into stage st, a row's chunks from consecutive
// threads; WHOLE: every row and chunk inside the product (no checks)
#define ISSUE_ROWS(ROWS, base, p, r0, R, WHOLE) \
    for (int c = tid; c < ROWS * CPR; c += NT) { \
        const int r = c / CPR, kc = c % CPR, row = r0 + r, k = k0 + kc * CE; \
        if (WHOLE) CP16(st + (base) + TILE_OFF(r, kc), p + (long)row * K + k, 16); \
        else CP16(st + (base) + TILE_OFF(r, kc), p + (long)min(row, R - 1) * K + min(k, K - CE), \
                  (row < R && k < K) ? min(16, EB * (K - k)) : 0); }
#if defined(ROUND_TF32)
// tf32 rounded to nearest, as dlnet's mma.sync cores round (wgmma drops the low 13 bits of each float it reads): half
// a tf32 unit added to every float this work-item copied into the stage at byte offset `so` (its own copies landed)
#define ROUND_ROWS(ROWS, so) \
    for (int c = tid; c < ROWS * CPR; c += NT) { \
        __local uint4* p_ = (__local uint4*)((__local char*)smem + (so) + TILE_OFF(c / CPR, c % CPR)); \
        *p_ += (uint4)(0x1000u); }
#if defined(ROUND_B)
#define ROUND_STAGE(so) { ROUND_ROWS(TM, so) ROUND_ROWS(TN, (so) + A_BYTES) }
#else  // (B rounded before: a weight, rounded once at load)
#define ROUND_STAGE(so) { ROUND_ROWS(TM, so) }
#endif
#else
#define ROUND_STAGE(so)
#endif
inline void issue(uint st, __global const ELEM* a, __global const ELEM* b, int m0, int n0, int k0, int M, int N,
                  int K, int tid) {
    if (m0 + TM <= M && n0 + TN <= N && k0 + TK <= K) {
        ISSUE_ROWS(TM, 0, a, m0, M, 1)
        ISSUE_ROWS(TN, A_BYTES, b, n0, N, 1)
    } else {
        ISSUE_ROWS(TM, 0, a, m0, M, 0)
        ISSUE_ROWS(TN, A_BYTES, b, n0, N, 0)
    }
}

__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void wg_gemm(__global const ELEM* a, __global const ELEM* b, __global float* y, int M, int N, int K) {
    __local uint smem[STAGES * STAGE_BYTES / 4] __attribute__((aligned(1024)));
    const uint sbase = (uint)(ulong)smem;
    const int tid = get_local_id(0), wg = tid / 128;
#if defined(GROUP_M)
    // work-groups in runs of GROUP_M along m (a column of tiles shares B's panel in L2 while it is hot)
    const int gn_ = get_num_groups(0), gm_ = get_num_groups(1), pid_ = get_group_id(1) * gn_ + get_group_id(0);
    const int first_ = pid_ / (GROUP_M * gn_) * GROUP_M, rows_ = min(gm_ - first_, GROUP_M);
    const int m0 = (first_ + pid_ % (GROUP_M * gn_) % rows_) * TM, n0 = pid_ % (GROUP_M * gn_) / rows_ * TN;
#else
    const int m0 = get_group_id(1) * TM, n0 = get_group_id(0) * TN;
#endif
    float acc[WGM][TN / 2];
    #pragma unroll
    for (int i = 0; i < WGM; i++)
        #pragma unroll
        for (int j = 0; j < TN / 2; j++)
            acc[i][j] = 0.0f;
    const int ntiles = (K + TK - 1) / TK;
    // slices STAGES - 2 ahead: at slice tt the stage of slice tt - 2 is refilled, its wgmma known done (every
    // warpgroup waited for all but its last group before this slice's barrier)
    for (int s = 0; s < STAGES - 2; s++) {
        if (s < ntiles) issue(sbase + s * STAGE_BYTES, a, b, m0, n0, s * TK, M, N, K, tid);
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
#if ROUND_TF32 == 2
    // deferred: slice tt + 1 is rounded while slice tt's wgmma runs (slice 0 here)
    asm volatile("cp.async.wait_group " STR(STAGES) " - 3;" ::: "memory");
    ROUND_STAGE(0)
#endif
    for (int tt = 0; tt < ntiles; tt++) {
#if ROUND_TF32 != 2
        asm volatile("cp.async.wait_group " STR(STAGES) " - 3;" ::: "memory");
        { const uint so = (tt % STAGES) * STAGE_BYTES; ROUND_STAGE(so) }
#endif
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        barrier(CLK_LOCAL_MEM_FENCE);
        const int tn = tt + STAGES - 2;
        if (tn < ntiles) issue(sbase + (tn % STAGES) * STAGE_BYTES, a, b, m0, n0, tn * TK, M, N, K, tid);
        asm volatile("cp.async.commit_group;" ::: "memory");
        const uint st = sbase + (tt % STAGES) * STAGE_BYTES;
        asm volatile("// @WG wgmma.fence.sync.aligned;" ::: "memory");
        #pragma unroll
        for (int s = 0; s < TK * EB / 32; s++) {  // (a k step: 32 bytes of a row, k16 in f16, k8 in tf32)
            const ulong db = desc(st + A_BYTES + KSTEP_OFF(s));
            #pragma unroll
            for (int i = 0; i < WGM; i++) {
                const ulong da = desc(st + (wg * WGM + i) * 8 * SBO + KSTEP_OFF(s));
                WGMMA(acc[i], da, db);
            }
        }
        asm volatile("// @WG wgmma.commit_group.sync.aligned;" ::: "memory");
#if ROUND_TF32 == 2
        if (tt + 1 < ntiles) {
            asm volatile("cp.async.wait_group " STR(STAGES) " - 3;" ::: "memory");
            const uint so = ((tt + 1) % STAGES) * STAGE_BYTES;
            ROUND_STAGE(so)
        }
#endif
        asm volatile("// @WG wgmma.wait_group.sync.aligned 1;" ::: "memory");
    }
    asm volatile("// @WG wgmma.wait_group.sync.aligned 0;" ::: "memory");
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    // D fragments (m64nNk16, f32): warp w of the warpgroup rows 16 w + g (+ 8), n8 block j columns 8 j + 2 t (+ 1)
    const int w = tid % 128 / 32, l = tid % 32, g = l / 4, t = l % 4;
    #pragma unroll
    for (int i = 0; i < WGM; i++)
        #pragma unroll
        for (int j = 0; j < TN / 8; j++) {
            const int m = m0 + (wg * WGM + i) * 64 + w * 16 + g, n = n0 + j * 8 + 2 * t;
            if (n + 1 < N && N % 2 == 0) {  // (a pair: one 8-byte store)
                if (m < M) *(__global float2*)(y + (long)m * N + n) = (float2)(acc[i][4 * j], acc[i][4 * j + 1]);
                if (m + 8 < M)
                    *(__global float2*)(y + (long)(m + 8) * N + n) = (float2)(acc[i][4 * j + 2], acc[i][4 * j + 3]);
            } else if (n < N) {
                if (m < M) {
                    y[(long)m * N + n] = acc[i][4 * j];
                    if (n + 1 < N) y[(long)m * N + n + 1] = acc[i][4 * j + 1];
                }
                if (m + 8 < M) {
                    y[(long)(m + 8) * N + n] = acc[i][4 * j + 2];
                    if (n + 1 < N) y[(long)(m + 8) * N + n + 1] = acc[i][4 * j + 3];
                }
            }
        }
}
"""


def wgmma_macro(tn, tf32=False):
    """WGMMA(d, da, db): d += A B over one k step (k16 f16, k8 tf32), m64n<tn>, both K-major, in a PTX comment (@WG).
    tf32 takes no transpose immediates (K-major only); wgmma reads the floats as they are (truncated to tf32)."""
    nreg = tn // 2
    kind, tail = ("k8.f32.tf32.tf32", "p, 1, 1") if tf32 else ("k16.f32.f16.f16", "p, 1, 1, 0, 0")
    regs = ", ".join(f"%{i}" for i in range(nreg))
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(nreg))
    asm = (f"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{nreg + 2}, 0;\\n"
           f"// @WG wgmma.mma_async.sync.aligned.m64n{tn}{kind} {{{regs}}}, %{nreg}, %{nreg + 1}, {tail};\\n}}")
    return f'#define WGMMA(d, da, db) asm volatile("{asm}" : {outs} : "l"(da), "l"(db), "r"(1) : "memory")\n'


def build(ctx, dev, cfg, tf32=False, ptx_dir=""):
    TM, TN, TK, STAGES, WG = (int(v) for v in cfg[:5])
    defs = dict(TM=TM, TN=TN, TK=TK, STAGES=STAGES, WG=WG, WGM=TM // (64 * WG), EB=4 if tf32 else 2,
                ELEM="float" if tf32 else "ushort")
    defs.update(dict((kv + "=1").split("=")[:2] for kv in cfg[5:]))
    src = "".join(f"#define {k} {v}\n" for k, v in defs.items())
    src += wgmma_macro(TN, tf32) + KERNEL
    prg = cl.Program(ctx, src).build()
    ptx = prg.get_info(cl.program_info.BINARIES)[0].decode()
    n = ptx.count("// @WG ")
    ptx = ptx.replace("// @WG ", "").replace(".target sm_90,", ".target sm_90a,")
    if ptx_dir:  # (for ptxas -v / nvdisasm elsewhere)
        os.makedirs(ptx_dir, exist_ok=True)
        with open(os.path.join(ptx_dir, "_".join(cfg).replace("=", "") + ".ptx"), "w") as f:
            f.write(ptx)
    return cl.Program(ctx, [dev], [ptx.encode()]).build(), n


def main():
    import torch
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4096,8192,3152x3072x768,1000x1000x1000")
    ap.add_argument("--configs", default="", help="default: 128x256 and 128x128 tiles with SW128 and GROUP_M 8, TK 64 "
                                                   "(f16) or 32 (tf32), 4 and 3 stages")
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--ptx", default="", help="a folder for each config's sm_90a PTX")
    ap.add_argument("--mode", default="f16", choices=("f16", "tf32"),
                    help="tf32: A and B float32, m64nNk8 on tf32 (TK 32 for the 128-byte rows), against cuBLAS TF32")
    args = ap.parse_args()
    tf32 = args.mode == "tf32"
    tk = 32 if tf32 else 64
    rounds = ("", ",ROUND_TF32=1,ROUND_B", ",ROUND_TF32=1", ",ROUND_TF32=2", ",ROUND_TF32=2,ROUND_B") if tf32 else ("",)
    args.configs = args.configs or ";".join(f"{tile},{tk},{st},2,SW128,GROUP_M=8{r}" for tile in ("128,256", "128,128")
                                            for st in (4, 3) for r in rounds)
    plat = next(p for p in cl.get_platforms() if "NVIDIA" in p.name)
    dev = plat.get_devices()[0]
    ctx = cl.Context([dev])
    q = cl.CommandQueue(ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
    progs = {}
    for c in args.configs.split(";"):
        cfg = tuple(c.split(","))
        try:
            progs[cfg], n = build(ctx, dev, cfg, tf32, args.ptx)
            print(cfg, "built,", n, "wgmma lines uncommented", flush=True)
        except Exception as e:  # (a probe: say what the compiler said)
            print(cfg, "failed:", str(e)[:3000], flush=True)
    print(f"| M x N x K | TM TN TK STAGES WG | dlnet ms | TFLOP/s | cuBLAS {args.mode} TFLOP/s | ratio | rel err | "
          "cuBLAS rel err |")
    print("|---|---|---|---|---|---|---|---|")
    for size in args.sizes.split(","):
        M, N, K = (int(v) for v in size.split("x")) if "x" in size else (int(size),) * 3
        g = torch.Generator().manual_seed(0)
        at, bt = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)
        if not tf32:
            at, bt = at.half(), bt.half()
        else:  # (B as dlnet stores a weight for wgmma: rounded to nearest tf32 at load)
            bt = ((bt.view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)
        mf = cl.mem_flags
        a_buf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(at.numpy()))
        b_buf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(bt.numpy()))
        y_buf = cl.Buffer(ctx, mf.READ_WRITE, M * N * 4)
        ac, bc = at.cuda(), bt.cuda()
        torch.backends.cuda.matmul.allow_tf32 = False
        ref = (ac.double() @ bc.double().t()).float().cpu().numpy()
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for _ in range(3):
            ac @ bc.t()
        torch.cuda.synchronize()
        ts = []
        for _ in range(args.iters):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            ac @ bc.t()
            e.record()
            torch.cuda.synchronize()
            ts.append(s.elapsed_time(e))
        t_cublas = statistics.median(ts)
        yc = (ac @ bc.t()).float().cpu().numpy()
        err_cublas = float(np.linalg.norm(yc - ref) / np.linalg.norm(ref))
        flop = 2.0 * M * N * K
        for cfg, prg in progs.items():
            TM, TN = int(cfg[0]), int(cfg[1])
            knl = cl.Kernel(prg, "wg_gemm")
            gsz, lsz = (-(-N // TN) * 128 * int(cfg[4]), -(-M // TM)), (128 * int(cfg[4]), 1)
            args_ = (a_buf, b_buf, y_buf, np.int32(M), np.int32(N), np.int32(K))
            try:
                knl(q, gsz, lsz, *args_).wait()
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
            print(f"| {M}x{N}x{K} | {' '.join(map(str, cfg))} | {t:.3f} | {flop / t * 1e-9:.0f} | "
                  f"{flop / t_cublas * 1e-9:.0f} | {t_cublas / t:.2f} | {err:.1e} | {err_cublas:.1e} |", flush=True)


if __name__ == "__main__":
    main()
