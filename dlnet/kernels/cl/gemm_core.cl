// Tiled, register-blocked GEMM body shared by every matrix-shaped kernel on GPUs (conv as implicit GEMM, gemm,
// matmul, conv gradients). Plain OpenCL C: it is the portable path on every GPU, and the fp32 path on NVIDIA.
// The including file defines (then gemm_fetch.cl comes first): KERNEL_NAME, KERNEL_ARGS, PROLOGUE (sets M, NN, KK from get_group_id(2)),
// LOAD_A(m,k), LOAD_B(k,n) and STORE(m,n,v) (or STORE_COLUMN(n) then STORE_IN_COLUMN(m,v), per column of outputs);
// optionally A_ALONG_M / B_ALONG_K when A is contiguous along m or B
// along k (which element each work-item fetches, so that neighbours read neighbours). Tile sizes come as defines;
// one table per device picks them.
//
// Work-group: NT_M x NT_N work-items, each owning WM x WN outputs in groups of 4 rows / 4 columns read from the
// __local tiles as float4. Tiles are double-buffered: the next TK slice is fetched into registers while the
// current one is multiplied, then stored into the other buffer, one barrier per slice. STAGES (NVIDIA only: inline
// PTX): a cp.async pipeline of STAGES buffers instead.
#if !defined(TM) || !defined(TN) || !defined(TK) || !defined(WM) || !defined(WN)
#error "gemm_core.cl needs TM TN TK WM WN"
#endif
#define NT_M (TM / WM)
#define NT_N (TN / WN)
#define NTHREADS (NT_M * NT_N)
#if (TK * TM) % NTHREADS || (TK * TN) % NTHREADS
#error "gemm_core.cl: the A and B tiles must divide evenly among the work-items"
#endif
#if NTHREADS % TN
#error "gemm_core.cl: the work-items must be a multiple of TN (gemm_fetch.cl)"
#endif
#if defined(A_VEC) || ((defined(B_VEC) || defined(B_CVEC)) && (TK * TN / 4) % NTHREADS)
#error "gemm_core.cl: A_VEC does not fit its k-major A tile; B_VEC needs TK * TN / 4 to divide among the work-items"
#endif
#if WM % 4 == 0
#define VM 4
#else
#define VM 1
#endif
#if WN % 4 == 0
#define VN 4
#else
#define VN 1
#endif
#define PAD_A 4

__kernel __attribute__((reqd_work_group_size(NTHREADS, 1, 1)))
void KERNEL_NAME(KERNEL_ARGS, __global float* ws, ulong ws_off) {
    ws += ws_off;
    PROLOGUE
    const int tid = get_local_id(0);
#if NT_N % 8 == 0 && NT_M % 4 == 0 && NTHREADS % 32 == 0
    // a warp of 32 covers 4 x 8 work-items: its reads of the A and B tiles are 4 and 8 distinct vectors
    const int warp = tid / 32, lane = tid % 32;
    const int tn = (warp % (NT_N / 8)) * 8 + lane % 8;
    const int tm = (warp / (NT_N / 8)) * 4 + lane / 8;
#else
    const int tm = tid / NT_N;
    const int tn = tid % NT_N;
#endif
    const int m0 = get_group_id(1) * TM;
    const int n0 = get_group_id(0) * TN;
#if defined(STAGES)
    __local float As[STAGES][TK][TM + PAD_A] __attribute__((aligned(16)));
    __local float Bs[STAGES][TK][TN] __attribute__((aligned(16)));
#else
    __local float As[2][TK][TM + PAD_A];
    __local float Bs[2][TK][TN];
#endif
    float acc[WM][WN];
    #pragma unroll
    for (int i = 0; i < WM; i++)
        #pragma unroll
        for (int j = 0; j < WN; j++)
            acc[i][j] = 0.0f;
    K_SLICE
    B_SETUP
    const int ntiles = kend > kbeg ? (kend - kbeg + TK - 1) / TK : 0;
#if defined(STAGES)
    // NVIDIA: the tiles come by cp.async (gemm_fetch.cl's ISSUE), STAGES - 1 slices ahead, with no registers held
    // for them; the commit / wait / barrier protocol of gemm_mma.cl
#define AS_AT(buf, m, k) As[buf][k][m]
#define BS_AT(buf, k, n) Bs[buf][k][n]
    #pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < ntiles) ISSUE(s, kbeg + s * TK)
        CP_COMMIT();
    }
#else
    // the next slice is fetched into registers while the current one is multiplied
    float ra[LA], rb[LB];
