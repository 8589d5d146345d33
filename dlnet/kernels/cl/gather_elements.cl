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

// GatherElements' gradient: dx[c] = sum over j < idx's extent along the axis of dy[c with axis coordinate j] where
// idx there is c's axis coordinate (0 where c lies outside idx's extent off the axis). In order, no atomics: the
// same sum every run. meta: rank dims of dx, then rank dims of idx (= dy's; both contiguous).
__kernel void gather_elements_grad(__global T* dx, ulong dx_off, __global const T* dy, ulong dy_off,
                                   __global const IT* idx, ulong idx_off, __constant const long* meta, int rank,
                                   int axis, long total) {
    const long i = get_global_id(0);
    if (i >= total) return;
    long r = i, o = 0, stride = 1, k = 0, axis_stride = 1;
    int inside = 1;
    for (int d = rank - 1; d >= 0; d--) {
        const long q = r % meta[d];
        r /= meta[d];
        if (d == axis) {
            k = q;
            axis_stride = stride;
        } else {
            inside &= q < meta[rank + d];
            o += q * stride;
        }
        stride *= meta[rank + d];
    }
    T acc = 0;
    if (inside) {
        for (long j = 0; j < meta[rank + axis]; j++) {
            long kj = idx[idx_off + o + j * axis_stride];
            if (kj < 0) kj += meta[axis];
            if (kj == k) acc += dy[dy_off + o + j * axis_stride];
        }
    }
    dx[dx_off + i] = acc;
}
