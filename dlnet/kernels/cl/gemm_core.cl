// Tiled, register-blocked GEMM body shared by every matrix-shaped kernel (conv as implicit GEMM, gemm, matmul).
// The including file defines: KERNEL_NAME, KERNEL_ARGS, PROLOGUE (sets M, NN, KK from get_group_id(2)),
// LOAD_A(m,k), LOAD_B(k,n) and STORE(m,n,v). Tile sizes come as defines; one table per device picks them.
#if !defined(TM) || !defined(TN) || !defined(TK) || !defined(WM) || !defined(WN)
#error "gemm_core.cl needs TM TN TK WM WN"
#endif
#if !defined(LOAD_A) || !defined(LOAD_B) || !defined(STORE) || !defined(PROLOGUE)
#error "gemm_core.cl needs LOAD_A LOAD_B STORE PROLOGUE"
#endif
#ifndef SPLITS
#define SPLITS 1
#endif
// Split-K (for grids too small to fill the device): group z = batch index * SPLITS + slice of K; each slice writes
// raw partial sums to ws, and KERNEL_NAME_reduce (below) adds them and applies the epilogue.
#define ZID (get_group_id(2) / SPLITS)
#define NT_M (TM / WM)
#define NT_N (TN / WN)
#define NTHREADS (NT_M * NT_N)

__kernel __attribute__((reqd_work_group_size(NTHREADS, 1, 1)))
void KERNEL_NAME(KERNEL_ARGS, __global float* ws) {
    PROLOGUE
    const int tid = get_local_id(0);
    const int tm = tid / NT_N;
    const int tn = tid % NT_N;
    const int m0 = get_group_id(1) * TM;
    const int n0 = get_group_id(0) * TN;
    __local float As[TK][TM + 1];
    __local float Bs[TK][TN];
    float acc[WM][WN];
    for (int i = 0; i < WM; i++)
        for (int j = 0; j < WN; j++)
            acc[i][j] = 0.0f;
    const int kslice = get_group_id(2) % SPLITS;
    const int kchunk = (KK + SPLITS * TK - 1) / (SPLITS * TK) * TK;
    const int kbeg = kslice * kchunk, kend = min(KK, kbeg + kchunk);
    for (int k0 = kbeg; k0 < kend; k0 += TK) {
        for (int e = tid; e < TK * TM; e += NTHREADS) {
            const int kk = e % TK, mm = e / TK;
            const int m = m0 + mm, k = k0 + kk;
            As[kk][mm] = (m < M && k < kend) ? (float)(LOAD_A(m, k)) : 0.0f;
        }
        for (int e = tid; e < TK * TN; e += NTHREADS) {
            const int kk = e / TN, nn = e % TN;
            const int n = n0 + nn, k = k0 + kk;
            Bs[kk][nn] = (n < NN && k < kend) ? (float)(LOAD_B(k, n)) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < TK; kk++) {
            float areg_[WM], breg_[WN];
            for (int i = 0; i < WM; i++) areg_[i] = As[kk][tm + i * NT_M];
            for (int j = 0; j < WN; j++) breg_[j] = Bs[kk][tn + j * NT_N];
            for (int i = 0; i < WM; i++)
                for (int j = 0; j < WN; j++)
                    acc[i][j] = fma(areg_[i], breg_[j], acc[i][j]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (int i = 0; i < WM; i++) {
        const int m = m0 + tm + i * NT_M;
        if (m >= M) continue;
        for (int j = 0; j < WN; j++) {
            const int n = n0 + tn + j * NT_N;
            if (n >= NN) continue;
#if SPLITS > 1
            ws[((long)get_group_id(2) * M + m) * NN + n] = acc[i][j];
#else
            STORE(m, n, acc[i][j]);
#endif
        }
    }
}

#if SPLITS > 1
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#undef ZID
#define ZID get_group_id(2)  // the reduce grid has one z per batch index
__kernel void CAT(KERNEL_NAME, _reduce)(KERNEL_ARGS, __global float* ws) {
    PROLOGUE
    const int n = get_global_id(0), m = get_global_id(1);
    if (n >= NN || m >= M) return;
    float v = 0.0f;
    for (int s = 0; s < SPLITS; s++) v += ws[(((long)ZID * SPLITS + s) * M + m) * NN + n];
    STORE(m, n, v);
}
#endif
