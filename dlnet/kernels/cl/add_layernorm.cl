// A residual Add and the LayerNorm after it, over the last axis of [rows, D] (graph/ops/transformer.py AddLayerNorm):
// s = a + b, y = (s - mean) / sqrt(var + eps) * scale + bias, reading a and b once per pass over the row (they stay
// in cache between the passes) and never reading s back: the Add's own launch and the LayerNorm's read of s go.
// b repeats every b_rows rows (a position table added to every image of the batch; b_rows = rows where it does not).
// KEEP_SUM: also write s (read later as the residual stream). RMS: RMSNorm (no centring, no bias).
// (Kept apart from layernorm.cl, whose plain LayerNorm it repeats with the Add in front.)
// A_HALF, B_HALF, Y_HALF, S_HALF (precision "fp16", kernels/half.py): that operand stored in half; the sums and the
// statistics stay float
#if defined(A_HALF)
#define A_T half
#define LDA(i) vload_half(i, a)
#else
#define A_T float
#define LDA(i) a[i]
#endif
#if defined(B_HALF)
#define B_T half
#define LDB(i) vload_half(i, b)
#else
#define B_T float
#define LDB(i) b[i]
#endif
#if defined(Y_HALF)
#define Y_T half
#define STY(i, v) vstore_half((v), (i), y)
#else
#define Y_T float
#define STY(i, v) (y[i] = TF32Y(v))
#endif
#if defined(S_HALF)
#define S_T half
#define STS(i, v) vstore_half((v), (i), s)
#else
#define S_T float
#define STS(i, v) (s[i] = (v))
#endif
#ifdef RMS
#define ALN_BIAS_ARGS
#define ALN_BIAS(i) 0.0f
#else
#define ALN_BIAS_ARGS __global const float* bias, ulong bias_off,
#define ALN_BIAS(i) bias[bias_off + (i)]
#endif
#ifdef KEEP_SUM
#define SUM_ARGS , __global S_T* s, ulong s_off
#define SUM_ROW(r) s += s_off + (r) * D
#define STORE_SUM(i, v) STS(i, v)
#else
#define SUM_ARGS
#define SUM_ROW(r) do { } while (0)
#define STORE_SUM(i, v) do { } while (0)
#endif

// one work-item per row (CPUs), 8 elements at a time: float8 partial sums, since a scalar running sum is one dependent
// add per element, which the compiler may not reorder (ViT-B/16's 197 x 768 rows with s kept: 0.54 -> 0.09 ms a
// launch on 2 cores, PoCL). Float operands load through unaligned float8 pointers (PoCL calls vload8 out of line).
typedef float8 __attribute__((aligned(4))) aln_f8;
#if defined(A_HALF)
#define LDA8(i) vload_half8(0, a + (i))
#else
#define LDA8(i) (*(__global const aln_f8*)(a + (i)))
#endif
#if defined(B_HALF)
#define LDB8(i) vload_half8(0, b + (i))
#else
#define LDB8(i) (*(__global const aln_f8*)(b + (i)))
#endif
#if defined(Y_HALF)
#define STY8(i, v) vstore_half8((v), 0, y + (i))
#else
#define STY8(i, v) (*(__global aln_f8*)(y + (i)) = TF32Y8(v))
#endif
#if defined(S_HALF)
#define STS8(i, v) vstore_half8((v), 0, s + (i))
#else
#define STS8(i, v) (*(__global aln_f8*)(s + (i)) = (v))
#endif
#ifdef KEEP_SUM
#define STORE_SUM8(i, v) STS8(i, v)
#else
#define STORE_SUM8(i, v) do { } while (0)
#endif
#ifdef RMS
#define ALN_BIAS8(i) ((float8)(0.0f))
#else
#define ALN_BIAS8(i) (*(__global const aln_f8*)(bias + bias_off + (i)))
#endif
inline float aln_hsum8(float8 v) {
    const float4 h = v.lo + v.hi;
    const float2 q = h.lo + h.hi;
    return q.x + q.y;
}

__kernel void add_layernorm(__global const A_T* a, ulong a_off, __global const B_T* b, ulong b_off, long b_rows,
                            __global const float* scale, ulong scale_off, ALN_BIAS_ARGS
                            __global Y_T* y, ulong y_off, long rows, int D, float eps SUM_ARGS) {
    const long r = get_global_id(0);
    if (r >= rows) return;
    a += a_off + r * D;
    b += b_off + (r % b_rows) * D;
    y += y_off + r * D;
    scale += scale_off;
    SUM_ROW(r);
    const int D8 = D & ~7;
    float8 t8 = (float8)(0.0f);
    for (int i = 0; i < D8; i += 8) {
        const float8 v = LDA8(i) + LDB8(i);
        STORE_SUM8(i, v);
        t8 += v;
    }
    float total = aln_hsum8(t8);
    for (int i = D8; i < D; i++) {
        const float v = LDA(i) + LDB(i);
        STORE_SUM(i, v);
        total += v;
    }
#ifdef RMS
    const float mean = 0.0f;
#else
    const float mean = total / D;
#endif
    float8 q8 = (float8)(0.0f);
    for (int i = 0; i < D8; i += 8) { const float8 d = LDA8(i) + LDB8(i) - mean; q8 = d * d + q8; }
    float var = aln_hsum8(q8);
    for (int i = D8; i < D; i++) { const float d = LDA(i) + LDB(i) - mean; var += d * d; }
    const float inv = 1.0f / sqrt(var / D + eps);
    for (int i = 0; i < D8; i += 8)
        STY8(i, (LDA8(i) + LDB8(i) - mean) * inv * *(__global const aln_f8*)(scale + i) + ALN_BIAS8(i));
    for (int i = D8; i < D; i++) STY(i, (LDA(i) + LDB(i) - mean) * inv * scale[i] + ALN_BIAS(i));
}

