// Direct convolution for CPU devices: each work-item computes RM output channels x CN consecutive output pixels,
// walking (c, ky, kx) with the pixel coordinates decoded once (the im2col macro of conv.cl divides per element).
// Work-groups of 16 along the pixel axis let PoCL vectorise across work-items.
#if !defined(RM) || !defined(CN) || !defined(ACT)
#error "conv_cpu.cl needs RM CN ACT(v)"
#endif
__kernel void conv2d(__global const float* x, ulong x_off, __global const float* w, ulong w_off,
                     __global const float* bias, ulong bias_off, __global const float* res, ulong res_off,
                     __global float* y, ulong y_off,
                     int C, int H, int W, int K, int OH, int OW, int KH, int KW, int SH, int SW, int PH, int PW,
                     int DH, int DW, int groups, int batch, long y_nstride, long res_nstride,
                     __global float* ws) {
    const int g = get_group_id(2);
    const int NN = batch * OH * OW, OHW = OH * OW, KK = C * KH * KW;
    const int n0 = get_global_id(0) * CN, m0 = get_global_id(1) * RM;
    if (n0 >= NN || m0 >= K) return;
    x += x_off + (long)g * C * H * W;
    w += w_off + ((long)g * K + m0) * KK;
    const long x_nstride = (long)C * groups * H * W;
    int iy0[CN], ix0[CN];
    long base[CN];
    for (int j = 0; j < CN; j++) {
        const int n = min(n0 + j, NN - 1);
        const int img = n / OHW, p = n % OHW;
        iy0[j] = (p / OW) * SH - PH;
        ix0[j] = (p % OW) * SW - PW;
        base[j] = img * x_nstride;
    }
    const int rows = min(RM, K - m0);
    float acc[RM][CN];
    for (int i = 0; i < RM; i++)
        for (int j = 0; j < CN; j++) acc[i][j] = 0.0f;
    for (int c = 0; c < C; c++) {
        __global const float* xc = x + (long)c * H * W;
        for (int ky = 0; ky < KH; ky++) {
            for (int kx = 0; kx < KW; kx++) {
                float b[CN];
                for (int j = 0; j < CN; j++) {
                    const int iy = iy0[j] + ky * DH, ix = ix0[j] + kx * DW;
                    b[j] = (iy >= 0 && iy < H && ix >= 0 && ix < W) ? xc[base[j] + iy * W + ix] : 0.0f;
                }
                const int k = (c * KH + ky) * KW + kx;
                for (int i = 0; i < RM; i++) {
                    const float a = i < rows ? w[(long)i * KK + k] : 0.0f;
                    for (int j = 0; j < CN; j++) acc[i][j] = fma(a, b[j], acc[i][j]);
                }
            }
        }
    }
    y += y_off + (long)g * K * OHW;
    res += res_off + (long)g * K * OHW;
    for (int j = 0; j < CN; j++) {
        const int n = n0 + j;
        if (n >= NN) break;
        const long img = n / OHW, p = n % OHW;
        for (int i = 0; i < rows; i++) {
            const int m = m0 + i;
            float v = acc[i][j];
#if defined(HAS_BIAS)
            v += bias[bias_off + g * K + m];
#endif
#if defined(HAS_RES)
            v += res[img * res_nstride + (long)m * OHW + p];
#endif
            y[img * y_nstride + (long)m * OHW + p] = ACT(v);
        }
    }
}
