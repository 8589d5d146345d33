// Direct depthwise convolution (groups == channels, one filter each): one work-item per output pixel.
#ifndef ACT
#error "dwconv.cl needs ACT(v)"
#endif
// conv_half.cl comes first: the operands' types and loads (half where precision "fp16" stores them so)
__kernel void dwconv2d(__global const X_T* x, ulong x_off, __global const W_T* w, ulong w_off,
                       __global const BIAS_T* bias, ulong bias_off, __global const RES_T* res, ulong res_off,
                       __global Y_T* y, ulong y_off, int C, int H, int W, int OH, int OW, int KH, int KW,
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
            acc = fma(LDX(iy * W + ix), LDW(ky * KW + kx), acc);
        }
    }
#if defined(HAS_BIAS)
    acc += LDBIAS(bias_off + co);
#endif
    const long pix = (long)oy * OW + ox;
#if defined(HAS_RES)
    acc += LDRES(res_off + n * res_nstride + (long)co * OH * OW + pix);
#endif
    STY(y_off + n * y_nstride + (long)co * OH * OW + pix, ACT(acc));
}

// Tiled (stride 1, dilation 1, one output channel per input channel; KHC x KWC taps compiled in): a work-group of
// TX x TY work-items computes a (TX * PX) x TY block of one (image, channel) plane, work-item (lx, ly) the outputs
// (ox0 + lx + TX * p, oy0 + ly), p < PX (strided, so that neighbouring work-items read neighbouring words). The input
// block with its halo and the plane's taps sit in __local memory: each input word is read from global memory once
// per block, not once per tap (ConvNeXt's 7 x 7 layers).
#if defined(TX) && defined(TY) && defined(PX) && defined(KHC) && defined(KWC)
#define BW (TX * PX)
#define IW (BW + KWC - 1)
#define IH (TY + KHC - 1)
__kernel __attribute__((reqd_work_group_size(TX, TY, 1)))
void dwconv2d_tiled(__global const X_T* x, ulong x_off, __global const W_T* w, ulong w_off,
                    __global const BIAS_T* bias, ulong bias_off, __global const RES_T* res, ulong res_off,
                    __global Y_T* y, ulong y_off, int C, int H, int W, int OH, int OW, int PH, int PW,
                    long y_nstride, long res_nstride) {
    __local float tile[IH * IW];
    __local float taps[KHC * KWC];
    const int lx = get_local_id(0), ly = get_local_id(1), lid = ly * TX + lx;
    const int ox0 = get_group_id(0) * BW, oy0 = get_group_id(1) * TY;
    const int nc = get_group_id(2), n = nc / C, c = nc % C;
    x += x_off + (long)nc * H * W;
    for (int e = lid; e < IH * IW; e += TX * TY) {
        const int r = e / IW, q = e % IW;
        const int iy = oy0 - PH + r, ix = ox0 - PW + q;
        tile[e] = iy >= 0 && iy < H && ix >= 0 && ix < W ? LDX(iy * W + ix) : 0.0f;
    }
    for (int e = lid; e < KHC * KWC; e += TX * TY) taps[e] = LDW(w_off + (long)c * KHC * KWC + e);
    barrier(CLK_LOCAL_MEM_FENCE);
    float acc[PX];
    for (int p = 0; p < PX; p++) acc[p] = 0.0f;
    for (int ky = 0; ky < KHC; ky++)
        for (int kx = 0; kx < KWC; kx++) {
            const float t = taps[ky * KWC + kx];
            for (int p = 0; p < PX; p++) acc[p] = fma(tile[(ly + ky) * IW + lx + TX * p + kx], t, acc[p]);
        }
    const int oy = oy0 + ly;
    if (oy >= OH) return;
    for (int p = 0; p < PX; p++) {
        const int ox = ox0 + lx + TX * p;
        if (ox >= OW) continue;
        float v = acc[p];
#if defined(HAS_BIAS)
        v += LDBIAS(bias_off + c);
#endif
        const long pix = (long)oy * OW + ox;
#if defined(HAS_RES)
        v += LDRES(res_off + n * res_nstride + (long)c * OH * OW + pix);
#endif
        STY(y_off + n * y_nstride + (long)c * OH * OW + pix, ACT(v));
    }
}
#endif
