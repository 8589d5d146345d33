// Gemm on CPU devices: y = ACT(alpha * A B + beta * C). B is packed as bp[nb][k][NR] (columns past N zero) so each
// work-item streams one contiguous panel: a constant B at lowering, any other (a parameter, an activation) by
// gemm_cpu_pack before each run; it holds an MR x NR tile of
// y in MR * NV float8 accumulators over the whole of K. As in conv_cpu.cl, no OpenCL built-ins inside loops
// (PoCL calls them out of line, spilling the accumulators); float8u does unaligned vector loads.
#if !defined(MR) || !defined(NV)
#error "gemm_cpu.cl needs MR (rows per tile) and NV (float8 vectors of columns per tile)"
#endif
#ifndef ACT
#error "gemm_cpu.cl needs ACT(v)"
#endif
#define NR (8 * NV)
// precision "fp16" (kernels/half.py): A_HALF, C_HALF, Y_HALF store that operand in half (vload_half / vstore_half)
#if defined(A_HALF)
#define A_T half
#define LOAD_A(p, i) vload_half(i, p)
#else
#define A_T float
#define LOAD_A(p, i) (p)[i]
#endif
#if defined(B_HALF)  // (gemm_cpu_pack's B; the panels are float)
#define B_T half
#define LOAD_B(p, i) vload_half(i, p)
#define LOAD_B8(p) vload_half8(0, p)
#else
#define B_T float
#define LOAD_B(p, i) (p)[i]
#define LOAD_B8(p) (*(__global const float8u*)(p))
#endif
#if defined(C_HALF)
#define C_T half
#define LOAD_C(i) vload_half(i, c)
#else
#define C_T float
#define LOAD_C(i) c[i]
#endif
#if defined(Y_HALF)
#define Y_T half
#define STORE_Y8(i, v) vstore_half8(v, 0, y + (i))
#define STORE_Y(i, v) vstore_half(v, i, y)
#else
#define Y_T float
#define STORE_Y8(i, v) *(__global float8u*)(y + (i)) = (v)
#define STORE_Y(i, v) y[i] = (v)
#endif
typedef float8 __attribute__((aligned(4))) float8u;
// A_PACKED: A comes in panels ap[mb][k][MR] of floats (gemm_cpu_pack with PW = MR, where A's rows are not
// contiguous: a weight gradient's X^T), each tile's MR values of a k adjacent, where read in place they sit sak apart,
// a cache line each
#if defined(A_PACKED)
#define AK_T float
#else
#define AK_T A_T
#endif
// A_UNIT_K: A's rows are contiguous (sak == 1), so its loads index the MR row pointers by k itself (one induction
// variable, not MR pointers stepped by sak each k)
#if defined(A_UNIT_K)
#define A_K(k) (k)
#else
#define A_K(k) ((k) * sak)
#endif

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void gemm_cpu(__global const AK_T* a, ulong a_off, __global const float* bp, ulong bp_off,
              __global const C_T* c, ulong c_off, __global Y_T* y, ulong y_off, int M, int N, int K,
              long sam, long sak, long scm, long scn, float alpha, float beta) {
    const int mb = get_global_id(0), nb = get_global_id(1);
    const int m0 = mb * MR, n0 = nb * NR;
#if defined(A_PACKED)
    __global const float* ap = a + a_off + (long)mb * K * MR;
#define A_AT(i, k) ap[(k) * MR + (i)]
#else
    __global const A_T* ar[MR];
    _Pragma("unroll") for (int i = 0; i < MR; i++) ar[i] = a + a_off + (m0 + i < M ? m0 + i : M - 1) * sam;
#define A_AT(i, k) LOAD_A(ar[i], A_K(k))
#endif
    __global const float* b = bp + bp_off + (long)nb * K * NR;
    float8 acc[MR][NV];
    _Pragma("unroll") for (int i = 0; i < MR; i++)
        _Pragma("unroll") for (int j = 0; j < NV; j++) acc[i][j] = (float8)(0.0f);
    for (int k = 0; k < K; k++) {
        float8 bv[NV];
        _Pragma("unroll") for (int j = 0; j < NV; j++) bv[j] = *(__global const float8u*)(b + k * NR + 8 * j);
        _Pragma("unroll") for (int i = 0; i < MR; i++) {
            const float8 av = (float8)(A_AT(i, k));
            _Pragma("unroll") for (int j = 0; j < NV; j++) acc[i][j] = av * bv[j] + acc[i][j];
        }
    }
    y += y_off;
    c += c_off;
    // whole float8s of columns: one vector store with ACT lane by lane (a short product, K = 64, spent as long in a
    // scalar epilogue as in its products: 3136 x 64 x 256 1.4-2.3 -> 0.7-1.1 ms, noisy); the ragged last float8
    // element by element
    _Pragma("unroll") for (int i = 0; i < MR; i++) {
        const int m = m0 + i;
        if (m >= M) break;
        _Pragma("unroll") for (int j = 0; j < NV; j++) {
            const int n8 = n0 + 8 * j;
            if (n8 + 8 <= N) {
                float8 r = alpha * acc[i][j];
#if defined(HAS_C)
                union { float8 v; float s[8]; } cv;
                for (int e = 0; e < 8; e++) cv.s[e] = LOAD_C(m * scm + (n8 + e) * scn);
                r = r + beta * cv.v;
#endif
                float8 o;
                o.s0 = ACT(r.s0); o.s1 = ACT(r.s1); o.s2 = ACT(r.s2); o.s3 = ACT(r.s3);
                o.s4 = ACT(r.s4); o.s5 = ACT(r.s5); o.s6 = ACT(r.s6); o.s7 = ACT(r.s7);
                STORE_Y8((long)m * N + n8, o);
                continue;
            }
            union { float8 v; float s[8]; } t;
            t.v = acc[i][j];
            for (int e = 0; e < 8; e++) {
                const int n = n8 + e;
                if (n >= N) break;
#if defined(HAS_C)
                const float r = alpha * t.s[e] + beta * LOAD_C(m * scm + n * scn);
#else
                const float r = alpha * t.s[e];
#endif
                STORE_Y((long)m * N + n, ACT(r));
            }
        }
    }
}