#ifdef WG
// one work-group of WG (a power of two) work-items per row (GPUs), as layernorm.cl's layernorm_wg
inline float aln_group_sum(float v, __local float* part) {
    const int l = get_local_id(0);
    part[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = WG / 2; h > 0; h >>= 1) {
        if (l < h) part[l] += part[l + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float total = part[0];
    barrier(CLK_LOCAL_MEM_FENCE);  // part is written again by the next sum
    return total;
}

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void add_layernorm_wg(__global const A_T* a, ulong a_off, __global const B_T* b, ulong b_off, long b_rows,
                      __global const float* scale, ulong scale_off, ALN_BIAS_ARGS
                      __global Y_T* y, ulong y_off, long rows, int D, float eps SUM_ARGS) {
    __local float part[WG];
    const long r = get_group_id(0);
    const int l = get_local_id(0);
    a += a_off + r * D;
    b += b_off + (r % b_rows) * D;
    y += y_off + r * D;
    scale += scale_off;
    SUM_ROW(r);
    float total = 0.0f;
    for (int i = l; i < D; i += WG) {
        const float v = LDA(i) + LDB(i);
        STORE_SUM(i, v);
        total += v;
    }
#ifdef RMS
    const float mean = 0.0f;
#else
    const float mean = aln_group_sum(total, part) / D;
#endif
    float var = 0.0f;
    for (int i = l; i < D; i += WG) { const float d = LDA(i) + LDB(i) - mean; var += d * d; }
    const float inv = 1.0f / sqrt(aln_group_sum(var, part) / D + eps);
    for (int i = l; i < D; i += WG) STY(i, (LDA(i) + LDB(i) - mean) * inv * scale[i] + ALN_BIAS(i));
}
#endif

#ifdef WARP_ROWS
// NVIDIA (ptx_lanes.cl comes first): a warp per row, WARP_ROWS rows a work-group, no barriers. Lane l holds chunks
// l, l + 32, ... (NCH of them) of 8 elements of s = a + b in registers, each read by one 16-byte load (two for
// floats), so a and b are read once; the sums go across the lanes by shuffles. D is a multiple of 8 and every operand
// starts 16-byte aligned (NormPoolFamily.warp_rows). H200, gpt2 fp16 b16 (4096 rows of 768): 10 us a launch, against
// 22 us for add_layernorm_wg.
#if defined(A_HALF)
#define LDA8W(i) ld_half8(a + (i))
#else
#define LDA8W(i) ld_float8(a + (i))
#endif
#if defined(B_HALF)
#define LDB8W(i) ld_half8(b + (i))
#else
#define LDB8W(i) ld_float8(b + (i))
#endif
#if defined(Y_HALF)
#define STY8W(i, v) st_half8((v), y + (i))
#else
#define STY8W(i, v) st_float8(TF32Y8(v), y + (i))
#endif
#if !defined(KEEP_SUM)
#define STS8W(i, v) do { } while (0)
#elif defined(S_HALF)
#define STS8W(i, v) st_half8((v), s + (i))
#else
#define STS8W(i, v) st_float8((v), s + (i))
#endif
#ifdef RMS
#define ALN_BIAS8W(i) ((float8)(0.0f))
#else
#define ALN_BIAS8W(i) ld_float8(bias + bias_off + (i))
#endif
inline float8 ld_float8(__global const float* p) {
    return (float8)(*(__global const float4*)p, *(__global const float4*)(p + 4));
}
inline void st_float8(float8 v, __global float* p) {
    *(__global float4*)p = v.lo;
    *(__global float4*)(p + 4) = v.hi;
}

__kernel __attribute__((reqd_work_group_size(32 * WARP_ROWS, 1, 1)))
void add_layernorm_warp(__global const A_T* a, ulong a_off, __global const B_T* b, ulong b_off, long b_rows,
                        __global const float* scale, ulong scale_off, ALN_BIAS_ARGS
                        __global Y_T* y, ulong y_off, long rows, int D, float eps SUM_ARGS) {
    const long r = get_group_id(0) * WARP_ROWS + get_local_id(0) / 32;
    const int lane = get_local_id(0) % 32;
    if (r >= rows) return;  // (the whole warp)
    a += a_off + r * D;
    b += b_off + (r % b_rows) * D;
    y += y_off + r * D;
    scale += scale_off;
    SUM_ROW(r);
    float8 v[NCH];
    float total = 0.0f;
    #pragma unroll
    for (int c = 0; c < NCH; c++) {
        const int i = (c * 32 + lane) * 8;
        v[c] = (float8)(0.0f);
        if (i < D) {
            v[c] = LDA8W(i) + LDB8W(i);
            STS8W(i, v[c]);
            total += aln_hsum8(v[c]);
        }
    }
#ifdef RMS
    const float mean = 0.0f;
#else
    const float mean = warp_sum(total) / D;
#endif
    float q = 0.0f;
    #pragma unroll
    for (int c = 0; c < NCH; c++)
        if ((c * 32 + lane) * 8 < D) {
            const float8 d = v[c] - mean;
            q += aln_hsum8(d * d);
        }
    const float inv = 1.0f / sqrt(warp_sum(q) / D + eps);
    #pragma unroll
    for (int c = 0; c < NCH; c++) {
        const int i = (c * 32 + lane) * 8;
        if (i < D) STY8W(i, (v[c] - mean) * inv * ld_float8(scale + i) + ALN_BIAS8W(i));
    }
}
#endif