#define STASH(buf) \
    for (int l = 0; l < LA; l++) { \
        const int e = tid + l * NTHREADS; As[buf][A_KK(e)][A_MM(e)] = ra[l]; } \
    for (int l = 0; l < LB; l++) { \
        const int e = tid + l * NTHREADS; Bs[buf][B_KK(e)][B_NN(e)] = rb[l]; }
    if (ntiles) {
        FETCH(kbeg)
        STASH(0)
    }
    barrier(CLK_LOCAL_MEM_FENCE);
#endif
    for (int t = 0; t < ntiles; t++) {
#if defined(STAGES)
        CP_WAIT(STAGES - 2);
        barrier(CLK_LOCAL_MEM_FENCE);
        const int tq = t + STAGES - 1;
        if (tq < ntiles) ISSUE(tq % STAGES, kbeg + tq * TK)
        CP_COMMIT();
        const int buf = t % STAGES;
#else
        const int buf = t & 1;
        const bool more = t + 1 < ntiles;
        if (more) {
            FETCH(kbeg + (t + 1) * TK)
        }
#endif
        #pragma unroll
        for (int kk = 0; kk < TK; kk++) {
            float a_[WM], b_[WN];
            #pragma unroll
            for (int i = 0; i < WM / VM; i++) {
#if VM == 4
                const float4 v = *(__local const float4*)&As[buf][kk][i * NT_M * 4 + tm * 4];
                a_[4 * i] = v.x; a_[4 * i + 1] = v.y; a_[4 * i + 2] = v.z; a_[4 * i + 3] = v.w;
#else
                a_[i] = As[buf][kk][i * NT_M + tm];
#endif
            }
            #pragma unroll
            for (int j = 0; j < WN / VN; j++) {
#if VN == 4
                const float4 v = *(__local const float4*)&Bs[buf][kk][j * NT_N * 4 + tn * 4];
                b_[4 * j] = v.x; b_[4 * j + 1] = v.y; b_[4 * j + 2] = v.z; b_[4 * j + 3] = v.w;
#else
                b_[j] = Bs[buf][kk][j * NT_N + tn];
#endif
            }
            #pragma unroll
            for (int i = 0; i < WM; i++)
                #pragma unroll
                for (int j = 0; j < WN; j++)
                    acc[i][j] = fma(a_[i], b_[j], acc[i][j]);
        }
#if !defined(STAGES)
        if (more) {
            STASH(buf ^ 1)
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
    }
#if defined(STORE_COLUMN) && SPLITS == 1
    // the including file works out once per column what its stores need (a convolution: image and pixel of n)
    #pragma unroll
    for (int j = 0; j < WN; j++) {
        const int n = n0 + (j / VN) * NT_N * VN + tn * VN + j % VN;
        if (n >= NN) continue;
        STORE_COLUMN(n)
        EPI_T e_[WM];  // the column's loads, then its stores (gemm_fetch.cl's STORE_PRE)
        #pragma unroll
        for (int i = 0; i < WM; i++) {
            const int m = m0 + (i / VM) * NT_M * VM + tm * VM + i % VM;
            if (m < M) e_[i] = STORE_PRE_IN_COLUMN(m);
        }
        #pragma unroll
        for (int i = 0; i < WM; i++) {
            const int m = m0 + (i / VM) * NT_M * VM + tm * VM + i % VM;
            if (m < M) STORE_WITH_IN_COLUMN(m, acc[i][j], e_[i]);
        }
    }
#else
    #pragma unroll
    for (int i = 0; i < WM; i++) {
        const int m = m0 + (i / VM) * NT_M * VM + tm * VM + i % VM;
        if (m >= M) continue;
#if SPLITS > 1
        #pragma unroll
        for (int j = 0; j < WN; j++) {
            const int n = n0 + (j / VN) * NT_N * VN + tn * VN + j % VN;
            if (n < NN) ws[((long)get_group_id(2) * M + m) * NN + n] = acc[i][j];
        }
#else
        EPI_T e_[WN];  // the row's loads, then its stores (gemm_fetch.cl's STORE_PRE)
        #pragma unroll
        for (int j = 0; j < WN; j++) {
            const int n = n0 + (j / VN) * NT_N * VN + tn * VN + j % VN;
            if (n < NN) e_[j] = STORE_PRE(m, n);
        }
        #pragma unroll
        for (int j = 0; j < WN; j++) {
            const int n = n0 + (j / VN) * NT_N * VN + tn * VN + j % VN;
            if (n < NN) STORE_WITH(m, n, acc[i][j], e_[j]);
        }
#endif
    }
#endif
}
