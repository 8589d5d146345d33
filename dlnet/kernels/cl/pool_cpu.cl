// Max and average pooling over one or two spatial dims on CPU devices: one work-item per output row of one
// (image, channel), the window clipped to the image once per row and once per column instead of a bounds test per
// tap and a division chain per output (pool.cl, one work-item per output). Pads are symmetric, as in pool.cl.
#if !defined(POOL_MAX) && !defined(POOL_AVG)
#error "pool_cpu.cl needs POOL_MAX or POOL_AVG"
#endif
#if !defined(T) || !defined(LOWEST)
#error "pool_cpu.cl needs T (element type) and LOWEST (its smallest value)"
#endif

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void pool_cpu(__global const T* x, ulong x_off, __global T* y, ulong y_off, int H, int W, int OH, int OW, int KH,
              int KW, int SH, int SW, int PH, int PW, int DH, int DW, int count_include_pad) {
    const int oy = get_global_id(0);
    const long nc = get_global_id(1);
    x += x_off + nc * H * W;
    y += y_off + (nc * OH + oy) * OW;
    const int iy0 = oy * SH - PH;
    int ky0 = 0, ky1 = KH, kyp = KH;  // taps [ky0, ky1) inside the image; [0, kyp) inside the padded image
    while (ky0 < KH && iy0 + ky0 * DH < 0) ky0++;
    while (ky1 > ky0 && iy0 + (ky1 - 1) * DH >= H) ky1--;
    while (kyp > 0 && iy0 + (kyp - 1) * DH >= H + PH) kyp--;
    for (int ox = 0; ox < OW; ox++) {
        const int ix0 = ox * SW - PW;
        int kx0 = 0, kx1 = KW, kxp = KW;
        while (kx0 < KW && ix0 + kx0 * DW < 0) kx0++;
        while (kx1 > kx0 && ix0 + (kx1 - 1) * DW >= W) kx1--;
        while (kxp > 0 && ix0 + (kxp - 1) * DW >= W + PW) kxp--;
#if defined(POOL_MAX)
        T acc = LOWEST;
#else
        float acc = 0.0f;
#endif
        for (int ky = ky0; ky < ky1; ky++) {
            __global const T* xr = x + (iy0 + ky * DH) * W + ix0;
            for (int kx = kx0; kx < kx1; kx++) {
                const T v = xr[kx * DW];
#if defined(POOL_MAX)
                acc = v > acc ? v : acc;
#else
                acc += v;
#endif
            }
        }
#if defined(POOL_AVG)
        // count_include_pad counts padding cells but never cells past the padded border (ceil_mode)
        const int n = count_include_pad ? kyp * kxp : (ky1 - ky0) * (kx1 - kx0);
        acc = n > 0 ? acc / n : 0.0f;
#endif
        y[ox] = acc;
    }
}
