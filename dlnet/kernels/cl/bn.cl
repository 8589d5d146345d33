// Training-mode batch normalization of x viewed as [N, C, S] (S = the spatial size, 1 for [N, C]).
// Per-channel sums run in two steps so small C still fills the device: bn_partial's work-group (g, c) sums a
// slice of channel c into ws[c][g], bn_stats / bn_grad_stats add the G slices of each channel. The forward sums are
// shifted by the channel's first element (var = E[(x-k)^2] - E[x-k]^2 stays accurate while k is near the mean).
// No division per element: bn_partial steps through (image, position) pairs incrementally, and the elementwise
// kernels take a 2-D grid of (position, image * C + channel) (a 64-bit i / S % C per element, and float loads, held
// resnet50's 106 BatchNorm launches of a b16 training step at about a third of the memory bandwidth).
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

// V (1 or 4): elements per load; 4 where S and every operand's offset are multiples of 4 and nothing is stored in
// half (the host checks)
#ifndef V
#define V 1
#endif
#if V == 4
typedef float4 VT;
#define LD_XV(p, at) (*(__global const float4*)((p) + (at)))
#define LD_DYV(p, at) (*(__global const float4*)((p) + (at)))
#define ST_YV(p, at, v) (*(__global float4*)((p) + (at)) = (v))
#define ST_DXV(p, at, v) (*(__global float4*)((p) + (at)) = (v))
#define HSUM(v) ((v).x + (v).y + (v).z + (v).w)
#else
typedef float VT;
#define LD_XV(p, at) LD_X(p, at)
#define LD_DYV(p, at) LD_DY(p, at)
#define ST_YV(p, at, v) ST_Y(p, at, v)
#define ST_DXV(p, at, v) ST_DX(p, at, v)
#define HSUM(v) (v)
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
// Work-item j of the G * WG over channel c takes vectors j, j + G * WG, ... of the channel's N * S / V, as
// (image n, vector s) advanced by (dn, ds) per step.
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void bn_partial(__global const X_T* x, ulong x_off, __global const DY_T* dy, ulong dy_off,
                __global const float* mean, ulong mean_off, int N, int C, int S, int G, __global float2* ws) {
    __local float2 part[WG];
    const int g = get_group_id(0), c = get_group_id(1);
    x += x_off + (long)c * S;
    dy += dy_off + (long)c * S;
#ifdef GRAD
    const float k = mean[mean_off + c];
#else
    const float k = LD_X(x, 0);
#endif
    const int SV = S / V, step = G * WG, dn = step / SV, ds = step - dn * SV;
    const int j = g * WG + get_local_id(0);
    int n = j / SV, s = j - n * SV;
    VT a0 = (VT)(0.0f), a1 = (VT)(0.0f);
    while (n < N) {
        const long at = (long)n * C * S + s * V;
        const VT d = LD_XV(x, at) - k;
#ifdef GRAD
        const VT e = LD_DYV(dy, at);
        a0 += e;
        a1 += e * d;
#else
        a0 += d;
        a1 += d * d;
#endif
        s += ds;
        n += dn;
        if (s >= SV) {
            s -= SV;
            n++;
        }
    }
    const float2 acc = wg_sum2((float2)(HSUM(a0), HSUM(a1)), part);
    if (get_local_id(0) == 0) ws[(long)c * G + g] = acc;
}

// The forward statistics (mean, biased variance) of channel c from its G partial sums; xc: the channel's first
// element (the shift k)
inline float2 forward_stats(__global const X_T* xc, __global const float2* ws, int c, int G, float count) {
    float2 t = (float2)(0.0f, 0.0f);
    for (int g = 0; g < G; g++) t += ws[(long)c * G + g];
    const float m = t.x / count;
    const float v = t.y / count - m * m;
    return (float2)(LD_X(xc, 0) + m, v < 0.0f ? 0.0f : v);  // (max() would turn a NaN into 0)
}

// (dbias, dscale) of channel c from its G gradient partial sums
inline float2 grad_sums(__global const float2* ws, int c, int G, float inv) {
    float2 t = (float2)(0.0f, 0.0f);
    for (int g = 0; g < G; g++) t += ws[(long)c * G + g];
    return (float2)(t.x, t.y * inv);
}

