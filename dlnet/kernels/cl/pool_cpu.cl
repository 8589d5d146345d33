// Max and average pooling over one or two spatial dims on CPU devices: one work-item per output row of one
// (image, channel). The window's shape, strides and dilations are compile-time (KH KW SH SW DH DW), so its loops
// unroll. Per row, the window is clipped to the image once; the columns whose windows lie inside the image (all but
// a few at each edge) run without clipping, eight outputs at a time as float8 where the stride is 1 or 2 (VEC).
// Pads are symmetric, as in pool.cl.
#if !defined(POOL_MAX) && !defined(POOL_AVG)
#error "pool_cpu.cl needs POOL_MAX or POOL_AVG"
#endif
#if !defined(T) || !defined(LOWEST) || !defined(KH) || !defined(KW) || !defined(SH) || !defined(SW) || \
    !defined(DH) || !defined(DW)
#error "pool_cpu.cl needs T (element type), LOWEST (its smallest value) and the window KH KW SH SW DH DW"
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
#if defined(POOL_MAX)
#define ACC_T T
#define INIT LOWEST
#define ADD(acc, v) { const T v1_ = (v); acc = v1_ != v1_ ? v1_ : (v1_ > acc ? v1_ : acc); }  // a NaN wins and stays
#define ADD8(acc, v) { const float8 v_ = (v); acc = v_ != v_ ? v_ : (v_ > acc ? v_ : acc); }
#else
#define ACC_T float
#define INIT 0.0f
#define ADD(acc, v) acc += (v)
#define ADD8(acc, v) acc += (v)
#endif
#define IMIN(a, b) ((a) < (b) ? (a) : (b))  // (PoCL calls min() and max() out of line: conv_cpu.cl)
#define IMAX(a, b) ((a) > (b) ? (a) : (b))
typedef float8 __attribute__((aligned(4))) float8u;  // unaligned vector loads (PoCL's vload8 went element-wise)
#if SW == 1
#define LOAD8(p) (*(__global const float8u*)(p))
#elif SW == 2
#define LOAD8(p) load8_even(p)
inline float8 load8_even(__global const float* p) {  // p[0], p[2], ..., p[14]
    const float8 a = *(__global const float8u*)p, b = *(__global const float8u*)(p + 8);
    return (float8)(a.even, b.even);
}
#endif

