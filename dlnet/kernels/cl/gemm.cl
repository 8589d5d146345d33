// Batched GEMM with strides: y[b] = act(alpha * op(A[b]) op(B[b]) + beta * C), every operand addressed by
// (offset, row stride, column stride); per-batch offsets of A, B and C come from a table the planner writes once.
#ifndef ACT
#error "gemm.cl needs ACT(v)"
#endif
#ifndef IDX
#define IDX long  // index arithmetic and strides: int where every extent fits (the planner decides)
#endif
// precision "fp16" (kernels/half.py): an operand defined X_HALF is stored in half, read with vload_half and
// written with vstore_half; the arithmetic stays float
#if (defined(A_HALF) || defined(B_HALF)) && defined(STAGES) && !defined(F16)
#error "gemm.cl: half A or B needs the register-staged cores (cp.async copies floats) or gemm_ldsm.cl's F16"
#endif
#if defined(A_HALF)
#define A_T half
#else
#define A_T float
#endif
#if defined(B_HALF)
#define B_T half
#else
#define B_T float
#endif
#if defined(C_HALF)
#define C_T half
#else
#define C_T float
#endif
#if defined(Y_HALF)
#define Y_T half
#else
#define Y_T float
#endif
#define KERNEL_NAME gemm
#define KERNEL_ARGS \
    __global const A_T* a, ulong a_off, __global const B_T* b, ulong b_off, \
    __global const C_T* c, ulong c_off, __global Y_T* y, ulong y_off, __global const long* boff, \
    int M, int NN, int KK, IDX sam, IDX sak, IDX sbk, IDX sbn, IDX scm, IDX scn, IDX sym, IDX syn, \
    float alpha, float beta
#define PROLOGUE \
    const int bi = ZID; \
    a += a_off + boff[4 * bi]; b += b_off + boff[4 * bi + 1]; c += c_off + boff[4 * bi + 2]; \
    y += y_off + boff[4 * bi + 3];
#if defined(A_HALF)
#define LOAD_A(m, k) vload_half((m) * sam + (k) * sak, a)
#else
#define LOAD_A(m, k) a[(m) * sam + (k) * sak]
#endif
#if defined(B_HALF)
#define LOAD_B(k, n) vload_half((k) * sbk + (n) * sbn, b)
#else
#define LOAD_B(k, n) b[(k) * sbk + (n) * sbn]
#endif
#define PTR_A(m, k) (a + (m) * sam + (k) * sak)  // address forms (gemm_fetch.cl)
#define PTR_B(k, n) (b + (k) * sbk + (n) * sbn)
#if defined(B_ROWS)  // B contiguous along n (sbn == 1): vector loads on CPUs
#if defined(B_HALF)
#define LOAD_B8(k, n) vload_half8(0, b + (k) * sbk + (n))
#else
#define LOAD_B8(k, n) vload8(0, b + (k) * sbk + (n))
#endif
#endif
#if defined(HAS_C)
#if defined(C_HALF)
#define CVAL(m, n) (beta * vload_half((m) * scm + (n) * scn, c))
#else
#define CVAL(m, n) (beta * c[(m) * scm + (n) * scn])
#endif
#else
#define CVAL(m, n) 0.0f
#endif
// (STORE_PRE, STORE_WITH: the store apart from its load of C, gemm_fetch.cl)
#define STORE_PRE(m, n) CVAL(m, n)
#if defined(Y_HALF)
#define STORE_WITH(m, n, v, e) { float r_ = alpha * (v) + (e); vstore_half(ACT(r_), (m) * sym + (n) * syn, y); }
#else
#define STORE_WITH(m, n, v, e) { float r_ = alpha * (v) + (e); y[(m) * sym + (n) * syn] = TF32Y(ACT(r_)); }
#endif
#define STORE(m, n, v) STORE_WITH(m, n, v, CVAL(m, n))
// Y_PAIRS (gemm_ldsm.cl's STORE2, columns n and n + 1 of row m, n even): y's rows contiguous (syn 1) and every pair
// aligned (y's offsets and NN even), so that the two are one 4-byte (half) or 8-byte store
#if defined(Y_PAIRS)
#if defined(Y_HALF)  // (NVIDIA only, as gemm_ldsm.cl is: both rounded to half in one cvt, one 4-byte store)
#define STORE_PAIR(m, n, r) (*(__global uint*)(y + (m) * sym + (n)) = pack_half2((r).x, (r).y))
#else
#define STORE_PAIR(m, n, r) (*(__global float2*)(y + (m) * sym + (n)) = (r))
#endif
#define STORE2(m, n, v0, v1) { \
    if ((n) + 1 < NN) { \
        const float r0_ = alpha * (v0) + CVAL(m, n), r1_ = alpha * (v1) + CVAL(m, (n) + 1); \
        STORE_PAIR(m, n, ((float2)(TF32Y(ACT(r0_)), TF32Y(ACT(r1_))))); \
    } else STORE(m, n, v0); }
#endif
// Y_ROWS8 (gemm_wgmma.cl's STORE8, columns n .. n + 7 of row m, n a multiple of 8): y's rows contiguous and every
// chunk of 8 starting 16-byte aligned (NN, y's offsets multiples of 8), one 16-byte store (half) or two (float)
#if defined(Y_ROWS8)
#define Y8_VAL(m, n, v, i) TF32Y(ACT(alpha * (v) + CVAL(m, (n) + (i))))
#if defined(Y_HALF)
#define Y8_PUT(p, r) (*(__global uint4*)(p) = (uint4)(pack_half2((r).s0, (r).s1), pack_half2((r).s2, (r).s3), \
                                                        pack_half2((r).s4, (r).s5), pack_half2((r).s6, (r).s7)))
#else
#define Y8_PUT(p, r) { *(__global float4*)(p) = (r).lo; *(__global float4*)((p) + 4) = (r).hi; }
#endif
#define STORE8(m, n, v) { \
    const float8 r8_ = (float8)(Y8_VAL(m, n, (v).s0, 0), Y8_VAL(m, n, (v).s1, 1), Y8_VAL(m, n, (v).s2, 2), \
                                Y8_VAL(m, n, (v).s3, 3), Y8_VAL(m, n, (v).s4, 4), Y8_VAL(m, n, (v).s5, 5), \
                                Y8_VAL(m, n, (v).s6, 6), Y8_VAL(m, n, (v).s7, 7)); \
    Y8_PUT(y + (m) * sym + (n), r8_); }
#endif