// mean[c], var[c] from the forward partial sums; one work-item per channel (sync_bn exchanges them before bn_apply)
__kernel void bn_stats(__global const X_T* x, ulong x_off, __global float* mean, ulong mean_off,
                       __global float* var, ulong var_off, int N, int C, int S, int G, __global const float2* ws) {
    const int c = get_global_id(0);
    if (c >= C) return;
    const float2 st = forward_stats(x + x_off + (long)c * S, ws, c, G, (float)N * S);
    mean[mean_off + c] = st.x;
    var[var_off + c] = st.y;
}

// dscale[c] = sum(dy * xhat), dbias[c] = sum(dy) from the gradient partial sums.
__kernel void bn_grad_stats(__global const float* var, ulong var_off, __global float* dscale, ulong dscale_off,
                            __global float* dbias, ulong dbias_off, int C, int G, float eps,
                            __global const float2* ws) {
    const int c = get_global_id(0);
    if (c >= C) return;
    const float2 t = grad_sums(ws, c, G, rsqrt(var[var_off + c] + eps));
    dbias[dbias_off + c] = t.x;
    dscale[dscale_off + c] = t.y;
}

// y = (x - mean) * rsqrt(var + eps) * scale + bias; work-item (vector s, row n * C + c). STATS_IN_APPLY: every
// work-item adds its channel's partial sums itself (the same sums in the same order as bn_stats) and work-item
// (0, c) writes mean and var: no bn_stats launch
__kernel void bn_apply(__global const X_T* x, ulong x_off, __global float* mean, ulong mean_off,
                       __global float* var, ulong var_off, __global const float* scale, ulong scale_off,
                       __global const float* bias, ulong bias_off, __global Y_T* y, ulong y_off, int C, int S,
                       float eps, int N, int G, __global const float2* ws) {
    const int s = get_global_id(0), row = get_global_id(1);
    if (s >= S / V) return;
    const int c = row % C;
#if defined(STATS_IN_APPLY)
    const float2 st = forward_stats(x + x_off + (long)c * S, ws, c, G, (float)N * S);
    if (s == 0 && row == c) {
        mean[mean_off + c] = st.x;
        var[var_off + c] = st.y;
    }
#else
    const float2 st = (float2)(mean[mean_off + c], var[var_off + c]);
#endif
    const float a = rsqrt(st.y + eps) * scale[scale_off + c];
    const long at = (long)row * S + s * V;
    ST_YV(y + y_off, at, (LD_XV(x + x_off, at) - st.x) * a + bias[bias_off + c]);
}

// dx = scale * inv * (dy - dbias / count - xhat * dscale / count), xhat = (x - mean) * inv, inv = rsqrt(var + eps);
// work-item (vector s, row n * C + c); STATS_IN_APPLY as bn_apply's (dbias and dscale: no bn_grad_stats launch)
__kernel void bn_grad_apply(__global const DY_T* dy, ulong dy_off, __global const X_T* x, ulong x_off,
                            __global const float* mean, ulong mean_off, __global const float* var, ulong var_off,
                            __global const float* scale, ulong scale_off, __global float* dscale,
                            ulong dscale_off, __global float* dbias, ulong dbias_off, __global DX_T* dx,
                            ulong dx_off, int C, int S, float eps, float inv_count, int G,
                            __global const float2* ws) {
    const int s = get_global_id(0), row = get_global_id(1);
    if (s >= S / V) return;
    const int c = row % C;
    const float inv = rsqrt(var[var_off + c] + eps);
#if defined(STATS_IN_APPLY)
    const float2 sums = grad_sums(ws, c, G, inv);
    if (s == 0 && row == c) {
        dbias[dbias_off + c] = sums.x;
        dscale[dscale_off + c] = sums.y;
    }
#else
    const float2 sums = (float2)(dbias[dbias_off + c], dscale[dscale_off + c]);
#endif
    const long at = (long)row * S + s * V;
    const VT xhat = (LD_XV(x + x_off, at) - mean[mean_off + c]) * inv;
    ST_DXV(dx + dx_off, at, scale[scale_off + c] * inv *
           (LD_DYV(dy + dy_off, at) - (sums.x + xhat * sums.y) * inv_count));
}
