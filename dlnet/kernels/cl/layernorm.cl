// LayerNorm over the last axis of a tensor viewed as [rows, D].
// Two passes over the row (mean, then the mean of squared deviations), as PyTorch's op-set 13 decomposition does.
// STATS: also write each row's mean and 1 / sqrt(var + eps) (LayerNormalization-17's optional outputs).
// RMS: RMSNorm instead: no centring (the mean is taken as 0) and no bias: y = x / sqrt(mean(x^2) + eps) * scale.
// X_HALF (precision "fp16", kernels/half.py): x stored in half; the statistics stay float (autocast's fp32 list).
// Y_HALF: y stored in half (what autocast's next product casts it to)
#if defined(X_HALF)
#define X_T half
#define LDX(i) vload_half(i, x)
#else
#define X_T float
#define LDX(i) x[i]
#endif
#if defined(Y_HALF)
#define Y_T half
#define STY(i, v) vstore_half((v), (i), y)
#else
#define Y_T float
#define STY(i, v) (y[i] = TF32Y(v))
#endif
#ifdef RMS
#define BIAS_ARGS
#define BIAS(i) 0.0f
#else
#define BIAS_ARGS __global const float* bias, ulong bias_off,
#define BIAS(i) bias[bias_off + (i)]
#endif
#ifdef STATS
#define STATS_ARGS , __global float* mean_out, ulong mean_off, __global float* inv_out, ulong inv_off
#define STORE_STATS(r, mean, inv) do { mean_out[mean_off + (r)] = (mean); inv_out[inv_off + (r)] = (inv); } while (0)
#else
#define STATS_ARGS
#define STORE_STATS(r, mean, inv) do { } while (0)
#endif

// one work-item per row (CPUs, and short rows)
__kernel void layernorm(__global const X_T* x, ulong x_off, __global const float* scale, ulong scale_off,
                        BIAS_ARGS __global Y_T* y, ulong y_off,
                        long rows, int D, float eps STATS_ARGS) {
    const long r = get_global_id(0);
    if (r >= rows) return;
    x += x_off + r * D;
    y += y_off + r * D;
    scale += scale_off;
#ifdef RMS
    const float mean = 0.0f;
#else
    float s = 0.0f;
    for (int i = 0; i < D; i++) s += LDX(i);
    const float mean = s / D;
#endif
    float v = 0.0f;
    for (int i = 0; i < D; i++) { const float d = LDX(i) - mean; v += d * d; }
    const float inv = 1.0f / sqrt(v / D + eps);
    for (int i = 0; i < D; i++) STY(i, (LDX(i) - mean) * inv * scale[i] + BIAS(i));
    STORE_STATS(r, mean, inv);
}

#ifdef WG
// one work-group of WG (a power of two) work-items per row (GPUs, long rows): strided partial sums, a tree in
// local memory
inline float group_sum(float v, __local float* part) {
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
void layernorm_wg(__global const X_T* x, ulong x_off, __global const float* scale, ulong scale_off,
                  BIAS_ARGS __global Y_T* y, ulong y_off,
                  long rows, int D, float eps STATS_ARGS) {
    __local float part[WG];
    const long r = get_group_id(0);
    const int l = get_local_id(0);
    x += x_off + r * D;
    y += y_off + r * D;
    scale += scale_off;
#ifdef RMS
    const float mean = 0.0f;
#else
    float s = 0.0f;
    for (int i = l; i < D; i += WG) s += LDX(i);
    const float mean = group_sum(s, part) / D;
#endif
    float v = 0.0f;
    for (int i = l; i < D; i += WG) { const float d = LDX(i) - mean; v += d * d; }
    const float inv = 1.0f / sqrt(group_sum(v, part) / D + eps);
    for (int i = l; i < D; i += WG) STY(i, (LDX(i) - mean) * inv * scale[i] + BIAS(i));
    if (l == 0) STORE_STATS(r, mean, inv);
}
#endif
