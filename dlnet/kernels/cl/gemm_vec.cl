// GEMM body for CPU devices: each work-item computes RM rows x 8 columns as float8 vectors, so the CPU's SIMD
// units do the work whatever the OpenCL runtime's own vectoriser makes of it. B is read 8 columns at a time with
// LOAD_B8(k, n) where the including file can (B contiguous along n), else element by element with LOAD_B.
#ifndef RM
#error "gemm_vec.cl needs RM"
#endif
#define ZID get_global_id(2)  // no local size is set on CPUs: group ids follow the runtime's choice
__kernel void KERNEL_NAME(KERNEL_ARGS, __global float* ws, ulong ws_off) {
    ws += ws_off;
    PROLOGUE
    const int n0 = get_global_id(0) * 8;
    const int m0 = get_global_id(1) * RM;
    if (n0 >= NN || m0 >= M) return;
    const int rows = min(RM, M - m0);
    float8 acc[RM];
    for (int i = 0; i < RM; i++) acc[i] = (float8)(0.0f);
#if defined(LOAD_B8)
    if (n0 + 8 <= NN && rows == RM) {  // the hot loop: no guards
        for (int k = 0; k < KK; k++) {
            const float8 bv = LOAD_B8(k, n0);
            for (int i = 0; i < RM; i++) acc[i] = fma((float8)(LOAD_A(m0 + i, k)), bv, acc[i]);
        }
    } else if (n0 + 8 <= NN) {
        for (int k = 0; k < KK; k++) {
            const float8 bv = LOAD_B8(k, n0);
            for (int i = 0; i < RM; i++)
                acc[i] = fma((float8)(i < rows ? LOAD_A(m0 + i, k) : 0.0f), bv, acc[i]);
        }
    } else
#endif
    {
        for (int k = 0; k < KK; k++) {
            float t[8];
            for (int j = 0; j < 8; j++) t[j] = n0 + j < NN ? LOAD_B(k, n0 + j) : 0.0f;
            const float8 bv = vload8(0, t);
            for (int i = 0; i < RM; i++)
                acc[i] = fma((float8)(i < rows ? LOAD_A(m0 + i, k) : 0.0f), bv, acc[i]);
        }
    }
    for (int i = 0; i < rows; i++) {
        float t[8];
        vstore8(acc[i], 0, t);
        for (int j = 0; j < 8 && n0 + j < NN; j++) STORE(m0 + i, n0 + j, t[j]);
    }
}
