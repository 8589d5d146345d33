// TF32 tensor-core GEMM body for NVIDIA GPUs (Context(precision="tf32")): the interface of gemm_core.cl (and
// gemm_fetch.cl before it), multiplied by inline PTX mma.sync.m16n8k8 instead of FMA; products accumulate in fp32.
//
// Work-group: WARPS_M x WARPS_N warps; each warp owns a (16 MI) x (8 NI) block of the TM x TN tile (mma_tf32.cl,
// which comes first, has the fragment layout, with g = gid and t = tig). The order of k inside one mma is free as long as A and B agree, so in each 16 of depth, thread t's slots t and
// t + 4 of the first mma take k = 4t, 4t + 1 and those of the second k = 4t + 2, 4t + 3: a row's four A values
// for both mma are one float4 in the k-contiguous A tile.
//
// Tiles come from global memory by cp.async (gemm_fetch.cl's ISSUE), STAGES - 1 slices of TK ahead, straight into
// __local memory (or through registers: below). A's rows are AS_STRIDE floats apart (16 mod 32: the float4 reads
// of 8 lanes hit 32 distinct banks). B's rows are TN floats. The columns of B are free to permute too, as long as the outputs follow: lane g's
// column of the warp's block j is column (j / 4) * 32 + 4 g + j % 4 of the warp's TN / WARPS_N, so a lane's B
// fragments at one k are NI / 4 float4 reads (not NI scalar ones); BS_SWZ moves each 4-float chunk of row k by
// 2 ((k / 4) % 4) chunks, so the rows 4t + s that the lanes of one 8-lane phase read fall in distinct banks.
// With A_MVEC (A contiguous along m: a weight gradient's activations, copied 16 bytes along m) A's tile is k-major
// too, TM floats a row, swizzled as B's, and its rows permuted as B's columns are: lane g's rows of the warp's
// fragment units u = 2 i + h (block i, rows g + 8 h) are row (u / 4) * 32 + 4 g + u % 4 of the warp's TM / WARPS_M
// (A_ROW), so a lane's A fragments at one k are MI / 2 float4 reads; the outputs' rows follow.
// With B_KVEC (B contiguous along k: a weight read [N, K] as stored) B's tile is n-major like A's, rows AS_STRIDE
// floats apart, its columns in order: a lane's B fragments at one k step pair are one float4 per block, as A's.
// Inputs are rounded to tf32 as a fragment is read (TF32_BITS).
//
// Epilogue: the accumulators go through __local memory (the pipeline's, once it is drained), so that the stores
// run along n, 32 consecutive columns per warp (a lane's own columns are 4 apart: stored straight from registers,
// every store touched 32 sectors).
//
// Without STAGES (precision "fp16": an operand stored in half, which cp.async cannot convert, half.without_copies),
// the tiles come through registers instead, as in gemm_core.cl: gemm_fetch.cl's FETCH (LOAD_A / LOAD_B, half loads
// included) reads the next slice while the current one is multiplied, then stores it into the other of two buffers.
// A half value is exact in tf32 (both keep 10 bits of mantissa), so these products are the f16 tensor-core ones.
#if !defined(STAGES)
#define REG_STAGED
#define STAGES 2
#endif
#if !defined(TM) || !defined(TN) || !defined(TK) || !defined(WARPS_M) || !defined(WARPS_N)
#error "gemm_mma.cl needs TM TN TK WARPS_M WARPS_N"
#endif
#define NTHREADS (32 * WARPS_M * WARPS_N)
#define MI (TM / (16 * WARPS_M))
#define NI (TN / (8 * WARPS_N))
#if (TK * TM) % (4 * NTHREADS) || (TK * TN) % (4 * NTHREADS) || TK % 16 || TN % 32 || \
    MI * 16 * WARPS_M != TM || NI * 8 * WARPS_N != TN