// B [K, N] (element strides sbk, sbn; B_HALF: stored in half) packed in float as gemm_cpu reads it: panels
// bp[nb][k][PW] of PW of its N columns (PW: NR; columns past N zero). Launched with PW = MR (and B_HALF for A_HALF)
// on A^T it packs A for A_PACKED: A's rows are then the columns (sbn = sam, sbk = sak). A work-item per panel: where
// the columns are contiguous (sbn == 1) row by row along k (8 at once where the panel is whole and PW a multiple of
// 8), else column by column along k
#ifndef PW
#define PW NR
#endif
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void gemm_cpu_pack(__global const B_T* b, ulong b_off, __global float* bp, ulong bp_off, int N, int K, long sbk,
                   long sbn) {
    const int nb = get_global_id(0), n0 = nb * PW;
    b += b_off;
    __global float* p = bp + bp_off + (long)nb * K * PW;
#if PW % 8 == 0
    if (sbn == 1 && n0 + PW <= N) {
        for (int k = 0; k < K; k++)
            _Pragma("unroll") for (int j = 0; j < PW / 8; j++)
                *(__global float8u*)(p + (long)k * PW + 8 * j) = LOAD_B8(b + k * sbk + n0 + 8 * j);
        return;
    }
#endif
    if (sbn == 1) {
        for (int k = 0; k < K; k++)
            _Pragma("unroll") for (int j = 0; j < PW; j++)
                p[(long)k * PW + j] = n0 + j < N ? LOAD_B(b, n0 + j + k * sbk) : 0.0f;
        return;
    }
    for (int j = 0; j < PW; j++) {
        __global const B_T* col = b + (n0 + j) * sbn;
        if (n0 + j < N)
            for (int k = 0; k < K; k++) p[(long)k * PW + j] = LOAD_B(col, k * sbk);
        else
            for (int k = 0; k < K; k++) p[(long)k * PW + j] = 0.0f;
    }
}
