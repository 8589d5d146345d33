// N-d padding: constant, reflect, edge or wrap. meta = [out dims (R), in dims (R), begins (R)].
#if !defined(T) || !defined(MODE)
#error "pad.cl needs T and MODE (0 constant, 1 reflect, 2 edge, 3 wrap)"
#endif
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
#elif MODE == 1
            const long period = 2 * (id - 1);
            if (period == 0) q = 0;
            else { q = q % period; if (q < 0) q += period; if (q >= id) q = period - q; }
#elif MODE == 2
            q = q < 0 ? 0 : id - 1;
#else
            q = q % id; if (q < 0) q += id;
#endif
        }
        src += q * stride;
        stride *= id;
    }
    y[y_off + i] = inside ? x[x_off + src] : value;
}
