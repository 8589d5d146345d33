// Convolution gradients as GEMMs on the shared cores (gemm_core.cl on GPUs, gemm_vec.cl on CPUs), per group g:
//   CONV_DW: dw[m, j] = sum_k dy[m, k] * col[j, k]       m: out channel, j: (c, ky, kx), k: (image, pixel)
//   CONV_DX: colgrad[j, n] = sum_k w[k, j] * dy[k, n]    then col2im (im2col.cl) adds colgrad into dx (DX_DIRECT:
//            a 1x1 stride-1 unpadded convolution's colgrad is dx, stored through `dw` in dx's layout)
// col is im2col(x) (CONV_DW; the GPU cores read the windows from x instead) or the colgrad output (CONV_DX), in
// the plan's work buffer.
#ifndef IDX
#define IDX long  // index arithmetic: int where every extent fits (the planner decides)
#endif
// precision "fp16" (kernels/half.py): DY_HALF: dy stored in half (LDY); X_HALF: x (window.cl's X_T, LDX); both are
// loaded as float by the register-staged cores (cp.async copies floats: no STAGES then); DX_HALF with DX_DIRECT: dx
// (through `dw`) stored in half; dw and col stay float
#if (defined(DY_HALF) || defined(X_HALF)) && defined(STAGES)
#error "conv_grad_gemm.cl: half dy or x needs the register-staged cores (cp.async copies floats)"
#endif
#if defined(DY_HALF)
#define DY_T half
#define LDY(i) vload_half(i, dy)
#else
#define DY_T float
#define LDY(i) dy[i]
#endif
#if defined(DX_HALF) && defined(DX_DIRECT)
#define DW_T half
#else
#define DW_T float
#endif
#if defined(CONV_DW)
#define KERNEL_NAME conv_dw
#elif defined(CONV_DX)
#define KERNEL_NAME conv_dx
#else
#error "conv_grad_gemm.cl needs CONV_DW or CONV_DX"
#endif
#define KERNEL_ARGS \
    __global const DY_T* dy, ulong dy_off, __global const float* w, ulong w_off, __global DW_T* dw, ulong dw_off, \
    __global float* col, int K, int CKK, int OHW, int NPIX, long dy_nstride, \
    __global const X_T* x, ulong x_off, __global const int4* ktab, int H, int W, int OW, int SH, int SW, int PH, \
    int PW, long x_nstride, long x_gstride
#if defined(CONV_DW)
#define PROLOGUE \
    const int g = ZID; const int M = K; const int NN = CKK; const int KK = NPIX; \
    dy += dy_off + (long)g * K * OHW; dw += dw_off + (long)g * K * CKK; col += (long)g * CKK * NPIX; \
    x += x_off + (long)g * x_gstride;
#define LOAD_A(m, k) LDY(((k) / OHW) * (IDX)dy_nstride + (IDX)(m) * OHW + ((k) % OHW))
// GPU cores: pixel k's image is worked out once per tile (A_KROW, B_KROW in gemm_fetch.cl)
#define A_KROW(k) const int aimg_ = (k) / OHW; const IDX abase_ = aimg_ * (IDX)dy_nstride + ((k) - aimg_ * OHW);
#define LOAD_AK(m) LDY(abase_ + (IDX)(m) * OHW)
#define PTR_AK(m) (dy + abase_ + (IDX)(m) * OHW)  // address forms (gemm_fetch.cl)
#define LOAD_B(k, n) col[(IDX)(n) * NPIX + (k)]
#define PTR_B(k, n) (col + (IDX)(n) * NPIX + (k))
#if defined(IMPLICIT_COL)  // read the window from x (window.cl) instead of an im2col buffer
#define B_SAFE  // gemm_fetch.cl: the table's padding rows cover columns past NN, pixels past KK get a corner outside
#define B_KROW(k) \
    const int bimg_ = (k) / OHW, bp_ = (k) - bimg_ * OHW, boy_ = bp_ / OW; \
    const int biy0_ = (k) < KK ? boy_ * SH - PH : OUTSIDE, bix0_ = (bp_ - boy_ * OW) * SW - PW; \
    const IDX bbase_ = bimg_ * (IDX)x_nstride + (IDX)biy0_ * W + bix0_;
#define LOAD_BK(n) im2col_at(x, ktab[n], bbase_, biy0_, bix0_, H, W)
#define BK_AT(n, p, ok) IM2COL_PTR(x, ktab[n], bbase_, biy0_, bix0_, H, W, p, ok)
#endif
#define STORE(m, n, v) dw[(IDX)(m) * CKK + (n)] = (v)
#else
#define PROLOGUE \
    const int g = ZID; const int M = CKK; const int NN = NPIX; const int KK = K; \
    dy += dy_off + (long)g * K * OHW; w += w_off + (long)g * K * CKK; col += (long)g * CKK * NPIX; \
    dw += dw_off + (long)g * CKK * OHW;
#define LOAD_A(m, k) w[(IDX)(k) * CKK + (m)]
#define PTR_A(m, k) (w + (IDX)(k) * CKK + (m))  // address forms (gemm_fetch.cl)
#define LOAD_B(k, n) LDY(((n) / OHW) * (IDX)dy_nstride + (IDX)(k) * OHW + ((n) % OHW))
#define B_COLUMN(n) const IDX bbase_ = ((n) / OHW) * (IDX)dy_nstride + ((n) % OHW);
#define LOAD_BC(k) LDY(bbase_ + (IDX)(k) * OHW)
#define PTR_BC(k) (dy + bbase_ + (IDX)(k) * OHW)
#if defined(DX_DIRECT) && defined(DX_HALF)
#define STORE(m, n, v) vstore_half(v, ((n) / OHW) * (IDX)x_nstride + (IDX)(m) * OHW + ((n) % OHW), dw)
#elif defined(DX_DIRECT)  // 1x1, stride 1, no padding: colgrad is dx itself, written in dx's layout (no col2im)
#define STORE(m, n, v) dw[((n) / OHW) * (IDX)x_nstride + (IDX)(m) * OHW + ((n) % OHW)] = (v)
#else
#define STORE(m, n, v) col[(IDX)(m) * NPIX + (n)] = (v)
#endif
#endif
