// fp16 tensor-core GEMM core for NVIDIA GPUs (precision="fp16"): A and B stored as half, products by inline PTX
// mma.sync.m16n8k16 (f16 inputs, fp32 accumulation). Fragment layout (PTX ISA), with g = lane / 4, t = lane % 4,
// each register holding two halves adjacent along k: a0..a3 = A[g][2t..], A[g+8][2t..], A[g][2t+8..],
// A[g+8][2t+8..]; b0, b1 = B[2t..][g], B[2t+8..][g]; c0..c3 = C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1].
//
// Work-group: WARPS_M x WARPS_N warps; each warp owns a (16 MI) x (8 NI) block of the TM x TN tile. Tiles come from
// global memory by 16-byte cp.async (8 halves), STAGES - 1 slices of TK ahead, into __local memory; fragments leave
// it by ldmatrix (four 8 x 8 matrices a lane group at a time), so a k16 step of a warp is MI + NI / 2 ldmatrix for
// MI x NI mma. Rows of the tiles are padded by 8 halves (16 bytes): the eight 16-byte rows one ldmatrix phase reads
// then fall in distinct banks.
//   A is k-contiguous ([M][K] rows, sak = 1). B is [K][N] (n-contiguous, read with ldmatrix.trans) or, with B_NK,
//   [N][K] (k-contiguous: a weight stored transposed at upload).
// The including file gives KERNEL_NAME, KERNEL_ARGS, PROLOGUE (which points `a` and `b` at this product's ushort
// halves), PTR_A(m, k), PTR_B(k, n) and STORE2(m, n, v0, v1) (columns n and n + 1 of row m; n + 1 may be past NN,
// which STORE2 checks). M, NN, KK are the product's extents. Every row of A and B starts 16-byte aligned and KK
// (B_NK) or NN is a multiple of 8, so that a 16-byte copy is whole or empty.
#if !defined(TM) || !defined(TN) || !defined(TK) || !defined(WARPS_M) || !defined(WARPS_N) || !defined(STAGES)
#error "gemm_mma_f16.cl needs TM TN TK WARPS_M WARPS_N STAGES"
#endif
#define NTHREADS (32 * WARPS_M * WARPS_N)
#define MI (TM / (16 * WARPS_M))
#define NI (TN / (8 * WARPS_N))
#if MI * 16 * WARPS_M != TM || NI * 8 * WARPS_N != TN || NI % 2 || TK % 16 || (TM * TK / 8) % NTHREADS || \
    (TN * TK / 8) % NTHREADS
#error "gemm_mma_f16.cl: tile sizes do not divide evenly"
#endif
#define AS_STRIDE (TK + 8)
#if defined(B_NK)
#define BS_STRIDE (TK + 8)
#define BS_HALVES (TN * BS_STRIDE)
#else
#define BS_STRIDE (TN + 8)
#define BS_HALVES (TK * BS_STRIDE)
#endif
#define AS_HALVES (TM * AS_STRIDE)
#define STAGE_HALVES (AS_HALVES + BS_HALVES)

#define F16_CP16(dst, src, nbytes) \
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(nbytes) : "memory")
#define F16_COMMIT() asm volatile("cp.async.commit_group;" ::: "memory")
#define F16_STR_(x) #x
#define F16_STR(x) F16_STR_(x)
#define F16_WAIT(n) asm volatile("cp.async.wait_group " F16_STR(n) ";" ::: "memory")
#define LDSM_X4(r, addr) \
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];" \
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr))
#define LDSM_X4_T(r, addr) \
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];" \
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr))
#define MMA_F16(d, a, b0, b1) \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 " \
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};" \
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]) \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), \
                   "f"(d[0]), "f"(d[1]), "f"(d[2]), "f"(d[3]))
#define F16_BYTES(left) (clamp((left), 0, 8) * 2)

// One slice of TK: A's TM rows of TK halves, B's TK x TN (or TN x TK) halves, into stage `st`.
#if defined(B_NK)
#define F16_ISSUE_B(bs, k0) \
    for (int l = 0; l < TN * TK / 8 / NTHREADS; l++) { \
        const int c = tid + l * NTHREADS, nn = c / (TK / 8), kk = c % (TK / 8) * 8, n = n0 + nn; \
        F16_CP16((bs) + 2 * (nn * BS_STRIDE + kk), PTR_B((k0) + kk, min(n, NN - 1)), \
                 n < NN ? F16_BYTES(KK - (k0) - kk) : 0); }
