// LayerNorm over one axis of x that is not its last (LayerNormAxis: ConvNeXt's LayerNorm2d over NCHW's channels,
// whose elements lie H*W apart), y written as x is laid out or with that axis last. x is viewed as [outer, D, inner]:
// a row is (o, i), its D elements xs_d apart in x and ys_d apart in y. Two passes over the row (mean, then the mean
// of squared deviations), as layernorm.cl. A work-group is TP rows of consecutive i (x's loads coalesce across them)
// by TD work-items along each row (GPUs: parallelism where inner is small, ConvNeXt's 7 x 7 stage), whose partial
// sums meet in local memory; TD = 1 on CPUs (no barriers).
// X_HALF, Y_HALF (precision "fp16", kernels/half.py): x, y stored in half; the statistics stay float (autocast's
// fp32 list), y in half as the product after it would cast it.
#if defined(X_HALF)
#define X_T half
#define LDX(p, i) vload_half((i), (p))
#define LDX8(p) vload_half8(0, (p))
#else
#define X_T float
#define LDX(p, i) (p)[i]
#define LDX8(p) vload8(0, (p))
#endif
#if defined(Y_HALF)
#define Y_T half
#define STY(p, i, v) vstore_half((v), (i), (p))
#define STY8(p, v) vstore_half8((v), 0, (p))
#else
#define Y_T float
#define STY(p, i, v) ((p)[i] = (v))
#define STY8(p, v) vstore8((v), 0, (p))
#endif
#if TD > 1
#define ROW_SUM(s, out) do { part[t][p] = (s); barrier(CLK_LOCAL_MEM_FENCE); out = 0.0f; \
                             for (int k = 0; k < TD; k++) out += part[k][p]; \
                             barrier(CLK_LOCAL_MEM_FENCE); } while (0)
#else
#define ROW_SUM(s, out) out = (s)
#endif

__kernel void layernorm_axis(__global const X_T* x, ulong x_off, __global const float* scale, ulong scale_off,
                             __global const float* bias, ulong bias_off, __global Y_T* y, ulong y_off,
                             int inner, int D, long xs_o, long xs_d, long ys_o, long ys_i, long ys_d, float eps) {
    const int p = get_local_id(0), t = get_local_id(1);
    const int i = get_global_id(0);
    const long o = get_global_id(2);
    const bool live = i < inner;  // (no early return: every work-item meets the barriers)
#if TD > 1
    __local float part[TD][TP];
#endif
    x += x_off + o * xs_o + (live ? i : 0);
    __global Y_T* const rows = y + y_off + o * ys_o + (long)(i - p) * ys_i;  // the work-group's first row
    y = rows + (live ? p : 0) * ys_i;
    scale += scale_off;
    bias += bias_off;
    float s = 0.0f, mean, var;
    if (live) for (int d = t; d < D; d += TD) s += LDX(x, d * xs_d);
    ROW_SUM(s, mean);
    mean /= D;
    s = 0.0f;
    if (live) for (int d = t; d < D; d += TD) { const float v = LDX(x, d * xs_d) - mean; s += v * v; }
    ROW_SUM(s, var);
    const float inv = 1.0f / sqrt(var / D + eps);
#ifdef CL_OUT
    // y channels-last (ys_d == 1): 32 channels of the TP rows at a time through local memory, so that each row's
    // channels are written by consecutive work-items (whole 128-byte lines), not 32 rows apart by one
    __local float tile[32][TP + 1];
    const int f = t * TP + p;
    for (int c0 = 0; c0 < D; c0 += 32) {
        for (int d = c0 + t; d < min(c0 + 32, D); d += TD)
            tile[d - c0][p] = live ? (LDX(x, d * xs_d) - mean) * inv * scale[d] + bias[d] : 0.0f;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int e = f; e < TP * 32; e += TP * TD) {
            const int pp = e / 32, dd = e % 32;
            if (i - p + pp < inner && c0 + dd < D) STY(rows, (long)pp * ys_i + c0 + dd, tile[dd][pp]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#else
    if (live) for (int d = t; d < D; d += TD) STY(y, d * ys_d, (LDX(x, d * xs_d) - mean) * inv * scale[d] + bias[d]);
#endif
}

// CPUs: a work-item per 8 consecutive rows, their elements loaded as one float8 (x's rows are consecutive along i:
// vload8 at each d), so the three passes over the row run in vector registers; rows past the last multiple of 8 one
// by one. y written with vstore8 where its rows are consecutive too (ys_i == 1), else element by element.
#define LNA_ROW(i) do { \
        __global const X_T* xr = x + (i); __global Y_T* yr = y + (long)(i) * ys_i; \
        float s1 = 0.0f; for (int d = 0; d < D; d++) s1 += LDX(xr, d * xs_d); \
        const float m1 = s1 / D; float v1 = 0.0f; \
        for (int d = 0; d < D; d++) { const float e = LDX(xr, d * xs_d) - m1; v1 += e * e; } \
        const float inv1 = 1.0f / sqrt(v1 / D + eps); \
        for (int d = 0; d < D; d++) STY(yr, d * ys_d, (LDX(xr, d * xs_d) - m1) * inv1 * scale[d] + bias[d]); } while (0)

__kernel void layernorm_axis_rows8(__global const X_T* x, ulong x_off, __global const float* scale,
                                   ulong scale_off, __global const float* bias, ulong bias_off, __global Y_T* y,
                                   ulong y_off, int inner, int D, long xs_o, long xs_d, long ys_o, long ys_i,
                                   long ys_d, float eps) {
    const int i0 = get_global_id(0) * 8;
    const long o = get_global_id(1);
    x += x_off + o * xs_o;
    y += y_off + o * ys_o;
    scale += scale_off;
    bias += bias_off;
    if (i0 + 8 > inner) {
        for (int i = i0; i < inner; i++) LNA_ROW(i);
        return;
    }
    x += i0;
    y += (long)i0 * ys_i;
    float8 s = 0.0f;
    for (int d = 0; d < D; d++) s += LDX8(x + d * xs_d);
    const float8 mean = s / (float)D;
    float8 v = 0.0f;
    for (int d = 0; d < D; d++) { const float8 e = LDX8(x + d * xs_d) - mean; v += e * e; }
    const float8 inv = 1.0f / sqrt(v / (float)D + eps);
    for (int d = 0; d < D; d++) {
        const float8 r = (LDX8(x + d * xs_d) - mean) * inv * scale[d] + bias[d];
        if (ys_i == 1) {
            STY8(y + d * ys_d, r);
        } else {
            __global Y_T* yd = y + d * ys_d;
            STY(yd, 0, r.s0); STY(yd, ys_i, r.s1); STY(yd, 2 * ys_i, r.s2); STY(yd, 3 * ys_i, r.s3);
            STY(yd, 4 * ys_i, r.s4); STY(yd, 5 * ys_i, r.s5); STY(yd, 6 * ys_i, r.s6); STY(yd, 7 * ys_i, r.s7);
        }
    }
}
