// Convolution as implicit GEMM: rows = output channels of a group, columns = (image, oy, ox), depth = (c, ky, kx).
// Epilogue: + bias, + residual, activation (ACT(v) define), written at out_nstride so a Concat can own the buffer.
#ifndef ACT
#error "conv.cl needs ACT(v)"
#endif
#ifndef IDX
#define IDX long  // index arithmetic: int where every extent fits (the planner decides)
#endif
// precision "fp16": conv_half.cl (after window.cl) defines the operands' types and loads, X_T ... LDX(i) ... STY(i, v)
#if (defined(X_HALF) || defined(W_HALF)) && defined(STAGES)
#error "conv.cl: half x or w needs the register-staged cores (cp.async copies floats)"
#endif
#if defined(X_HALF)
#define BC_T half
#define BC_LOAD(p, i) vload_half(i, p)
#endif
#define LOAD_A(m, k) LDW((IDX)(m) * KK + (k))
#define KERNEL_NAME conv2d
#define KERNEL_ARGS \
    __global const X_T* x, ulong x_off, __global const W_T* w, ulong w_off, \
    __global const BIAS_T* bias, ulong bias_off, __global const RES_T* res, ulong res_off, \
    __global Y_T* y, ulong y_off, __global const int4* ktab, \
    int C, int H, int W, int K, int OH, int OW, int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW, \
    int groups, int batch, long y_nstride, long res_nstride
#define PROLOGUE \
    const int g = ZID; \
    const int M = K; const int NN = batch * OH * OW; const int KK = C * KH * KW; \
    x += x_off + (long)g * C * H * W; w += w_off + (long)g * K * KK; bias += bias_off + g * K; \
    y += y_off + (long)g * K * OH * OW; res += res_off + (long)g * K * OH * OW; \
    const IDX x_nstride = (IDX)C * groups * H * W; const int OHW = OH * OW;
#define PTR_A(m, k) (w + (IDX)(m) * KK + (k))  // address forms (gemm_fetch.cl)
#if defined(IS_1X1)
#define LOAD_B(k, n) LDX(((n) / OHW) * x_nstride + (IDX)(k) * H * W + ((n) % OHW))
#define B_COLUMN(n) const IDX bbase_ = ((n) / OHW) * x_nstride + ((n) % OHW); const int HW_ = H * W;
#define LOAD_BC(k) LDX(bbase_ + (IDX)(k) * HW_)
#define PTR_BC(k) (x + bbase_ + (IDX)(k) * HW_)
#else
// ktab[k]: the window table of window.cl (im2col_at); the (image, oy, ox) of a column does not change along k.
inline float im2col(__global const X_T* x, int4 t, int n, int H, int W, int OH, int OW, int SH, int SW, int PH,
                    int PW, IDX x_nstride) {
    const int ox = n % OW; const int t2 = n / OW; const int oy = t2 % OH; const int img = t2 / OH;
    const int iy0 = oy * SH - PH, ix0 = ox * SW - PW;
    const int iy = iy0 + t.y, ix = ix0 + t.z;
    const bool in = (uint)iy < (uint)H && (uint)ix < (uint)W;
    const float v = LDX(in ? img * x_nstride + (IDX)iy0 * W + ix0 + t.x : 0);
    return in ? v : 0.0f;
}
#define LOAD_B(k, n) im2col(x, ktab[k], n, H, W, OH, OW, SH, SW, PH, PW, x_nstride)
// the same per column: the window's corner (iy0, ix0) and its offset, then one table entry per k
// B_SAFE (gemm_fetch.cl): the table has rows of padding past KK, and a column past NN gets a corner far outside x
#define B_SAFE
#define B_COLUMN(n) \
    const int box_ = (n) % OW, bt_ = (n) / OW, bix0_ = box_ * SW - PW; \
    const int biy0_ = (n) < NN ? bt_ % OH * SH - PH : OUTSIDE; \
    const IDX bbase_ = (bt_ / OH) * x_nstride + (IDX)biy0_ * W + bix0_;
#define LOAD_BC(k) im2col_at(x, ktab[k], bbase_, biy0_, bix0_, H, W)
#define BC_AT(k, p, ok) IM2COL_PTR(x, ktab[k], bbase_, biy0_, bix0_, H, W, p, ok)
#if defined(TAP_MAJOR)
// depth ordered (ky, kx, c) with C a multiple of TK (the planner's weights [K, KH, KW, C]): along a slice of depth
// only the channel moves, H * W floats a step (gemm_fetch.cl)
#define BC_STEP ((IDX)H * W)
#endif
#endif
#if defined(HAS_RES)
#define RES(m, n) LDRES(((n) / OHW) * (IDX)res_nstride + (IDX)(m) * OHW + ((n) % OHW))
#else
#define RES(m, n) 0.0f
#endif
#if defined(HAS_BIAS)
#define BIAS(m) LDBIAS(m)
#else
#define BIAS(m) 0.0f
#endif
#define STORE(m, n, v) { float r_ = (v) + BIAS(m) + RES(m, n); \
    STY(((n) / OHW) * (IDX)y_nstride + (IDX)(m) * OHW + ((n) % OHW), ACT(r_)); }
// per column (gemm_core.cl): the image and pixel of n once, not a division per output
#define STORE_COLUMN(n) \
    const int simg_ = (n) / OHW, spix_ = (n) - simg_ * OHW; \
    const IDX ybase_ = simg_ * (IDX)y_nstride + spix_, rbase_ = simg_ * (IDX)res_nstride + spix_;
#if defined(HAS_RES)
#define RES_IN_COLUMN(m) LDRES(rbase_ + (IDX)(m) * OHW)
#else
#define RES_IN_COLUMN(m) 0.0f
#endif
// what a row's store adds (bias, residual) apart from the store itself, so the cores can load those of several rows
// before storing any (gemm_fetch.cl's STORE_PRE)
#define EPI_T float2
#define STORE_PRE_IN_COLUMN(m) ((float2)(BIAS(m), RES_IN_COLUMN(m)))
#define STORE_WITH_IN_COLUMN(m, v, e) { float r_ = (v) + (e).x + (e).y; STY(ybase_ + (IDX)(m) * OHW, ACT(r_)); }
#define STORE_IN_COLUMN(m, v) STORE_WITH_IN_COLUMN(m, v, STORE_PRE_IN_COLUMN(m))
