// Tensor-core GEMM core for NVIDIA GPUs fed by ldmatrix: F16 (A and B stored as half, mma.sync m16n8k16) or TF32
// (A and B float, mma.sync m16n8k8 on tf32, inputs rounded to nearest as mma_tf32.cl does); fp32 accumulation.
// mma_tf32.cl comes first (MMA_F16, MMA_TF32, TF32_BITS), then ptx_lanes.cl (PTX_CP16, PTX_LDSM_X4).
// Fragment layouts (PTX ISA), g = lane / 4, t = lane % 4:
//   f16:  a0..a3 = A[g][2t..], A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..] (each register two halves along k);
//         b0, b1 = B[2t..][g], B[2t+8..][g]
//   tf32: a0..a3 = A[g][t], A[g+8][t], A[g][t+4], A[g+8][t+4]; b0, b1 = B[t][g], B[t+4][g]
//   both: c0..c3 = C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]
// In bytes the two are one layout: a k step of an mma is 32 bytes of a row (16 halves or 8 floats), and ldmatrix's
// 8 x 8 b16 matrices are 8 x 4 floats; so one kernel serves both, addressing its tiles in bytes.
//
// Work-group: WARPS_M x WARPS_N warps; each warp owns a (16 MI) x (8 NI) block of the TM x TN tile. Tiles come from
// global memory by 16-byte cp.async, STAGES - 1 slices of TK ahead, into __local memory, rows padded by 16 bytes (the
// eight 16-byte rows of one ldmatrix phase then fall in distinct banks); a k step of a warp is MI + NI / 2 ldmatrix
// for MI x NI mma.
//   A is k-contiguous ([M][K] rows), or with A_ALONG_M [K][M] (m-contiguous, read by ldmatrix.trans: F16 only; a
//   weight gradient's activations). B is [N][K] with B_NK (k-contiguous: a weight stored transposed at upload), or
//   [K][N] (n-contiguous, read by ldmatrix.trans: F16 only, as .trans moves 16-bit elements).
// The including file gives KERNEL_NAME, KERNEL_ARGS (or LDSM_ARGS, the whole list), PROLOGUE (pointing `a` and `b` at this product), PTR_A(m, k),
// PTR_B(k, n) and STORE2(m, n, v0, v1) (columns n and n + 1 of row m; n + 1 may be past NN, which STORE2 checks).
// M, NN, KK are the product's extents. Every row of A and B starts 16-byte aligned, and a row's length (KK, or NN
// for [K][N] B, M for [K][M] A) is a multiple of 16 bytes, so that a 16-byte copy is whole or empty.
#if !defined(TM) || !defined(TN) || !defined(TK) || !defined(WARPS_M) || !defined(WARPS_N) || !defined(STAGES)
#error "gemm_ldsm.cl needs TM TN TK WARPS_M WARPS_N STAGES"
#endif
#if defined(F16)
#define EB 2   // bytes an element
#define KSTEP 16
#elif defined(TF32)
#define EB 4
#define KSTEP 8
#if !defined(B_NK) || defined(A_ALONG_M)
#error "gemm_ldsm.cl: TF32 needs B_NK and A k-contiguous (ldmatrix cannot transpose 32-bit elements)"
#endif
#else
#error "gemm_ldsm.cl needs F16 or TF32"
#endif
#define CE (16 / EB)  // elements a 16-byte copy
#define NTHREADS (32 * WARPS_M * WARPS_N)
#define MI (TM / (16 * WARPS_M))
#define NI (TN / (8 * WARPS_N))
#if MI * 16 * WARPS_M != TM || NI * 8 * WARPS_N != TN || NI % 2 || TK % KSTEP || (TM * TK / CE) % NTHREADS || \
    (TN * TK / CE) % NTHREADS