// skip: the interior columns before it are written already (pool_cpu_sep's vectors)
inline void pool_row(__global const X_T* x, __global Y_T* y, int oy, int H, int W, int OW, int PH, int PW,
                     int count_include_pad, int skip) {
    const int iy0 = oy * SH - PH;
    int ky0 = 0, ky1 = KH, kyp = KH;  // taps [ky0, ky1) inside the image; [0, kyp) inside the padded image
    while (ky0 < KH && iy0 + ky0 * DH < 0) ky0++;
    while (ky1 > ky0 && iy0 + (ky1 - 1) * DH >= H) ky1--;
    while (kyp > 0 && iy0 + (kyp - 1) * DH >= H + PH) kyp--;
    // columns [oxa, oxb): every tap inside the image
    const int oxa = IMIN(OW, (PW + SW - 1) / SW);
    const int last = W - 1 - (KW - 1) * DW + PW;
    const int oxb = IMAX(oxa, IMIN(OW, last >= 0 ? last / SW + 1 : 0));
    for (int ox = 0; ox < OW; ox++) {
        if (ox == oxa) {  // the interior
            ox = ox > skip ? ox : skip;
#if defined(VEC) && (SW == 1 || SW == 2)
            // SW 2 reads 16 values from each tap's start: the 16th lies under the next interior window
            for (; ox + 8 + (SW - 1) <= oxb; ox += 8) {
                float8 acc = (float8)(INIT);
                for (int ky = ky0; ky < ky1; ky++) {
                    __global const X_T* xr = x + (iy0 + ky * DH) * W + ox * SW - PW;
                    #pragma unroll
                    for (int kx = 0; kx < KW; kx++)
                        ADD8(acc, LOAD8(xr + kx * DW));
                }
#if defined(POOL_AVG)
                const int n = count_include_pad ? kyp * KW : (ky1 - ky0) * KW;
                acc = n > 0 ? acc / (float)n : (float8)(0.0f);
#endif
                *(__global float8u*)(y + ox) = acc;
            }
#endif
            for (; ox < oxb; ox++) {
                ACC_T acc = INIT;
                for (int ky = ky0; ky < ky1; ky++) {
                    __global const X_T* xr = x + (iy0 + ky * DH) * W + ox * SW - PW;
                    #pragma unroll
                    for (int kx = 0; kx < KW; kx++)
                        ADD(acc, LDX(xr, kx * DW));
                }
#if defined(POOL_AVG)
                const int n = count_include_pad ? kyp * KW : (ky1 - ky0) * KW;
                acc = n > 0 ? acc / n : 0.0f;
#endif
                STY(y, ox, acc);
            }
            if (ox >= OW) break;
        }
        // an edge column: the window clipped to the image
        const int ix0 = ox * SW - PW;
        int kx0 = 0, kx1 = KW, kxp = KW;
        while (kx0 < KW && ix0 + kx0 * DW < 0) kx0++;
        while (kx1 > kx0 && ix0 + (kx1 - 1) * DW >= W) kx1--;
        while (kxp > 0 && ix0 + (kxp - 1) * DW >= W + PW) kxp--;
        ACC_T acc = INIT;
        for (int ky = ky0; ky < ky1; ky++) {
            __global const X_T* xr = x + (iy0 + ky * DH) * W + ix0;
            for (int kx = kx0; kx < kx1; kx++)
                ADD(acc, LDX(xr, kx * DW));
        }
#if defined(POOL_AVG)
        // count_include_pad counts padding cells but never cells past the padded border (ceil_mode)
        const int n = count_include_pad ? kyp * kxp : (ky1 - ky0) * (kx1 - kx0);
        acc = n > 0 ? acc / n : 0.0f;
#endif
        STY(y, ox, acc);
    }
}

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void pool_cpu(__global const X_T* x, ulong x_off, __global Y_T* y, ulong y_off, int H, int W, int OH, int OW, int PH,
              int PW, int count_include_pad) {
    const long nc = get_global_id(1);
    x += x_off + nc * H * W;
    for (int oy = get_global_id(0) * ROWS; oy < IMIN(OH, (int)(get_global_id(0) + 1) * ROWS); oy++)
        pool_row(x, y + y_off + (nc * OH + oy) * OW, oy, H, W, OW, PH, PW, count_include_pad, 0);
}

#if defined(SEPARABLE) && defined(POOL_MAX) && KH == 3 && KW == 3 && SH == 2 && SW == 2 && DH == 1 && DW == 1
// MaxPool 3x3 stride 2 (float, SEPARABLE; built without VEC; pads under 3, so that every window meets the image).
// Per 8 columns, each input row's 3-wide maxima once, kept for the next output row, which shares that row: 2 rows of
// 4 loads per output vector. A row's even, odd and next even columns are each one shufps of two loads, so that their
// lanes hold outputs 0 1 4 5 2 3 6 7, put in order once per output vector (vpermpd); the maxima are plain (maxps:
// x > m ? x : m, which drops a NaN x) and NaNs go apart as a mask, x != x ORed over the window and blended in once per
// output vector. A window's taps outside the image read the nearest tap inside, which lies in the same window, so the
// maximum stands and no row or column needs a bounds check. Against row_max8 of .even / .odd composites and a NaN test
// per step (3 shuffles of 2 instructions and 3 x 4 instructions of maxima per row) with pool_row's clipped loops for
// the last columns (2 cores, interleaved, a slow spell): squeezenet 1.1's pool1 ([1, 64, 111, 111]) 0.188 -> 0.105
// ms, squeezenet's pool3 (27 -> 13) 0.140 -> 0.047, resnet50's 0.202 -> 0.121. pool_row for a last column alone cost
// more than pool_col (squeezenet's pool2, 54 -> 27: 0.092 -> 0.069 ms), and its calls even where no column was left.
#define MAXP(a, b) ((a) > (b) ? (a) : (b))
#define NANV(v) ((v) != (v))
#define CLAMP(i, n) ((i) < 0 ? 0 : (i) < (n) ? (i) : (n) - 1)
inline float8 row_max8(__global const float* p, int8* nan) {  // max(p[2 i], p[2 i + 1], p[2 i + 2]), lanes as above
    const float8 a = *(__global const float8u*)p, b = *(__global const float8u*)(p + 8);
    const float8 c = *(__global const float8u*)(p + 2), d = *(__global const float8u*)(p + 9);  // (p[16] the last)
    const float8 e0 = (float8)(a.s0, a.s2, b.s0, b.s2, a.s4, a.s6, b.s4, b.s6);  // p[2 i]
    const float8 o = (float8)(a.s1, a.s3, b.s1, b.s3, a.s5, a.s7, b.s5, b.s7);   // p[2 i + 1]
    const float8 e1 = (float8)(c.s0, c.s2, d.s1, d.s3, c.s4, c.s6, d.s5, d.s7);  // p[2 i + 2]
    *nan = NANV(e0) | NANV(o) | NANV(e1);
    return MAXP(e1, MAXP(o, e0));
}

