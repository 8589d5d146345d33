// LayerNorm over one axis of x that is not its last (LayerNormAxis: ConvNeXt's LayerNorm2d over NCHW's channels,
// whose elements lie H*W apart), y written as x is laid out or with that axis last. x is viewed as [outer, D, inner]:
// a row is (o, i), its D elements xs_d apart in x and ys_d apart in y. Two passes over the row (mean, then the mean
// of squared deviations), as layernorm.cl. A work-group is TP rows of consecutive i (x's loads coalesce across them)
// by TD work-items along each row (GPUs: parallelism where inner is small, ConvNeXt's 7 x 7 stage), whose partial
// sums meet in local memory; TD = 1 on CPUs (no barriers).
#if TD > 1
#define ROW_SUM(s, out) do { part[t][p] = (s); barrier(CLK_LOCAL_MEM_FENCE); out = 0.0f; \
                             for (int k = 0; k < TD; k++) out += part[k][p]; \
                             barrier(CLK_LOCAL_MEM_FENCE); } while (0)
#else
#define ROW_SUM(s, out) out = (s)
#endif

__kernel void layernorm_axis(__global const float* x, ulong x_off, __global const float* scale, ulong scale_off,
                             __global const float* bias, ulong bias_off, __global float* y, ulong y_off,
                             int inner, int D, long xs_o, long xs_d, long ys_o, long ys_i, long ys_d, float eps) {
    const int p = get_local_id(0), t = get_local_id(1);
    const int i = get_global_id(0);
    const long o = get_global_id(2);
    const bool live = i < inner;  // (no early return: every work-item meets the barriers)
#if TD > 1
    __local float part[TD][TP];
#endif
    x += x_off + o * xs_o + (live ? i : 0);
    y += y_off + o * ys_o + (live ? i : 0) * ys_i;
    scale += scale_off;
    bias += bias_off;
    float s = 0.0f, mean, var;
    if (live) for (int d = t; d < D; d += TD) s += x[d * xs_d];
    ROW_SUM(s, mean);
    mean /= D;
    s = 0.0f;
    if (live) for (int d = t; d < D; d += TD) { const float v = x[d * xs_d] - mean; s += v * v; }
    ROW_SUM(s, var);
    const float inv = 1.0f / sqrt(var / D + eps);
    if (live) for (int d = t; d < D; d += TD) y[d * ys_d] = (x[d * xs_d] - mean) * inv * scale[d] + bias[d];
}