#error "gemm_mma.cl: tile sizes do not divide evenly"
#endif
#if NTHREADS % TN
#error "gemm_mma.cl: the work-items must be a multiple of TN (gemm_fetch.cl)"
#endif
#if NI % 4
#error "gemm_mma.cl: each warp needs a multiple of 32 columns"
#endif
#define BS_SWZ(k, n) ((n) ^ ((((k) >> 2) & 3) << 3))
#if defined(A_MVEC)
#if MI % 2 || TM % 32
#error "gemm_mma.cl: A_MVEC needs an even number of m16 blocks per warp and TM a multiple of 32"
#endif
#define AS_FLOATS (TK * TM)
#define AS_AT(buf, m, k) smem[(buf) * AS_FLOATS + (k) * TM + BS_SWZ(k, m)]
#define A_ROW(u, g) (wm * MI * 16 + ((u) >> 2) * 32 + 4 * (g) + ((u) & 3))
#else
#define AS_STRIDE (TK + (48 - TK % 32) % 32)
#define AS_FLOATS (TM * AS_STRIDE)
#define AS_AT(buf, m, k) smem[(buf) * AS_FLOATS + (m) * AS_STRIDE + (k)]
#define A_ROW(u, g) (wm * MI * 16 + ((u) >> 1) * 16 + ((u) & 1) * 8 + (g))
#endif
#define BK_STRIDE (TK + (48 - TK % 32) % 32)
#if defined(B_KVEC)
#define BS_FLOATS (TN * BK_STRIDE)
#else
#define BS_FLOATS (TK * TN)
#endif
#define PIPE_FLOATS (STAGES * (AS_FLOATS + BS_FLOATS))
#define CS_STRIDE (TN + 1)  // the epilogue's rows: lane (g, t) writes row g, column 8t + c, in distinct banks
#define SMEM_FLOATS (PIPE_FLOATS > TM * CS_STRIDE ? PIPE_FLOATS : TM * CS_STRIDE)
#if defined(B_KVEC)
#define BS_AT(buf, k, n) smem[STAGES * AS_FLOATS + (buf) * BS_FLOATS + (n) * BK_STRIDE + (k)]
#define B_COL(j, g) (wn * NI * 8 + (j) * 8 + (g))
#else
#define BS_AT(buf, k, n) smem[STAGES * AS_FLOATS + (buf) * BS_FLOATS + (k) * TN + BS_SWZ(k, n)]
// the tile column of lane g's block j (the fragment of B it reads, the outputs c0..c3 of lane 4 g' + t' follow it)
#define B_COL(j, g) (wn * NI * 8 + ((j) >> 2) * 32 + 4 * (g) + ((j) & 3))
#endif
__kernel __attribute__((reqd_work_group_size(NTHREADS, 1, 1)))
void KERNEL_NAME(KERNEL_ARGS, __global float* ws, ulong ws_off) {
    ws += ws_off;
    PROLOGUE
    const int tid = get_local_id(0);
    const int warp = tid / 32, lane = tid % 32, gid = lane / 4, tig = lane % 4;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int m0 = get_group_id(1) * TM;
    const int n0 = get_group_id(0) * TN;
    __local float smem[SMEM_FLOATS] __attribute__((aligned(16)));
#if defined(MMA_EMU)
    MMA_EMU_DECL  // (mma_emu.cl, tests)
#endif
    float acc[MI][NI][4];
    #pragma unroll
    for (int i = 0; i < MI; i++)
        #pragma unroll
        for (int j = 0; j < NI; j++)
            #pragma unroll
            for (int q = 0; q < 4; q++)
                acc[i][j][q] = 0.0f;
    K_SLICE
    B_SETUP
    // Every thread commits one group of copies per slice, empty or not, so wait_group STAGES - 2 always means
    // "slice t has landed"; the barrier after it publishes every thread's copies and retires the buffer that the
    // next copy overwrites (slice t - 1's).
    const int ntiles = kend > kbeg ? (kend - kbeg + TK - 1) / TK : 0;
#if defined(REG_STAGED)
    float ra[LA], rb[LB];
#define STASH(buf) \
    for (int l = 0; l < LA; l++) { \
        const int e = tid + l * NTHREADS; AS_AT(buf, A_MM(e), A_KK(e)) = ra[l]; } \
    for (int l = 0; l < LB; l++) { \
        const int e = tid + l * NTHREADS; BS_AT(buf, B_KK(e), B_NN(e)) = rb[l]; }
    if (ntiles) {
        FETCH(kbeg)
        STASH(0)
    }
    barrier(CLK_LOCAL_MEM_FENCE);
#else
    #pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < ntiles) ISSUE(s, kbeg + s * TK)
        CP_COMMIT();
    }