#error "gemm_ldsm.cl: tile sizes do not divide evenly"
#endif
#if defined(A_ALONG_M)  // bytes a row of the tiles
#define AS_STRIDE (TM * EB + 16)
#define AS_BYTES (TK * AS_STRIDE)
#else
#define AS_STRIDE (TK * EB + 16)
#define AS_BYTES (TM * AS_STRIDE)
#endif
#if defined(B_NK)
#define BS_STRIDE (TK * EB + 16)
#define BS_BYTES (TN * BS_STRIDE)
#else
#define BS_STRIDE (TN * EB + 16)
#define BS_BYTES (TK * BS_STRIDE)
#endif
#define STAGE_BYTES (AS_BYTES + BS_BYTES)

// the products: mma_tf32.cl's MMA_F16 / MMA_TF32 (it comes first), tf32 inputs rounded as it rounds them
#if defined(F16)
#define MMA_STEP(d, a, b0, b1) MMA_F16(d, a, b0, b1)
#define ROUND(r)
#else
#define MMA_STEP(d, a, b0, b1) { const uint bb_[2] = {b0, b1}; MMA_TF32(d, a, bb_); }
#define ROUND(r) { r[0] = TF32_IN(as_float(r[0])); r[1] = TF32_IN(as_float(r[1])); \
                   r[2] = TF32_IN(as_float(r[2])); r[3] = TF32_IN(as_float(r[3])); }
#endif
#define LDSM_BYTES(left) (clamp((left), 0, CE) * EB)

#if defined(B_NK)
#define LDSM_ISSUE_B(bs, k0) \
    for (int l = 0; l < TN * TK / CE / NTHREADS; l++) { \
        const int c = tid + l * NTHREADS, nn = c / (TK / CE), kk = c % (TK / CE) * CE, n = n0 + nn; \
        PTX_CP16((bs) + nn * BS_STRIDE + kk * EB, PTR_B((k0) + kk, min(n, NN - 1)), \
                  n < NN ? LDSM_BYTES(KK - (k0) - kk) : 0); }
#else
#define LDSM_ISSUE_B(bs, k0) \
    for (int l = 0; l < TN * TK / CE / NTHREADS; l++) { \
        const int c = tid + l * NTHREADS, kk = c / (TN / CE), nn = c % (TN / CE) * CE, k = (k0) + kk; \
        PTX_CP16((bs) + kk * BS_STRIDE + nn * EB, PTR_B(min(k, KK - 1), n0 + nn), \
                  k < KK ? LDSM_BYTES(NN - n0 - nn) : 0); }
#endif
#if defined(A_ALONG_M)
#define LDSM_ISSUE_A(as, k0) \
    for (int l = 0; l < TM * TK / CE / NTHREADS; l++) { \
        const int c = tid + l * NTHREADS, kk = c / (TM / CE), mm = c % (TM / CE) * CE, k = (k0) + kk; \
        PTX_CP16((as) + kk * AS_STRIDE + mm * EB, PTR_A(m0 + mm, min(k, KK - 1)), \
                  k < KK ? LDSM_BYTES(M - m0 - mm) : 0); }
#else
#define LDSM_ISSUE_A(as, k0) \
    for (int l = 0; l < TM * TK / CE / NTHREADS; l++) { \
        const int c = tid + l * NTHREADS, mm = c / (TK / CE), kk = c % (TK / CE) * CE, m = m0 + mm; \
        PTX_CP16((as) + mm * AS_STRIDE + kk * EB, PTR_A(min(m, M - 1), (k0) + kk), \
                  m < M ? LDSM_BYTES(KK - (k0) - kk) : 0); }
#endif
// one slice of TK: A's TM rows and B's into stage `st`
#define LDSM_ISSUE(st, k0) { \
    const uint as_ = sbase + (st) * STAGE_BYTES, bs_ = as_ + AS_BYTES; \
    LDSM_ISSUE_A(as_, k0) \
    LDSM_ISSUE_B(bs_, k0) }