#else
#define F16_ISSUE_B(bs, k0) \
    for (int l = 0; l < TN * TK / 8 / NTHREADS; l++) { \
        const int c = tid + l * NTHREADS, kk = c / (TN / 8), nn = c % (TN / 8) * 8, k = (k0) + kk; \
        F16_CP16((bs) + 2 * (kk * BS_STRIDE + nn), PTR_B(min(k, KK - 1), n0 + nn), \
                 k < KK ? F16_BYTES(NN - n0 - nn) : 0); }
#endif
#define F16_ISSUE(st, k0) { \
    const uint as_ = sbase + 2 * (st) * STAGE_HALVES, bs_ = as_ + 2 * AS_HALVES; \
    for (int l = 0; l < TM * TK / 8 / NTHREADS; l++) { \
        const int c = tid + l * NTHREADS, mm = c / (TK / 8), kk = c % (TK / 8) * 8, m = m0 + mm; \
        F16_CP16(as_ + 2 * (mm * AS_STRIDE + kk), PTR_A(min(m, M - 1), (k0) + kk), \
                 m < M ? F16_BYTES(KK - (k0) - kk) : 0); } \
    F16_ISSUE_B(bs_, k0) }

__kernel __attribute__((reqd_work_group_size(NTHREADS, 1, 1)))
void KERNEL_NAME(KERNEL_ARGS) {
    PROLOGUE
    const int tid = get_local_id(0);
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
#if defined(GROUP_M)
    // the work-groups in runs of GROUP_M along m (a column of tiles shares B's panel in L2 while it is hot)
    const int gn_ = get_num_groups(0), gm_ = get_num_groups(1), pid_ = get_group_id(1) * gn_ + get_group_id(0);
    const int first_ = pid_ / (GROUP_M * gn_) * GROUP_M, rows_ = min(gm_ - first_, GROUP_M);
    const int m0 = (first_ + pid_ % (GROUP_M * gn_) % rows_) * TM, n0 = pid_ % (GROUP_M * gn_) / rows_ * TN;
#else
    const int m0 = get_group_id(1) * TM, n0 = get_group_id(0) * TN;
#endif
    __local ushort smem[STAGES * STAGE_HALVES] __attribute__((aligned(16)));
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
        if (s < ntiles) F16_ISSUE(s, s * TK)
        F16_COMMIT();
    }
    // lane's ldmatrix row addresses (in halves, within a stage): A's row lane % 16 at k offset 8 (lane / 16);
    // B's per the layout (see the header)
    const int a_lane = (wm * MI * 16 + lane % 16) * AS_STRIDE + (lane / 16) * 8;
#if defined(B_NK)
    const int b_lane = (wn * NI * 8 + lane % 8 + (lane / 16) * 8) * BS_STRIDE + ((lane / 8) % 2) * 8;
#define B_STEP(jj, kq) ((jj) * 8 * BS_STRIDE + (kq))
#else
    const int b_lane = (lane % 8 + ((lane / 8) % 2) * 8) * BS_STRIDE + wn * NI * 8 + (lane / 16) * 8;
#define B_STEP(jj, kq) ((kq) * BS_STRIDE + (jj) * 8)
#endif
    for (int tt = 0; tt < ntiles; tt++) {
        F16_WAIT(STAGES - 2);
        barrier(CLK_LOCAL_MEM_FENCE);
        const int tn = tt + STAGES - 1;
        if (tn < ntiles) F16_ISSUE(tn % STAGES, tn * TK)
        F16_COMMIT();
        const uint as_ = sbase + 2 * (tt % STAGES) * STAGE_HALVES, bs_ = as_ + 2 * AS_HALVES;
        #pragma unroll
        for (int kq = 0; kq < TK; kq += 16) {
            uint a[MI][4], b[NI][2];
            #pragma unroll
            for (int i = 0; i < MI; i++)
                LDSM_X4(a[i], as_ + 2 * (a_lane + i * 16 * AS_STRIDE + kq));
            #pragma unroll
            for (int jj = 0; jj < NI; jj += 2) {
                uint r[4];
#if defined(B_NK)
                LDSM_X4(r, bs_ + 2 * (b_lane + B_STEP(jj, kq)));
#else
                LDSM_X4_T(r, bs_ + 2 * (b_lane + B_STEP(jj, kq)));
#endif
                b[jj][0] = r[0]; b[jj][1] = r[1]; b[jj + 1][0] = r[2]; b[jj + 1][1] = r[3];
            }
            #pragma unroll
            for (int i = 0; i < MI; i++)
                #pragma unroll
                for (int j = 0; j < NI; j++)
                    MMA_F16(acc[i][j], a[i], b[j][0], b[j][1]);
        }
    }
    F16_WAIT(0);
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
