// Max and average pooling over up to three spatial dims (missing dims have extent 1), one work-item per output.
// Pads are symmetric here: asymmetric (TF-style) padding arrives as an explicit Pad node before the pool.
#if !defined(POOL_MAX) && !defined(POOL_AVG)
#error "pool.cl needs POOL_MAX or POOL_AVG"
#endif
#if !defined(T) || !defined(LOWEST)
#error "pool.cl needs T (element type) and LOWEST (its smallest value)"
#endif
// precision "fp16" (kernels/half.py): X_HALF / Y_HALF store x / y in half (T, the arithmetic's type, is then float)
#if defined(X_HALF)
#define X_T half
#define LDX(p, i) vload_half(i, p)
#else
#define X_T T
#define LDX(p, i) (p)[i]
#endif
#if defined(Y_HALF)
#define Y_T half
#define STY(p, i, v) vstore_half(v, i, p)
#else
#define Y_T T
#define STY(p, i, v) (p)[i] = (v)
#endif
__kernel void pool(__global const X_T* x, ulong x_off, __global Y_T* y, ulong y_off,
                   int D, int H, int W, int OD, int OH, int OW, int KD, int KH, int KW, int SD, int SH, int SW,
                   int PD, int PH, int PW, int DD, int DH, int DW, int count_include_pad, long total) {
    const long i = get_global_id(0);
    if (i >= total) return;
    const int ox = i % OW; long t = i / OW;
    const int oy = t % OH; t /= OH;
    const int oz = t % OD; const long nc = t / OD;
    x += x_off + nc * D * H * W;
#if defined(POOL_MAX)
    T acc = LOWEST;
#else
    float acc = 0.0f;
    int n = 0;
#endif
    for (int kz = 0; kz < KD; kz++) {
        const int iz = oz * SD - PD + kz * DD;
        for (int ky = 0; ky < KH; ky++) {
            const int iy = oy * SH - PH + ky * DH;
            for (int kx = 0; kx < KW; kx++) {
                const int ix = ox * SW - PW + kx * DW;
                const bool inside = iz >= 0 && iz < D && iy >= 0 && iy < H && ix >= 0 && ix < W;
#if defined(POOL_MAX)
                if (inside) { const T v = LDX(x, ((long)iz * H + iy) * W + ix); acc = v != v ? v : (v > acc ? v : acc); }
#else
                // count_include_pad counts padding cells but never cells past the padded border (ceil_mode)
                const bool in_pad = iz < D + PD && iy < H + PH && ix < W + PW;
                if (inside) acc += LDX(x, ((long)iz * H + iy) * W + ix);
                if (inside || (count_include_pad && in_pad)) n++;
#endif
            }
        }
    }
#if defined(POOL_AVG)
    acc = n > 0 ? acc / n : 0.0f;
#endif
    STY(y, y_off + i, acc);
}
