// LayerNorm over the last axis of a tensor viewed as [rows, D]; one work-item per row.
// Two passes over the row (mean, then the mean of squared deviations), as PyTorch's op-set 13 decomposition does.
__kernel void layernorm(__global const float* x, ulong x_off, __global const float* scale, ulong scale_off,
                        __global const float* bias, ulong bias_off, __global float* y, ulong y_off,
                        long rows, int D, float eps) {
    const long r = get_global_id(0);
    if (r >= rows) return;
    x += x_off + r * D;
    y += y_off + r * D;
    scale += scale_off;
    bias += bias_off;
    float s = 0.0f;
    for (int i = 0; i < D; i++) s += x[i];
    const float mean = s / D;
    float v = 0.0f;
    for (int i = 0; i < D; i++) { const float d = x[i] - mean; v += d * d; }
    const float inv = 1.0f / sqrt(v / D + eps);
    for (int i = 0; i < D; i++) y[i] = (x[i] - mean) * inv * scale[i] + bias[i];
}