#ifndef LDSM_ARGS
#define LDSM_ARGS KERNEL_ARGS
#endif
__kernel __attribute__((reqd_work_group_size(NTHREADS, 1, 1)))
void KERNEL_NAME(LDSM_ARGS) {
    PROLOGUE
    const int tid = get_local_id(0);
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    TILE_ORIGIN(m0, n0)
    __local uint smem[STAGES * STAGE_BYTES / 4] __attribute__((aligned(16)));
    const uint sbase = (uint)(ulong)smem;
    float acc[MI][NI][4];
    #pragma unroll
    for (int i = 0; i < MI; i++)
        #pragma unroll
        for (int j = 0; j < NI; j++)
            #pragma unroll
            for (int q = 0; q < 4; q++)
                acc[i][j][q] = 0.0f;
    // Every thread commits one group per slice, empty or not, so wait_group STAGES - 2 means "slice t has landed";
    // the barrier after it publishes every thread's copies and retires the stage the next copy overwrites.
    const int ntiles = (KK + TK - 1) / TK;
    #pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < ntiles) LDSM_ISSUE(s, s * TK)
        PTX_COMMIT();
    }
    // a lane's ldmatrix row address within a stage, in bytes: A's row lane % 16 at k offset 16 bytes (lane / 16)
    // for [M][K] (k = lane % 8 + 8 (lane / 16) at m = 8 ((lane / 8) % 2) for [K][M]), giving a0..a3; B's rows as its
    // layout needs (n = lane % 8 + 8 (lane / 16) at k offset 16 bytes ((lane / 8) % 2) for [N][K]; k =
    // lane % 8 + 8 ((lane / 8) % 2) at n = 8 (lane / 16) for [K][N]), giving b0, b1 of two blocks of 8 columns
#if defined(A_ALONG_M)
    const uint a_lane = (lane % 8 + (lane / 16) * 8) * AS_STRIDE + (wm * MI * 16 + ((lane / 8) % 2) * 8) * EB;
#define A_STEP(i, kq) ((kq) * AS_STRIDE + (i) * 16 * EB)
#define LDSM_A(r, addr) PTX_LDSM_X4_T(r, addr)
#else
    const uint a_lane = (wm * MI * 16 + lane % 16) * AS_STRIDE + (lane / 16) * 16;
#define A_STEP(i, kq) ((i) * 16 * AS_STRIDE + (kq) * EB)
#define LDSM_A(r, addr) PTX_LDSM_X4(r, addr)
#endif
#if defined(B_NK)
    const uint b_lane = (wn * NI * 8 + lane % 8 + (lane / 16) * 8) * BS_STRIDE + ((lane / 8) % 2) * 16;
#define B_STEP(jj, kq) ((jj) * 8 * BS_STRIDE + (kq) * EB)
#else
    const uint b_lane = (lane % 8 + ((lane / 8) % 2) * 8) * BS_STRIDE + (wn * NI * 8 + (lane / 16) * 8) * EB;
#define B_STEP(jj, kq) ((kq) * BS_STRIDE + (jj) * 8 * EB)
#endif
#if defined(B_NK)
#define LDSM_B(r, addr) PTX_LDSM_X4(r, addr)
#else
#define LDSM_B(r, addr) PTX_LDSM_X4_T(r, addr)
#endif
// a warp's fragments of one k step (kq, in elements) of the stage at byte addresses as_, bs_
#define LDSM_FRAGS(a, b, as_, bs_, kq) { \
    _Pragma("unroll") for (int i = 0; i < MI; i++) { LDSM_A(a[i], (as_) + a_lane + A_STEP(i, kq)); ROUND(a[i]) } \
    _Pragma("unroll") for (int jj = 0; jj < NI; jj += 2) { \
        uint r[4]; \
        LDSM_B(r, (bs_) + b_lane + B_STEP(jj, kq)); \
        ROUND(r) \
        b[jj][0] = r[0]; b[jj][1] = r[1]; b[jj + 1][0] = r[2]; b[jj + 1][1] = r[3]; } }