// output columns ox..ox + 7 of rows [oy0, oy1), their windows' columns inside the image. (Rows inside the image in a
// loop of their own, without the clamps, ran no faster; nor did #pragma unroll 2, which ran 30% slower.)
inline void pool_sep8(__global const float* x, __global float* y, int ox, int oy0, int oy1, int H, int W, int OW,
                      int PH, int PW) {
    x += ox * 2 - PW;
    y += ox;
    int8 n0, n1, n2;
    float8 m0 = row_max8(x + CLAMP(oy0 * 2 - PH, H) * W, &n0);
    for (int oy = oy0; oy < oy1; oy++) {
        const int iy = oy * 2 - PH;
        const float8 m1 = row_max8(x + CLAMP(iy + 1, H) * W, &n1), m2 = row_max8(x + CLAMP(iy + 2, H) * W, &n2);
        *(__global float8u*)(y + oy * OW) = ((n0 | n1 | n2) ? (float8)(NAN) : MAXP(m2, MAXP(m1, m0))).s01452367;
        m0 = m2;  // (the next output row's first input row)
        n0 = n2;
    }
}

// output column ox of rows [oy0, oy1), scalar, as pool_sep8
inline void pool_col(__global const float* x, __global float* y, int ox, int oy0, int oy1, int H, int W, int OW,
                     int PH, int PW) {
    const int ix0 = ox * 2 - PW, c0 = CLAMP(ix0, W), c1 = CLAMP(ix0 + 1, W), c2 = CLAMP(ix0 + 2, W);
    float shared = 0.0f;  // row_max of input row `row`, and whether it read a NaN
    int shared_nan = 0, row = -1;
    for (int oy = oy0; oy < oy1; oy++) {
        float acc = -INFINITY;
        int nan = 0;
        for (int ky = 0; ky < 3; ky++) {
            const int iy = CLAMP(oy * 2 - PH + ky, H);
            if (iy != row) {
                __global const float* p = x + iy * W;
                const float a = p[c0], b = p[c1], c = p[c2];
                shared = MAXP(c, MAXP(b, a));
                shared_nan = NANV(a) | NANV(b) | NANV(c);
                row = iy;
            }
            acc = MAXP(shared, acc);
            nan |= shared_nan;
        }
        y[oy * OW + ox] = nan ? NAN : acc;
    }
}

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void pool_cpu_sep(__global const float* x, ulong x_off, __global float* y, ulong y_off, int H, int W, int OH, int OW,
                  int PH, int PW, int count_include_pad) {
    const long nc = get_global_id(1);
    x += x_off + nc * H * W;
    y += y_off + nc * OH * OW;
    const int oy0 = get_global_id(0) * ROWS, oy1 = IMIN(OH, (int)(get_global_id(0) + 1) * ROWS);
    // vectors over the columns [oxa, oxb) whose windows lie inside the image (pool_row's interior), the last one
    // overlapping the one before; pool_col's for the rest
    const int oxa = IMIN(OW, (PW + 1) / 2), last = W - 3 + PW;
    const int oxb = IMAX(oxa, IMIN(OW, last >= 0 ? last / 2 + 1 : 0));
    int ox = oxa;
    for (; ox + 8 <= oxb; ox += 8)
        pool_sep8(x, y, ox, oy0, oy1, H, W, OW, PH, PW);
    if (ox > oxa && ox < oxb) {
        pool_sep8(x, y, oxb - 8, oy0, oy1, H, W, OW, PH, PW);
        ox = oxb;
    }
    for (int c = 0; c < oxa + OW - ox; c++)
        pool_col(x, y, c < oxa ? c : ox + c - oxa, oy0, oy1, H, W, OW, PH, PW);
}
#endif
