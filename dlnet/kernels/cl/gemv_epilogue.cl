// The epilogue of the skinny products of many rows (gemv_rows.cl, gemv_mma.cl, which follow this file): y = act(alpha
// s + beta C) for the sum s of output (m, n), and with SPLITS > 1 the kernel that adds the slices' partial sums (ws:
// [SPLITS, MR, N]) and applies it. The arguments are those of the kernel that wrote the partial sums. gemv_half.cl
// comes first (C and y in half where defined so).
#ifndef ACT
#error "gemv_epilogue.cl needs ACT(v)"
#endif

inline float epilogue(float s, int m, int n, __global const C_T* c, int scm, int scn, float alpha, float beta) {
    float v = alpha * s;
#ifdef HAS_C
    v += beta * LOAD_C(c, (long)m * scm + (long)n * scn);
#endif
    return ACT(v);
}

#if SPLITS > 1
// y = act(alpha * (sum of the SPLITS slices' partial sums) + beta C): a work-item per output
__kernel void gemv_rows_reduce(__global const A_T* a, ulong a_off, __global const B_T* b, ulong b_off,
                               __global const C_T* c, ulong c_off, __global Y_T* y, ulong y_off,
                               int N, int K, int sam, int sbn, int scm, int scn, float alpha, float beta, int chunks,
                               __global float* ws, ulong ws_off) {
    const int n = get_global_id(0), m = get_global_id(1);
    if (n >= N) return;
    float s = 0.0f;
    for (int i = 0; i < SPLITS; i++)
        s += ws[ws_off + ((long)i * MR + m) * N + n];
    STORE_Y(y_off + (long)m * N + n, epilogue(s, m, n, c + c_off, scm, scn, alpha, beta));
}
#endif
