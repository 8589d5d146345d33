// Convolution as implicit GEMM: rows = output channels of a group, columns = (image, oy, ox), depth = (c, ky, kx).
// Epilogue: + bias, + residual, activation (ACT(v) define), written at out_nstride so a Concat can own the buffer.
#ifndef ACT
#error "conv.cl needs ACT(v)"
#endif
#define KERNEL_NAME conv2d
#define KERNEL_ARGS \
    __global const float* x, ulong x_off, __global const float* w, ulong w_off, \
    __global const float* bias, ulong bias_off, __global const float* res, ulong res_off, \
    __global float* y, ulong y_off, \
    int C, int H, int W, int K, int OH, int OW, int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW, \
    int groups, int batch, long y_nstride, long res_nstride
#define PROLOGUE \
    const int g = ZID; \
    const int M = K; const int NN = batch * OH * OW; const int KK = C * KH * KW; \
    x += x_off + (long)g * C * H * W; w += w_off + (long)g * K * KK; bias += bias_off + g * K; \
    y += y_off + (long)g * K * OH * OW; res += res_off + (long)g * K * OH * OW; \
    const long x_nstride = (long)C * groups * H * W; const int OHW = OH * OW;
#define LOAD_A(m, k) w[(long)(m) * KK + (k)]
#if defined(B_FROM_COL)  // im2col already wrote B to the work buffer (CPU path), one group at a time
#define LOAD_B(k, n) ws[((long)g * KK + (k)) * NN + (n)]
#define LOAD_B8(k, n) vload8(0, ws + ((long)g * KK + (k)) * NN + (n))
#elif defined(IS_1X1)
#define LOAD_B(k, n) x[((n) / OHW) * x_nstride + (long)(k) * H * W + ((n) % OHW)]
#if defined(ONE_IMAGE)  // batch 1: B is x itself, contiguous along n
#define LOAD_B8(k, n) vload8(0, x + (long)(k) * OHW + (n))
#endif
#else
inline float im2col(__global const float* x, int k, int n, int H, int W, int OH, int OW, int KH, int KW, int SH,
                    int SW, int PH, int PW, int DH, int DW, long x_nstride) {
    const int kx = k % KW; const int t = k / KW; const int ky = t % KH; const int c = t / KH;
    const int ox = n % OW; const int t2 = n / OW; const int oy = t2 % OH; const int img = t2 / OH;
    const int iy = oy * SH - PH + ky * DH; const int ix = ox * SW - PW + kx * DW;
    if (iy < 0 || iy >= H || ix < 0 || ix >= W) return 0.0f;
    return x[img * x_nstride + ((long)c * H + iy) * W + ix];
}
#define LOAD_B(k, n) im2col(x, k, n, H, W, OH, OW, KH, KW, SH, SW, PH, PW, DH, DW, x_nstride)
#endif
#if defined(HAS_RES)
#define RES(m, n) res[((n) / OHW) * res_nstride + (long)(m) * OHW + ((n) % OHW)]
#else
#define RES(m, n) 0.0f
#endif
#if defined(HAS_BIAS)
#define BIAS(m) bias[m]
#else
#define BIAS(m) 0.0f
#endif
#define STORE(m, n, v) { float r_ = (v) + BIAS(m) + RES(m, n); \
    y[((n) / OHW) * y_nstride + (long)(m) * OHW + ((n) % OHW)] = ACT(r_); }
