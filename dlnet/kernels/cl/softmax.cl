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