#endif
    for (int t = 0; t < ntiles; t++) {
#if defined(REG_STAGED)
        const int buf = t & 1;
        const bool more = t + 1 < ntiles;
        if (more) {
            FETCH(kbeg + (t + 1) * TK)
        }
#else
        CP_WAIT(STAGES - 2);
        barrier(CLK_LOCAL_MEM_FENCE);
        const int tn = t + STAGES - 1;
        if (tn < ntiles) ISSUE(tn % STAGES, kbeg + tn * TK)
        CP_COMMIT();
        const int buf = t % STAGES;
#endif
        #pragma unroll
        for (int kq = 0; kq < TK; kq += 16) {
            uint a[2][MI][4], b[2][NI][2];
#if defined(A_MVEC)
            #pragma unroll
            for (int s = 0; s < 4; s++)
                #pragma unroll
                for (int i = 0; i < MI; i += 2) {
                    const float4 v = *(__local const float4*)&AS_AT(buf, A_ROW(2 * i, gid), kq + 4 * tig + s);
                    a[s >> 1][i][2 * (s & 1)] = TF32_IN(v.x); a[s >> 1][i][2 * (s & 1) + 1] = TF32_IN(v.y);
                    a[s >> 1][i + 1][2 * (s & 1)] = TF32_IN(v.z); a[s >> 1][i + 1][2 * (s & 1) + 1] = TF32_IN(v.w);
                }
#else
            #pragma unroll
            for (int i = 0; i < MI; i++) {
                const int row = wm * MI * 16 + i * 16 + gid;
                const float4 lo = *(__local const float4*)&AS_AT(buf, row, kq + 4 * tig);
                const float4 hi = *(__local const float4*)&AS_AT(buf, row + 8, kq + 4 * tig);
                a[0][i][0] = TF32_IN(lo.x); a[0][i][1] = TF32_IN(hi.x);
                a[0][i][2] = TF32_IN(lo.y); a[0][i][3] = TF32_IN(hi.y);
                a[1][i][0] = TF32_IN(lo.z); a[1][i][1] = TF32_IN(hi.z);
                a[1][i][2] = TF32_IN(lo.w); a[1][i][3] = TF32_IN(hi.w);
            }
#endif
#if defined(B_KVEC)
            #pragma unroll
            for (int j = 0; j < NI; j++) {
                const float4 v = *(__local const float4*)&BS_AT(buf, kq + 4 * tig, B_COL(j, gid));
                b[0][j][0] = TF32_IN(v.x); b[0][j][1] = TF32_IN(v.y);
                b[1][j][0] = TF32_IN(v.z); b[1][j][1] = TF32_IN(v.w);
            }
#else
            #pragma unroll
            for (int s = 0; s < 4; s++)
                #pragma unroll
                for (int jq = 0; jq < NI; jq += 4) {
                    const float4 v = *(__local const float4*)&BS_AT(buf, kq + 4 * tig + s, B_COL(jq, gid));
                    b[s >> 1][jq][s & 1] = TF32_IN(v.x); b[s >> 1][jq + 1][s & 1] = TF32_IN(v.y);
                    b[s >> 1][jq + 2][s & 1] = TF32_IN(v.z); b[s >> 1][jq + 3][s & 1] = TF32_IN(v.w);
                }
#endif
#if defined(TF32X3)
            // (mma_tf32.cl) the six mma of both k steps of one block into one sum where the registers hold both steps'
            // split fragments (MI NI <= 16), else the three of each k step
#if MI * NI <= 16
            uint alo[2][MI][4], blo[2][NI][2];
            TF32_SPLIT_FRAGS(a[0], b[0], alo[0], blo[0])
            TF32_SPLIT_FRAGS(a[1], b[1], alo[1], blo[1])
            #pragma unroll
            for (int i = 0; i < MI; i++)
                #pragma unroll
                for (int j = 0; j < NI; j++) {
                    float t_[4];
                    MMA_TF32X3(t_, a[0][i], alo[0][i], b[0][j], blo[0][j], 1)
                    MMA_TF32X3(t_, a[1][i], alo[1][i], b[1][j], blo[1][j], 0)
                    TF32X3_ADD(acc[i][j], t_)
                }
#else
            #pragma unroll
            for (int h = 0; h < 2; h++) {
                uint alo[MI][4], blo[NI][2];
                TF32_SPLIT_FRAGS(a[h], b[h], alo, blo)
                #pragma unroll
                for (int i = 0; i < MI; i++)
                    #pragma unroll
                    for (int j = 0; j < NI; j++) {
                        float t_[4];
                        MMA_TF32X3(t_, a[h][i], alo[i], b[h][j], blo[j], 1)
                        TF32X3_ADD(acc[i][j], t_)
                    }
            }
#endif
#else
            #pragma unroll
            for (int h = 0; h < 2; h++)
                #pragma unroll
                for (int i = 0; i < MI; i++)
                    #pragma unroll
                    for (int j = 0; j < NI; j++)
                        MMA_TF32(acc[i][j], a[h][i], b[h][j]);
#endif
        }
#if defined(REG_STAGED)
        if (more) {
            STASH(buf ^ 1)
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
    }
    // Every copy has landed and every warp is past its last fragment read before the tile is overwritten. (Without
    // the wait, split-K's products came out wrong now and then: copies were still landing here.)
#if !defined(REG_STAGED)
    CP_WAIT(0);
#endif
    barrier(CLK_LOCAL_MEM_FENCE);
    #pragma unroll
    for (int i = 0; i < MI; i++)
        #pragma unroll
        for (int j = 0; j < NI; j++)
            #pragma unroll
            for (int q = 0; q < 4; q++)
                smem[A_ROW(2 * i + (q >> 1), gid) * CS_STRIDE + B_COL(j, 2 * tig + (q & 1))] =
                    acc[i][j][q];
    barrier(CLK_LOCAL_MEM_FENCE);
    // one column per work-item, NTHREADS / TN rows apart, in blocks of EPI_ROWS rows: their loads, then their stores
    const int cn = tid % TN, n = n0 + cn;
    if (n >= NN) return;
#define RSTEP (NTHREADS / TN)
#if SPLITS > 1
    for (int r = tid / TN; r < TM && m0 + r < M; r += RSTEP)
        ws[((long)get_group_id(2) * M + m0 + r) * NN + n] = smem[r * CS_STRIDE + cn];
#else
#ifndef EPI_ROWS
#define EPI_ROWS 16
#endif
#if defined(STORE_COLUMN)
    STORE_COLUMN(n)
#define EPI_PRE(m) STORE_PRE_IN_COLUMN(m)
#define EPI_PUT(m, v, e) STORE_WITH_IN_COLUMN(m, v, e)
#else
#define EPI_PRE(m) STORE_PRE(m, n)
#define EPI_PUT(m, v, e) STORE_WITH(m, n, v, e)
#endif
    for (int r0 = tid / TN; r0 < TM && m0 + r0 < M; r0 += EPI_ROWS * RSTEP) {
        EPI_T e_[EPI_ROWS];
        #pragma unroll
        for (int u = 0; u < EPI_ROWS; u++) {
            const int r = r0 + u * RSTEP;
            if (r < TM && m0 + r < M) e_[u] = EPI_PRE(m0 + r);
        }
        #pragma unroll
        for (int u = 0; u < EPI_ROWS; u++) {
            const int r = r0 + u * RSTEP;
            if (r < TM && m0 + r < M) EPI_PUT(m0 + r, smem[r * CS_STRIDE + cn], e_[u]);
        }
    }
#endif
}
