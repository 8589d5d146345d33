// Batched GEMM with strides: y[b] = act(alpha * op(A[b]) op(B[b]) + beta * C), every operand addressed by
// (offset, row stride, column stride); per-batch offsets of A, B and C come from a table the planner writes once.
#ifndef ACT
#error "gemm.cl needs ACT(v)"
#endif
#ifndef IDX
#define IDX long  // index arithmetic and strides: int where every extent fits (the planner decides)
#endif
#define KERNEL_NAME gemm
#define KERNEL_ARGS \
    __global const float* a, ulong a_off, __global const float* b, ulong b_off, \
    __global const float* c, ulong c_off, __global float* y, ulong y_off, __global const long* boff, \
    int M, int NN, int KK, IDX sam, IDX sak, IDX sbk, IDX sbn, IDX scm, IDX scn, IDX sym, IDX syn, \
    float alpha, float beta
#define PROLOGUE \
    const int bi = ZID; \
    a += a_off + boff[4 * bi]; b += b_off + boff[4 * bi + 1]; c += c_off + boff[4 * bi + 2]; \
    y += y_off + boff[4 * bi + 3];
#define LOAD_A(m, k) a[(m) * sam + (k) * sak]
#define LOAD_B(k, n) b[(k) * sbk + (n) * sbn]
#define PTR_A(m, k) (a + (m) * sam + (k) * sak)  // address forms (gemm_fetch.cl)
#define PTR_B(k, n) (b + (k) * sbk + (n) * sbn)
#if defined(B_ROWS)  // B contiguous along n (sbn == 1): vector loads on CPUs
#define LOAD_B8(k, n) vload8(0, b + (k) * sbk + (n))
#endif
#if defined(HAS_C)
#define CVAL(m, n) (beta * c[(m) * scm + (n) * scn])
#else
#define CVAL(m, n) 0.0f
#endif
#define STORE(m, n, v) { float r_ = alpha * (v) + CVAL(m, n); y[(m) * sym + (n) * syn] = ACT(r_); }
