// Register-blocked GEMM body without local memory: each work-item computes RM rows x CN columns. Chosen for CPU
// devices (PoCL), where work-group barriers and __local tiles cost more than they save (measured 10-25x slower).
// The including file defines the same macros as for gemm_core.cl.
#if !defined(RM) || !defined(CN)
#error "gemm_regs.cl needs RM CN"
#endif
#define ZID get_group_id(2)
__kernel void KERNEL_NAME(KERNEL_ARGS, __global float* ws) {
    PROLOGUE
    const int n0 = get_global_id(0) * CN;
    const int m0 = get_global_id(1) * RM;
    if (n0 >= NN || m0 >= M) return;
    float acc[RM][CN];
    for (int i = 0; i < RM; i++)
        for (int j = 0; j < CN; j++)
            acc[i][j] = 0.0f;
    const int rows = min(RM, M - m0), cols = min(CN, NN - n0);
    if (rows == RM && cols == CN) {
        for (int k = 0; k < KK; k++) {
            float breg_[CN];
            for (int j = 0; j < CN; j++) breg_[j] = LOAD_B(k, n0 + j);
            for (int i = 0; i < RM; i++) {
                const float areg_ = LOAD_A(m0 + i, k);
                for (int j = 0; j < CN; j++) acc[i][j] = fma(areg_, breg_[j], acc[i][j]);
            }
        }
    } else {
        for (int k = 0; k < KK; k++) {
            float breg_[CN];
            for (int j = 0; j < CN; j++) breg_[j] = j < cols ? LOAD_B(k, n0 + j) : 0.0f;
            for (int i = 0; i < rows; i++) {
                const float areg_ = LOAD_A(m0 + i, k);
                for (int j = 0; j < CN; j++) acc[i][j] = fma(areg_, breg_[j], acc[i][j]);
            }
        }
    }
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++)
            STORE(m0 + i, n0 + j, acc[i][j]);
}
