// GridSample: y[n, c, o...] = x[n, c] interpolated at grid[n, o...] (normalised coordinates, innermost dim first),
// one work-item per output element. As onnx.reference (and PyTorch's GridSampler.h): denormalise, round (nearest,
// half to even), bring a coordinate outside [lo, hi] back by clamping (border) or reflecting (reflection), then read
// the taps, each with the padding mode's rule (zeros: 0 outside).
// R: spatial rank (1-3); MODE: 0 nearest, 1 linear, 2 cubic (Keys, a = -0.75); PAD: 0 zeros, 1 border,
// 2 reflection; ALIGN: align_corners. meta: input dims (R), then output dims (R).
#if !defined(R) || !defined(MODE) || !defined(PAD) || !defined(ALIGN)
#error "gridsample.cl needs R, MODE, PAD and ALIGN"
#endif
#if MODE == 0
#define TAPS 1
#elif MODE == 1
#define TAPS 2
#else
#define TAPS 4
#endif

inline float lo_border(int len) { return ALIGN ? 0.0f : -0.5f; }
inline float hi_border(int len) { return ALIGN ? len - 1.0f : len - 0.5f; }

inline float reflect(float v, float lo, float hi) {  // by the nearer border until inside
    const float range = hi - lo;
    if (v < lo) {
        const float dv = lo - v;
        const int k = (int)(dv / range);
        const float r = dv - k * range;
        return k % 2 == 0 ? lo + r : hi - r;
    }
    if (v > hi) {
        const float dv = v - hi;
        const int k = (int)(dv / range);
        const float r = dv - k * range;
        return k % 2 == 0 ? hi - r : lo + r;
    }
    return v;
}

inline int tap(int i, int len) {  // the index a tap at i reads, -1 for a zero
#if PAD == 0
    return i >= 0 && i < len ? i : -1;
#elif PAD == 1
    return clamp(i, 0, len - 1);
#else
    return (int)reflect((float)i, lo_border(len), hi_border(len));
#endif
}

// the taps' weights w and their slopes dw / dt at fraction t
inline void coeffs(float t, float* w, float* dw) {
#if MODE == 0
    w[0] = 1.0f;
    dw[0] = 0.0f;
#elif MODE == 1
    w[0] = 1.0f - t;
    w[1] = t;
    dw[0] = -1.0f;
    dw[1] = 1.0f;
#else
    const float a = -0.75f;
    const float t1 = t + 1.0f, s = 1.0f - t, s1 = 2.0f - t;
    w[0] = ((a * t1 - 5.0f * a) * t1 + 8.0f * a) * t1 - 4.0f * a;
    w[1] = ((a + 2.0f) * t - (a + 3.0f)) * t * t + 1.0f;
    w[2] = ((a + 2.0f) * s - (a + 3.0f)) * s * s + 1.0f;
    w[3] = ((a * s1 - 5.0f * a) * s1 + 8.0f * a) * s1 - 4.0f * a;
    dw[0] = (3.0f * a * t1 - 10.0f * a) * t1 + 8.0f * a;
    dw[1] = (3.0f * (a + 2.0f) * t - 2.0f * (a + 3.0f)) * t;
    dw[2] = -(3.0f * (a + 2.0f) * s - 2.0f * (a + 3.0f)) * s;
    dw[3] = -((3.0f * a * s1 - 10.0f * a) * s1 + 8.0f * a);
#endif
}

// One spatial axis of length len at normalised coordinate nv: the taps' indices (-1: a zero), weights, and the
// weights' slopes d w / d nv (the denormalising scale times the padding's slope: 0 where border clamps, -1 or +1
// where reflection mirrors)
inline void axis_taps(float nv, int len, int* idx, float* w, float* dw) {
    const float scale = ALIGN ? 0.5f * (len - 1) : 0.5f * len;
    float v = ALIGN ? (nv + 1.0f) * scale : ((nv + 1.0f) * len - 1.0f) * 0.5f;
    float slope = 1.0f;
#if MODE == 0
    v = rint(v);
#endif
    const float lo = lo_border(len), hi = hi_border(len);
    if (v < lo || v > hi) {
#if PAD == 1
        v = clamp(v, 0.0f, len - 1.0f);
        slope = 0.0f;
#elif PAD == 2
        const float far = v < lo ? lo - v : v - hi;
        slope = ((int)(far / (hi - lo))) % 2 == 0 ? -1.0f : 1.0f;
        v = reflect(v, lo, hi);
#endif
    }
#if MODE == 0
    const int first = (int)v;  // (truncated, as the reference's astype)
    coeffs(0.0f, w, dw);
#else
    const float f = floor(v);
    const int first = (int)f - (TAPS == 4 ? 1 : 0);
    coeffs(v - f, w, dw);
#endif
    for (int t = 0; t < TAPS; t++) {
        idx[t] = tap(first + t, len);
        dw[t] *= scale * slope;
    }
}

