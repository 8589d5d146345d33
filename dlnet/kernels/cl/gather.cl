// Gather along one axis of x viewed as [outer, axis_len, inner]; indices may be negative (from the end).
#if !defined(T) || !defined(IT)
#error "gather.cl needs T and IT"
#endif
// precision "fp16" (kernels/half.py): X_HALF / Y_HALF store the table / y in half (T is then float)
#if defined(X_HALF)
#define X_T half
#define LDX(i) vload_half(i, x)
#else
#define X_T T
#define LDX(i) x[i]
#endif
#if defined(Y_HALF)
#define Y_T half
#define STY(i, v) vstore_half(v, i, y)
#else
#define Y_T T
#define STY(i, v) y[i] = (v)
#endif
__kernel void gather(__global Y_T* y, ulong y_off, __global const X_T* x, ulong x_off, __global const IT* idx,
                     ulong idx_off, long n_idx, long axis_len, long inner, long total) {
    const long i = get_global_id(0);
    if (i >= total) return;
    const long in = i % inner; const long t = i / inner;
    const long j = t % n_idx; const long o = t / n_idx;
    long k = idx[idx_off + j];
    if (k < 0) k += axis_len;
    STY(y_off + i, (k >= 0 && k < axis_len) ? LDX(x_off + (o * axis_len + k) * inner + in) : (T)0);
}

// The gradient: dx[o, k, in] = sum over j with idx[j] == k of dy[o, j, in]  (deterministic, no atomics)
__kernel void gather_grad(__global T* dx, ulong dx_off, __global const T* dy, ulong dy_off, __global const IT* idx,
                          ulong idx_off, long n_idx, long axis_len, long inner, long total) {
    const long i = get_global_id(0);
    if (i >= total) return;
    const long in = i % inner; const long t = i / inner;
    const long k = t % axis_len; const long o = t / axis_len;
    T acc = 0;
    for (long j = 0; j < n_idx; j++) {
        long kj = idx[idx_off + j];
        if (kj < 0) kj += axis_len;
        if (kj == k) acc += dy[dy_off + (o * n_idx + j) * inner + in];
    }
    dx[dx_off + i] = acc;
}
