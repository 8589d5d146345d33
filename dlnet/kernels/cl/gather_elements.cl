// GatherElements: y[i] = x[i with its `axis` coordinate replaced by idx[i]] (negative indices from the end).
// meta: rank dims of y (= idx), then rank strides of x. Also ScatterElements (none reduction) writing into a copy.
#if !defined(T) || !defined(IT)
#error "gather_elements.cl needs T and IT"
#endif
__kernel void gather_elements(__global T* y, ulong y_off, __global const T* x, ulong x_off, __global const IT* idx,
                              ulong idx_off, __constant const long* meta, int rank, int axis, long axis_len,
                              long total) {
    const long i = get_global_id(0);
    if (i >= total) return;
    long k = idx[idx_off + i];
    if (k < 0) k += axis_len;
    long r = i, o = 0;
    for (int d = rank - 1; d >= 0; d--) {
        const long q = r % meta[d];
        r /= meta[d];
        o += (d == axis ? k : q) * meta[rank + d];
    }
    y[y_off + i] = x[x_off + o];
}

// One work-item runs every update in order, so repeated indices resolve as the ONNX reference does (last wins).
__kernel void scatter_elements(__global T* y, ulong y_off, __global const T* upd, ulong upd_off,
                               __global const IT* idx, ulong idx_off, __constant const long* meta, int rank, int axis,
                               long axis_len, long total) {
    if (get_global_id(0) != 0) return;
    for (long i = 0; i < total; i++) {
        long k = idx[idx_off + i];
        if (k < 0) k += axis_len;
        long r = i, o = 0;
        for (int d = rank - 1; d >= 0; d--) {
            const long q = r % meta[d];
            r /= meta[d];
            o += (d == axis ? k : q) * meta[rank + d];
        }
#if defined(RED_ADD)
        y[y_off + o] += upd[upd_off + i];
#elif defined(RED_MUL)
        y[y_off + o] *= upd[upd_off + i];
#elif defined(RED_MAX)
        y[y_off + o] = max(y[y_off + o], upd[upd_off + i]);
#elif defined(RED_MIN)
        y[y_off + o] = min(y[y_off + o], upd[upd_off + i]);
#else
        y[y_off + o] = upd[upd_off + i];
#endif
    }
}