#if defined(TF32X3)  // (mma_tf32.cl: three mma on the operands' tf32 halves)
#define LDSM_MMAS(a, b) { \
    uint alo_[MI][4], blo_[NI][2]; \
    TF32_SPLIT_FRAGS(a, b, alo_, blo_) \
    _Pragma("unroll") for (int i = 0; i < MI; i++) \
        _Pragma("unroll") for (int j = 0; j < NI; j++) { \
            float t_[4]; MMA_TF32X3(t_, a[i], alo_[i], b[j], blo_[j], 1) TF32X3_ADD(acc[i][j], t_) } }
#else
#define LDSM_MMAS(a, b) \
    _Pragma("unroll") for (int i = 0; i < MI; i++) \
        _Pragma("unroll") for (int j = 0; j < NI; j++) \
            MMA_STEP(acc[i][j], a[i], b[j][0], b[j][1]);
#endif
#define KQ (TK / KSTEP)
#if defined(LDSM_PIPE) && KQ % 2 == 0
    // fragments double-buffered: a k step's ldmatrix are issued before the previous step's mma; the next slice's
    // first fragments are loaded (after its wait and barrier) before the slice's last mma
    PTX_WAIT(STAGES - 2);
    barrier(CLK_LOCAL_MEM_FENCE);
    uint af[2][MI][4], bf[2][NI][2];
    LDSM_FRAGS(af[0], bf[0], sbase, sbase + AS_BYTES, 0)
    for (int tt = 0; tt < ntiles; tt++) {
        const int tn = tt + STAGES - 1;  // (into the stage read before the last barrier)
        if (tn < ntiles) LDSM_ISSUE(tn % STAGES, tn * TK)
        PTX_COMMIT();
        const uint as_ = sbase + (tt % STAGES) * STAGE_BYTES, bs_ = as_ + AS_BYTES;
        #pragma unroll
        for (int q = 0; q < KQ; q++) {
            if (q == KQ - 1) {
                PTX_WAIT(STAGES - 2);
                barrier(CLK_LOCAL_MEM_FENCE);
                if (tt + 1 < ntiles) {
                    const uint an = sbase + ((tt + 1) % STAGES) * STAGE_BYTES;
                    LDSM_FRAGS(af[(q + 1) % 2], bf[(q + 1) % 2], an, an + AS_BYTES, 0)
                }
            } else {
                LDSM_FRAGS(af[(q + 1) % 2], bf[(q + 1) % 2], as_, bs_, (q + 1) * KSTEP)
            }
            LDSM_MMAS(af[q % 2], bf[q % 2])
        }
    }
#else
    for (int tt = 0; tt < ntiles; tt++) {
        PTX_WAIT(STAGES - 2);
        barrier(CLK_LOCAL_MEM_FENCE);
        const int tn = tt + STAGES - 1;
        if (tn < ntiles) LDSM_ISSUE(tn % STAGES, tn * TK)
        PTX_COMMIT();
        const uint as_ = sbase + (tt % STAGES) * STAGE_BYTES, bs_ = as_ + AS_BYTES;
        #pragma unroll
        for (int kq = 0; kq < TK; kq += KSTEP) {
            uint a[MI][4], b[NI][2];
            LDSM_FRAGS(a, b, as_, bs_, kq)
            LDSM_MMAS(a, b)
        }
    }
#endif
    PTX_WAIT(0);
    #pragma unroll
    for (int i = 0; i < MI; i++) {
        const int m = m0 + wm * MI * 16 + i * 16 + g;
        #pragma unroll
        for (int j = 0; j < NI; j++) {
            const int n = n0 + wn * NI * 8 + j * 8 + 2 * t;
            if (n < NN) {
                if (m < M) STORE2(m, n, acc[i][j][0], acc[i][j][1]);
                if (m + 8 < M) STORE2(m + 8, n, acc[i][j][2], acc[i][j][3]);
            }
        }
    }
}
