// Training-mode batch normalization of x viewed as [N, C, S] (S = the spatial size, 1 for [N, C]).
// Per-channel sums run in two steps so small C still fills the device: bn_partial's work-group (g, c) sums a
// slice of channel c into ws[c][g], bn_stats / bn_grad_stats add the G slices of each channel. The forward sums are
// shifted by the channel's first element (var = E[(x-k)^2] - E[x-k]^2 stays accurate while k is near the mean).
#ifndef WG
#define WG 256
#endif
// precision "fp16" (kernels/half.py): X_HALF, DY_HALF, Y_HALF, DX_HALF store that operand in half (loaded with
// vload_half, stored with vstore_half); the statistics, scale and bias stay float, and so does the arithmetic
#if defined(X_HALF)
#define X_T half
#define LD_X(p, i) vload_half(i, p)
#else
#define X_T float
#define LD_X(p, i) (p)[i]
#endif
#if defined(DY_HALF)
#define DY_T half
#define LD_DY(p, i) vload_half(i, p)
#else
#define DY_T float
#define LD_DY(p, i) (p)[i]
#endif
#if defined(Y_HALF)
#define Y_T half
#define ST_Y(p, i, v) vstore_half(v, i, p)
#else
#define Y_T float
#define ST_Y(p, i, v) (p)[i] = (v)
#endif
#if defined(DX_HALF)
#define DX_T half
#define ST_DX(p, i, v) vstore_half(v, i, p)
#else
#define DX_T float
#define ST_DX(p, i, v) (p)[i] = (v)
#endif

inline float2 wg_sum2(float2 v, __local float2* part) {
    const int l = get_local_id(0);
    part[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (l < s) part[l] += part[l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return part[0];
}

// GRAD unset: ws[c][g] = (sum(x - k), sum((x - k)^2)), k = x[0, c, 0].
// GRAD set:   ws[c][g] = (sum(dy), sum(dy * (x - mean[c]))).
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void bn_partial(__global const X_T* x, ulong x_off, __global const DY_T* dy, ulong dy_off,
                __global const float* mean, ulong mean_off, int N, int C, int S, int G, __global float2* ws) {
    __local float2 part[WG];
    const int g = get_group_id(0), c = get_group_id(1);
    const int count = N * S;
    x += x_off + (long)c * S;
    dy += dy_off + (long)c * S;
#ifdef GRAD
    const float k = mean[mean_off + c];
#else
    const float k = LD_X(x, 0);
#endif
    float2 acc = (float2)(0.0f, 0.0f);
    for (int j = g * WG + get_local_id(0); j < count; j += G * WG) {
        const int n = j / S;
        const long at = (long)n * C * S + (j - n * S);
        const float d = LD_X(x, at) - k;
#ifdef GRAD
        const float e = LD_DY(dy, at);
        acc += (float2)(e, e * d);
#else
        acc += (float2)(d, d * d);
#endif
    }
    acc = wg_sum2(acc, part);
    if (get_local_id(0) == 0) ws[(long)c * G + g] = acc;
}

// mean[c], var[c] (biased) from the forward partial sums; one work-item per channel.
__kernel void bn_stats(__global const X_T* x, ulong x_off, __global float* mean, ulong mean_off,
                       __global float* var, ulong var_off, int N, int C, int S, int G, __global const float2* ws) {
    const int c = get_global_id(0);
    if (c >= C) return;
    float2 t = (float2)(0.0f, 0.0f);
    for (int g = 0; g < G; g++) t += ws[(long)c * G + g];
    const float count = (float)N * S;
    const float m = t.x / count;
    mean[mean_off + c] = LD_X(x, x_off + (long)c * S) + m;
    const float v = t.y / count - m * m;
    var[var_off + c] = v < 0.0f ? 0.0f : v;  // (max() would turn a NaN into 0)
}

// dscale[c] = sum(dy * xhat), dbias[c] = sum(dy) from the gradient partial sums.
__kernel void bn_grad_stats(__global const float* var, ulong var_off, __global float* dscale, ulong dscale_off,
                            __global float* dbias, ulong dbias_off, int C, int G, float eps,
                            __global const float2* ws) {
    const int c = get_global_id(0);
    if (c >= C) return;
    float2 t = (float2)(0.0f, 0.0f);
    for (int g = 0; g < G; g++) t += ws[(long)c * G + g];
    dbias[dbias_off + c] = t.x;
    dscale[dscale_off + c] = t.y * rsqrt(var[var_off + c] + eps);
}

// y = (x - mean) * rsqrt(var + eps) * scale + bias
__kernel void bn_apply(__global const X_T* x, ulong x_off, __global const float* mean, ulong mean_off,
                       __global const float* var, ulong var_off, __global const float* scale, ulong scale_off,
                       __global const float* bias, ulong bias_off, __global Y_T* y, ulong y_off,
                       int C, int S, long total, float eps) {
    const long i = get_global_id(0);
    if (i >= total) return;
    const int c = (int)((i / S) % C);
    const float a = rsqrt(var[var_off + c] + eps) * scale[scale_off + c];
    ST_Y(y, y_off + i, (LD_X(x, x_off + i) - mean[mean_off + c]) * a + bias[bias_off + c]);
}

// dx = scale * inv * (dy - dbias / count - xhat * dscale / count), xhat = (x - mean) * inv, inv = rsqrt(var + eps)
__kernel void bn_grad_apply(__global const DY_T* dy, ulong dy_off, __global const X_T* x, ulong x_off,
                            __global const float* mean, ulong mean_off, __global const float* var, ulong var_off,
                            __global const float* scale, ulong scale_off, __global const float* dscale,
                            ulong dscale_off, __global const float* dbias, ulong dbias_off, __global DX_T* dx,
                            ulong dx_off, int C, int S, long total, float eps, float inv_count) {
    const long i = get_global_id(0);
    if (i >= total) return;
    const int c = (int)((i / S) % C);
    const float inv = rsqrt(var[var_off + c] + eps);
    const float xhat = (LD_X(x, x_off + i) - mean[mean_off + c]) * inv;
    ST_DX(dx, dx_off + i, scale[scale_off + c] * inv *
          (LD_DY(dy, dy_off + i) - (dbias[dbias_off + c] + xhat * dscale[dscale_off + c]) * inv_count));
}
