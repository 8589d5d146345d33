// Gemm on CPU devices with a constant B: y = ACT(alpha * A B + beta * C). B is packed at lowering as
// bp[nb][k][NR] (columns past N zero) so each work-item streams one contiguous panel; it holds an MR x NR tile of
// y in MR * NV float8 accumulators over the whole of K. As in conv_cpu.cl, no OpenCL built-ins inside loops
// (PoCL calls them out of line, spilling the accumulators); float8u does unaligned vector loads.
#if !defined(MR) || !defined(NV)
#error "gemm_cpu.cl needs MR (rows per tile) and NV (float8 vectors of columns per tile)"
#endif
#ifndef ACT
#error "gemm_cpu.cl needs ACT(v)"
#endif
#define NR (8 * NV)
typedef float8 __attribute__((aligned(4))) float8u;

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void gemm_cpu(__global const float* a, ulong a_off, __global const float* bp, ulong bp_off,
              __global const float* c, ulong c_off, __global float* y, ulong y_off, int M, int N, int K,
              long sam, long sak, long scm, long scn, float alpha, float beta) {
    const int mb = get_global_id(0), nb = get_global_id(1);
    const int m0 = mb * MR, n0 = nb * NR;
    __global const float* ar[MR];
    _Pragma("unroll") for (int i = 0; i < MR; i++) ar[i] = a + a_off + (m0 + i < M ? m0 + i : M - 1) * sam;
    __global const float* b = bp + bp_off + (long)nb * K * NR;
    float8 acc[MR][NV];
    _Pragma("unroll") for (int i = 0; i < MR; i++)
        _Pragma("unroll") for (int j = 0; j < NV; j++) acc[i][j] = (float8)(0.0f);
    for (int k = 0; k < K; k++) {
        float8 bv[NV];
        _Pragma("unroll") for (int j = 0; j < NV; j++) bv[j] = *(__global const float8u*)(b + k * NR + 8 * j);
        _Pragma("unroll") for (int i = 0; i < MR; i++) {
            const float8 av = (float8)(ar[i][k * sak]);
            _Pragma("unroll") for (int j = 0; j < NV; j++) acc[i][j] = av * bv[j] + acc[i][j];
        }
    }
    y += y_off;
    c += c_off;
    _Pragma("unroll") for (int i = 0; i < MR; i++) {
        const int m = m0 + i;
        if (m >= M) break;
        _Pragma("unroll") for (int j = 0; j < NV; j++) {
            union { float8 v; float s[8]; } t;
            t.v = acc[i][j];
            for (int e = 0; e < 8; e++) {
                const int n = n0 + 8 * j + e;
                if (n >= N) break;
#if defined(HAS_C)
                const float r = alpha * t.s[e] + beta * c[m * scm + n * scn];
#else
                const float r = alpha * t.s[e];
#endif
                y[(long)m * N + n] = ACT(r);
            }
        }
    }
}
