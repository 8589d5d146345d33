// Skinny products whose B is stored row by row (B [K, N], its rows contiguous along n): what a fully connected
// layer's gradients are at a small batch, where B is a weight that changes every step (not transposed at load as
// gemv.cl's constant weights are). Both are bound by memory, not by arithmetic:
// - gemv_cols: y [MR, N] = act(alpha A B + beta C) for MR <= 32 rows (dX = dy W): streams B once. A work-group of
//   LN x LK work-items covers 4 LN columns over a slice of K; per chunk of KC rows of B it copies A's MR x KC block to
//   __local memory, then each work-item reads float4s of B (the LN lanes of a warp: consecutive 16 bytes) LK rows
//   apart and uses each against the MR values of A at that row (one __local address for the whole warp). The LK
//   lanes of each column sum through __local memory at the end, RED rows of y at a time. With SPLITS > 1 each slice
//   writes its partial sums to ws ([SPLITS, MR, N]) and gemv_rows_reduce (gemv_epilogue.cl) adds them.
// - gemm_outer: y [M, N] = act(alpha A B + beta C) for K <= 32 (dW = dy^T x): bound by writing y. A work-item
//   computes RM rows x 4 columns (float4 stores, consecutive along a warp) from K float4s of B and RM x K values of A
//   (one address per warp).
// gemv_half.cl (A1, B4, STORE_Y4) and gemv_epilogue.cl (epilogue) come first. B's and y's offsets, N and B's row
// stride are multiples of 4 (the lowering checks).

// y[m, n..n+3] = the epilogue of sums s (n a multiple of 4; y's offset too)
inline void store_y4(__global Y_T* y, long o, float4 s, int m, int n, __global const C_T* c, int scm, int scn,
                     float alpha, float beta) {
    const float4 v = (float4)(epilogue(s.x, m, n, c, scm, scn, alpha, beta),
                              epilogue(s.y, m, n + 1, c, scm, scn, alpha, beta),
                              epilogue(s.z, m, n + 2, c, scm, scn, alpha, beta),
                              epilogue(s.w, m, n + 3, c, scm, scn, alpha, beta));
    STORE_Y4(o, v);
}

#ifdef LK
#if !defined(MR) || !defined(LN) || !defined(KC) || !defined(RED) || !defined(SPLITS) || !defined(LOCALF)
#error "gemv_cols needs MR, LN, LK, KC, RED, SPLITS and LOCALF"
#endif
#if KC % LK
#error "gemv_cols: a chunk (KC rows of B) is whole steps of LK lanes"
#endif

__kernel __attribute__((reqd_work_group_size(LN, LK, 1)))
void gemv_cols(__global const A_T* a, ulong a_off, __global const B_T* b, ulong b_off,
               __global const C_T* c, ulong c_off, __global Y_T* y, ulong y_off,
               int N, int K, int sam, int sak, int sbk, int scm, int scn, float alpha, float beta, int per_split,
               __global float* ws, ulong ws_off) {
    __local float4 loc4[LOCALF / 4];  // A's rows at this chunk of k (MR x KC floats); then the lanes' partial sums
    __local float* As = (__local float*)loc4;
    const int ln = get_local_id(0), lk = get_local_id(1), tid = lk * LN + ln;
    const int split = get_group_id(1), N4 = N / 4;
    const int n4 = get_group_id(0) * LN + ln, col = min(n4, N4 - 1);  // a column past N reads the last; not stored
    const int k_begin = split * per_split, k_end = min(K, k_begin + per_split), sbk4 = sbk / 4;
    float4 acc[MR];
    for (int m = 0; m < MR; m++)
        acc[m] = (float4)(0.0f);
    for (int c0 = k_begin; c0 < k_end; c0 += KC) {
        const int cl = min(KC, k_end - c0);
        barrier(CLK_LOCAL_MEM_FENCE);  // the previous chunk's reads of As are done
        for (int i = tid; i < MR * KC; i += LN * LK) {
            const int m = i / KC, kk = i % KC;
            As[i] = kk < cl ? A1((long)m * sam + (long)(c0 + kk) * sak) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        // Whole chunks with no bounds test: past the slice A is zero in As and B's row is clamped into B
#pragma unroll 4
        for (int kk = lk; kk < KC; kk += LK) {
            const float4 w = B4((long)min(c0 + kk, K - 1) * sbk4 + col);
            for (int m = 0; m < MR; m++)
                acc[m] = fma((float4)(As[m * KC + kk]), w, acc[m]);
        }
    }
    // the LK lanes of each (row, column): RED rows per pass through __local memory
    __local float4* red = loc4;
    for (int m0 = 0; m0 < MR; m0 += RED) {
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int r = 0; r < RED && m0 + r < MR; r++)
            red[(r * LK + lk) * LN + ln] = acc[m0 + r];
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int t = tid; t < RED * LN; t += LN * LK) {
            const int r = t / LN, j = t % LN, m = m0 + r, n = (get_group_id(0) * LN + j) * 4;
            if (m < MR && n < N) {
                float4 s = (float4)(0.0f);
                for (int i = 0; i < LK; i++)
                    s += red[(r * LK + i) * LN + j];
#if SPLITS > 1
                *(__global float4*)(ws + ws_off + ((long)split * MR + m) * N + n) = s;
#else
                store_y4(y, y_off + (long)m * N + n, s, m, n, c + c_off, scm, scn, alpha, beta);
#endif
            }
        }
    }
}
#endif

#ifdef RM
#ifndef LN
#error "gemm_outer needs RM and LN"
#endif
__kernel __attribute__((reqd_work_group_size(LN, 1, 1)))
void gemm_outer(__global const A_T* a, ulong a_off, __global const B_T* b, ulong b_off,
                __global const C_T* c, ulong c_off, __global Y_T* y, ulong y_off,
                int M, int N, int K, int sam, int sak, int sbk, int scm, int scn, float alpha, float beta) {
    const int n4 = get_global_id(0), m0 = get_group_id(1) * RM, n = n4 * 4;
    if (n >= N) return;
    float4 acc[RM];
    for (int r = 0; r < RM; r++)
        acc[r] = (float4)(0.0f);
    const int sbk4 = sbk / 4;
#pragma unroll 4
    for (int k = 0; k < K; k++) {
        const float4 w = B4((long)k * sbk4 + n4);
        for (int r = 0; r < RM; r++)
            acc[r] = fma((float4)(A1((long)min(m0 + r, M - 1) * sam + (long)k * sak)), w, acc[r]);
    }
    for (int r = 0; r < RM && m0 + r < M; r++)
        store_y4(y, y_off + (long)(m0 + r) * N + n, acc[r], m0 + r, n, c + c_off, scm, scn, alpha, beta);
}
#endif
