// TF32 tensor-core GEMM body for NVIDIA GPUs (Context(precision="tf32")): the interface of gemm_core.cl (and
// gemm_fetch.cl before it), multiplied by inline PTX mma.sync.m16n8k8 instead of FMA. Inputs are rounded to tf32
// (cvt.rna) once, as they enter __local memory; products accumulate in fp32.
//
// Work-group: WARPS_M x WARPS_N warps; each warp owns a (16 MI) x (8 NI) block of the TM x TN tile. Fragment
// layout of m16n8k8 (PTX ISA), with g = lane / 4 (gid) and t = lane % 4 (tig): a0..a3 = A[g][t], A[g+8][t],
// A[g][t+4], A[g+8][t+4]; b0, b1 = B[t][g], B[t+4][g]; c0..c3 = C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]. The order of k inside one
// mma is free as long as A and B agree, so slot t holds k = 2t and slot t+4 holds k = 2t+1: (a0, a2) and (a1, a3)
// are then neighbours in the k-contiguous A tile and load as float2.
#if !defined(TM) || !defined(TN) || !defined(TK) || !defined(WARPS_M) || !defined(WARPS_N)
#error "gemm_mma.cl needs TM TN TK WARPS_M WARPS_N"
#endif
#define NTHREADS (32 * WARPS_M * WARPS_N)
#define MI (TM / (16 * WARPS_M))
#define NI (TN / (8 * WARPS_N))
#if (TK * TM) % NTHREADS || (TK * TN) % NTHREADS || TK % 8 || MI * 16 * WARPS_M != TM || NI * 8 * WARPS_N != TN
#error "gemm_mma.cl: tile sizes do not divide evenly"
#endif
#if NTHREADS % TN
#error "gemm_mma.cl: the work-items must be a multiple of TN (gemm_fetch.cl)"
#endif
#define PAD_AK 8  // As row stride TK + 8: the float2 fragment reads of each half-warp hit distinct banks
#define PAD_BN 4  // Bs row stride TN + 4: rows 2t and 2t+1 of the B fragments fall in distinct banks

inline float tf32_round(float x) {
    uint u;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(u) : "f"(x));
    return as_float(u);
}

#define MMA_TF32(d, a, b) \
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 " \
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};" \
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]) \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), \
                   "f"(d[0]), "f"(d[1]), "f"(d[2]), "f"(d[3]))

__kernel __attribute__((reqd_work_group_size(NTHREADS, 1, 1)))
void KERNEL_NAME(KERNEL_ARGS, __global float* ws, ulong ws_off) {
    ws += ws_off;
    PROLOGUE
    const int tid = get_local_id(0);
    const int warp = tid / 32, lane = tid % 32, gid = lane / 4, tig = lane % 4;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int m0 = get_group_id(1) * TM;
    const int n0 = get_group_id(0) * TN;
    __local float As[2][TM][TK + PAD_AK];
    __local float Bs[2][TK][TN + PAD_BN];
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
    float ra[LA], rb[LB];
#define STASH(buf) \
    for (int l = 0; l < LA; l++) { \
        const int e = tid + l * NTHREADS; As[buf][A_MM(e)][A_KK(e)] = tf32_round(ra[l]); } \
    for (int l = 0; l < LB; l++) { \
        const int e = tid + l * NTHREADS; Bs[buf][B_KK(e)][B_NN(e)] = tf32_round(rb[l]); }
    if (kbeg < kend) {
        FETCH(kbeg)
        STASH(0)
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    int buf = 0;
    for (int k0 = kbeg; k0 < kend; k0 += TK) {
        const bool more = k0 + TK < kend;
        if (more) {
            FETCH(k0 + TK)
        }
        #pragma unroll
        for (int kb = 0; kb < TK; kb += 8) {
            uint a[MI][4], b[NI][2];
            #pragma unroll
            for (int i = 0; i < MI; i++) {
                const int row = wm * MI * 16 + i * 16 + gid;
                const float2 lo = *(__local const float2*)&As[buf][row][kb + 2 * tig];
                const float2 hi = *(__local const float2*)&As[buf][row + 8][kb + 2 * tig];
                a[i][0] = as_uint(lo.x); a[i][2] = as_uint(lo.y);
                a[i][1] = as_uint(hi.x); a[i][3] = as_uint(hi.y);
            }
            #pragma unroll
            for (int j = 0; j < NI; j++) {
                const int col = wn * NI * 8 + j * 8 + gid;
                b[j][0] = as_uint(Bs[buf][kb + 2 * tig][col]);
                b[j][1] = as_uint(Bs[buf][kb + 2 * tig + 1][col]);
            }
            #pragma unroll
            for (int i = 0; i < MI; i++)
                #pragma unroll
                for (int j = 0; j < NI; j++)
                    MMA_TF32(acc[i][j], a[i], b[j]);
        }
        if (more) {
            STASH(buf ^ 1)
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        buf ^= 1;
    }
#if defined(STORE_COLUMN) && SPLITS == 1
    // per column of outputs, as gemm_core.cl: c0, c2 are column 2t of rows g, g + 8; c1, c3 column 2t + 1
    #pragma unroll
    for (int j = 0; j < NI; j++)
        #pragma unroll
        for (int c = 0; c < 2; c++) {
            const int n = n0 + wn * NI * 8 + j * 8 + 2 * tig + c;
            if (n >= NN) continue;
            STORE_COLUMN(n)
            #pragma unroll
            for (int i = 0; i < MI; i++)
                #pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int m = m0 + wm * MI * 16 + i * 16 + gid + r * 8;
                    if (m < M) STORE_IN_COLUMN(m, acc[i][j][2 * r + c]);
                }
        }
#else
    #pragma unroll
    for (int i = 0; i < MI; i++)
        #pragma unroll
        for (int j = 0; j < NI; j++)
            #pragma unroll
            for (int q = 0; q < 4; q++) {
                const int m = m0 + wm * MI * 16 + i * 16 + gid + (q >> 1) * 8;
                const int n = n0 + wn * NI * 8 + j * 8 + 2 * tig + (q & 1);
                if (m >= M || n >= NN) continue;
#if SPLITS > 1
                ws[((long)get_group_id(2) * M + m) * NN + n] = acc[i][j][q];
#else
                STORE(m, n, acc[i][j][q]);
#endif
            }
#endif
}
