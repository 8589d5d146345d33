// ArgMax / ArgMin along one axis of x viewed as [outer, axis_len, inner]; one work-item per (outer, inner).
// SELECT_LAST picks the last index among equal extremes (ONNX select_last_index), else the first.
#if !defined(T) || (!defined(ARG_MAX) && !defined(ARG_MIN))
#error "argreduce.cl needs T and ARG_MAX or ARG_MIN"
#endif
#if defined(ARG_MAX)
#define BETTER(a, b) ((a) > (b))
#else
#define BETTER(a, b) ((a) < (b))
#endif
__kernel void argreduce(__global long* y, ulong y_off, __global const T* x, ulong x_off, long axis_len, long inner,
                        long total) {
    const long i = get_global_id(0);
    if (i >= total) return;
    const long in = i % inner, o = i / inner;
    x += x_off + o * axis_len * inner + in;
    T best = x[0];
    long arg = 0;
    for (long a = 1; a < axis_len; a++) {
        const T v = x[a * inner];
#if defined(SELECT_LAST)
        if (BETTER(v, best) || v == best) { best = v; arg = a; }
#else
        if (BETTER(v, best)) { best = v; arg = a; }
#endif
    }
    y[y_off + i] = arg;
}
