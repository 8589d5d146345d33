// Softmax / LogSoftmax along one axis of a tensor viewed as [outer, axis, inner]; one work-item per (outer, inner).
#if !defined(LOG_SOFTMAX) && !defined(SOFTMAX)
#error "softmax.cl needs SOFTMAX or LOG_SOFTMAX"
#endif
// X_HALF (precision "fp16", kernels/half.py): x stored in half; the sums and y stay float (autocast's fp32 list)
#if defined(X_HALF)
#define X_T half
#define LDX(i) vload_half(i, x)
#else
#define X_T float
#define LDX(i) x[i]
#endif
__kernel void softmax(__global const X_T* x, ulong x_off, __global float* y, ulong y_off,
                      int outer, int axis, int inner) {
    const long i = get_global_id(0);
    if (i >= (long)outer * inner) return;
    const long o = i / inner, in = i % inner;
    x += x_off + o * axis * inner + in;
    y += y_off + o * axis * inner + in;
    float m = -INFINITY;
    for (int a = 0; a < axis; a++) m = fmax(m, LDX((long)a * inner));
    float s = 0.0f;
    for (int a = 0; a < axis; a++) s += exp(LDX((long)a * inner) - m);
#if defined(LOG_SOFTMAX)
    const float ls = log(s);
    for (int a = 0; a < axis; a++) y[(long)a * inner] = LDX((long)a * inner) - m - ls;
#else
    const float inv = 1.0f / s;
    for (int a = 0; a < axis; a++) y[(long)a * inner] = exp(LDX((long)a * inner) - m) * inv;
#endif
}

#if defined(WG)
// GPUs, inner = 1: a work-group of WG work-items per row (one work-item a row ran LogSoftmax over 16 rows of 1000
// classes, a training step's loss, in 0.10 ms on an H100: 16 busy lanes reading 1000 floats each in turn)
__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void softmax_rows(__global const X_T* x, ulong x_off, __global float* y, ulong y_off, int axis) {
    __local float red[WG];
    const int l = get_local_id(0);
    x += x_off + (long)get_group_id(0) * axis;
    y += y_off + (long)get_group_id(0) * axis;
    float m = -INFINITY;
    for (int a = l; a < axis; a += WG) m = fmax(m, LDX(a));
    red[l] = m;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = WG / 2; h > 0; h >>= 1) {
        if (l < h) red[l] = fmax(red[l], red[l + h]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    m = red[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    float s = 0.0f;
    for (int a = l; a < axis; a += WG) s += exp(LDX(a) - m);
    red[l] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = WG / 2; h > 0; h >>= 1) {
        if (l < h) red[l] += red[l + h];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    s = red[0];
#if defined(LOG_SOFTMAX)
    const float ls = log(s);
    for (int a = l; a < axis; a += WG) y[a] = LDX(a) - m - ls;
#else
    const float inv = 1.0f / s;
    for (int a = l; a < axis; a += WG) y[a] = exp(LDX(a) - m) * inv;
#endif
}
#endif
