// N-d padding: constant, reflect, edge or wrap. meta = [out dims (R), in dims (R), begins (R)].
#if !defined(T) || !defined(MODE)
#error "pad.cl needs T and MODE (0 constant, 1 reflect, 2 edge, 3 wrap)"
#endif
inline long pad_index(long q, long id) {  // source index of q (outside [0, id)) along one dim
#if MODE == 1
    const long period = 2 * (id - 1);
    if (period == 0) return 0;
    q = q % period; if (q < 0) q += period;
    return q >= id ? period - q : q;
#elif MODE == 2
    return q < 0 ? 0 : id - 1;
#else
    q = q % id; return q < 0 ? q + id : q;
#endif
}

__kernel void pad(__global T* y, ulong y_off, __global const T* x, ulong x_off, __constant const long* meta,
                  int R, T value, long total) {
    const long i = get_global_id(0);
    if (i >= total) return;
    long r = i, src = 0, stride = 1;
    bool inside = true;
    for (int d = R - 1; d >= 0; d--) {
        const long od = meta[d], id = meta[R + d], b = meta[2 * R + d];
        long q = r % od - b;
        r /= od;
        if (q < 0 || q >= id) {
#if MODE == 0
            inside = false;
#else
            q = pad_index(q, id);
#endif
        }
        src += q * stride;
        stride *= id;
    }
    y[y_off + i] = inside ? x[x_off + src] : value;
}

// CPU devices: one work-item per output row (last dim), its source row found once; the interior is a plain copy
__kernel void pad_rows(__global T* y, ulong y_off, __global const T* x, ulong x_off, __constant const long* meta,
                       int R, T value, long rows) {
    const long row = get_global_id(0);
    if (row >= rows) return;
    long r = row, src = 0, stride = meta[2 * R - 1];
    bool inside = true;
    for (int d = R - 2; d >= 0; d--) {
        const long od = meta[d], id = meta[R + d], b = meta[2 * R + d];
        long q = r % od - b;
        r /= od;
        if (q < 0 || q >= id) {
#if MODE == 0
            inside = false;
#else
            q = pad_index(q, id);
#endif
        }
        src += q * stride;
        stride *= id;
    }
    const long on = meta[R - 1], in = meta[2 * R - 1], b = meta[3 * R - 1];
    __global T* yr = y + y_off + row * on;
    __global const T* xr = x + x_off + src;
    if (!inside) {
        for (long j = 0; j < on; j++) yr[j] = value;
        return;
    }
    const long j0 = b < 0 ? 0 : b, j1 = b + in < on ? b + in : on;  // [j0, j1): inside the source row
    for (long j = 0; j < j0 && j < on; j++) {
#if MODE == 0
        yr[j] = value;
#else
        yr[j] = xr[pad_index(j - b, in)];
#endif
    }
    for (long j = j0; j < j1; j++) yr[j] = xr[j - b];
    for (long j = j1 > j0 ? j1 : j0; j < on; j++) {
#if MODE == 0
        yr[j] = value;
#else
        yr[j] = xr[pad_index(j - b, in)];
#endif
    }
}
