// Split-K epilogue for the GPU GEMM cores (gemm_core.cl, gemm_mma.cl): adds the SPLITS partial sums each slice of
// K wrote to ws and applies the including file's STORE (bias, residual, activation).
#if SPLITS > 1
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#undef ZID
#define ZID get_group_id(2)  // the reduce grid has one z per batch index
__kernel void CAT(KERNEL_NAME, _reduce)(KERNEL_ARGS, __global float* ws, ulong ws_off) {
    PROLOGUE
    ws += ws_off;
    const int n = get_global_id(0), m = get_global_id(1);
    if (n >= NN || m >= M) return;
    float v = 0.0f;
    for (int s = 0; s < SPLITS; s++) v += ws[(((long)ZID * SPLITS + s) * M + m) * NN + n];
    STORE(m, n, v);
}
#endif