__kernel void gridsample(__global const float* x, ulong x_off, __global const float* grid, ulong grid_off,
                         __global float* y, ulong y_off, __constant const int* dims, int C, long total) {
    const long i = get_global_id(0);
    if (i >= total) return;
    long out_size = 1, in_size = 1;
    for (int d = 0; d < R; d++) {
        out_size *= dims[R + d];
        in_size *= dims[d];
    }
    const long o = i % out_size, nc = i / out_size, n = nc / C;
    __global const float* g = grid + grid_off + (n * out_size + o) * R;
    __global const float* xp = x + x_off + nc * in_size;
    int idx[R][TAPS];
    float w[R][TAPS], dw[R][TAPS];
    for (int d = 0; d < R; d++) axis_taps(g[R - 1 - d], dims[d], idx[d], w[d], dw[d]);  // (last: innermost dim)
    float acc = 0.0f;
    int combo = 1;
    for (int d = 0; d < R; d++) combo *= TAPS;
    for (int k = 0; k < combo; k++) {
        int rest = k;
        long off = 0;
        float wt = 1.0f;
        bool inside = true;
        for (int d = R - 1; d >= 0; d--) {  // tap t_d of each dim, the innermost varying fastest
            const int t = rest % TAPS;
            rest /= TAPS;
            inside = inside && idx[d][t] >= 0;
            wt *= w[d][t];
        }
        if (!inside) continue;
        rest = k;
        long stride = 1;
        for (int d = R - 1; d >= 0; d--) {
            const int t = rest % TAPS;
            rest /= TAPS;
            off += idx[d][t] * stride;
            stride *= dims[d];
        }
        acc += wt * xp[off];
    }
    y[y_off + i] = acc;
}

// dx += v at p for positions that share taps: a compare-and-swap loop on the float's bits (the order of the adds
// varies between runs, as PyTorch's atomicAdd does; dx is zero-filled first)
inline void add_float(volatile __global float* p, float v) {
    union { unsigned int u; float f; } old, sum;
    do {
        old.f = *p;
        sum.f = old.f + v;
    } while (atomic_cmpxchg((volatile __global unsigned int*)p, old.u, sum.u) != old.u);
}

// GridSample's gradient: one work-item per output position (n, o), over the channels. dx[n, c, tap] += w dy[n, c, o];
// dgrid[n, o, R - 1 - d] = sum over c and taps of dy x[n, c, tap] dw_d prod_{e != d} w_e.
__kernel void gridsample_grad(__global const float* dy, ulong dy_off, __global const float* x, ulong x_off,
                              __global const float* grid, ulong grid_off, __global float* dx, ulong dx_off,
                              __global float* dgrid, ulong dgrid_off, __constant const int* dims, int C, long total) {
    const long i = get_global_id(0);
    if (i >= total) return;
    long out_size = 1, in_size = 1;
    for (int d = 0; d < R; d++) {
        out_size *= dims[R + d];
        in_size *= dims[d];
    }
    const long o = i % out_size, n = i / out_size;
    __global const float* g = grid + grid_off + i * R;
    int idx[R][TAPS];
    float w[R][TAPS], dw[R][TAPS];
    for (int d = 0; d < R; d++) axis_taps(g[R - 1 - d], dims[d], idx[d], w[d], dw[d]);
    int combo = 1;
    for (int d = 0; d < R; d++) combo *= TAPS;
    float dg[R];
    for (int d = 0; d < R; d++) dg[d] = 0.0f;
    for (int k = 0; k < combo; k++) {
        int taps[R];
        int rest = k;
        bool inside = true;
        long off = 0, stride = 1;
        for (int d = R - 1; d >= 0; d--) {
            taps[d] = rest % TAPS;
            rest /= TAPS;
            inside = inside && idx[d][taps[d]] >= 0;
            off += idx[d][taps[d]] * stride;
            stride *= dims[d];
        }
        if (!inside) continue;
        float wt = 1.0f, part[R];
        for (int d = 0; d < R; d++) {
            wt *= w[d][taps[d]];
            part[d] = 1.0f;
            for (int e = 0; e < R; e++) part[d] *= e == d ? dw[e][taps[e]] : w[e][taps[e]];
        }
        float seen = 0.0f;  // sum over c of dy x at this tap
        for (int c = 0; c < C; c++) {
            const long nc = n * C + c;
            const float gy = dy[dy_off + nc * out_size + o];
            add_float(dx + dx_off + nc * in_size + off, gy * wt);
            seen += gy * x[x_off + nc * in_size + off];
        }
        for (int d = 0; d < R; d++) dg[d] += seen * part[d];
    }
    for (int d = 0; d < R; d++) dgrid[dgrid_off + i * R + (R - 1 - d)] = dg[d];
}
