// Direct depthwise convolution (groups == channels, one filter each): one work-item per output pixel.
#ifndef ACT
#error "dwconv.cl needs ACT(v)"
#endif
__kernel void dwconv2d(__global const float* x, ulong x_off, __global const float* w, ulong w_off,
                       __global const float* bias, ulong bias_off, __global const float* res, ulong res_off,
                       __global float* y, ulong y_off, int C, int H, int W, int OH, int OW, int KH, int KW,
                       int SH, int SW, int PH, int PW, int DH, int DW, int M, long y_nstride, long res_nstride) {
    // M: output channels per input channel (depth multiplier)
    const int ox = get_global_id(0), oy = get_global_id(1), nc = get_global_id(2);
    if (ox >= OW || oy >= OH) return;
    const int CO = C * M;
    const int n = nc / CO, co = nc % CO, ci = co / M;
    x += x_off + ((long)n * C + ci) * H * W;
    w += w_off + (long)co * KH * KW;
    float acc = 0.0f;
    for (int ky = 0; ky < KH; ky++) {
        const int iy = oy * SH - PH + ky * DH;
        if (iy < 0 || iy >= H) continue;
        for (int kx = 0; kx < KW; kx++) {
            const int ix = ox * SW - PW + kx * DW;
            if (ix < 0 || ix >= W) continue;
            acc = fma(x[iy * W + ix], w[ky * KW + kx], acc);
        }
    }
#if defined(HAS_BIAS)
    acc += bias[bias_off + co];
#endif
    const long pix = (long)oy * OW + ox;
#if defined(HAS_RES)
    acc += res[res_off + n * res_nstride + (long)co * OH * OW + pix];
#endif
    y[y_off + n * y_nstride + (long)co * OH * OW + pix] = ACT(acc);
}
