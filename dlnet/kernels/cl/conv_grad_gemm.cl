// Convolution gradients as GEMMs on the shared cores (gemm_core.cl on GPUs, gemm_vec.cl on CPUs), per group g:
//   CONV_DW: dw[m, j] = sum_k dy[m, k] * col[j, k]       m: out channel, j: (c, ky, kx), k: (image, pixel)
//   CONV_DX: colgrad[j, n] = sum_k w[k, j] * dy[k, n]    then col2im (im2col.cl) adds colgrad into dx
// col is im2col(x) (CONV_DW) or the colgrad output (CONV_DX), in the plan's work buffer.
#ifndef IDX
#define IDX long  // index arithmetic: int where every extent fits (the planner decides)
#endif
#if defined(CONV_DW)
#define KERNEL_NAME conv_dw
#elif defined(CONV_DX)
#define KERNEL_NAME conv_dx
#else
#error "conv_grad_gemm.cl needs CONV_DW or CONV_DX"
#endif
#define KERNEL_ARGS \
    __global const float* dy, ulong dy_off, __global const float* w, ulong w_off, __global float* dw, ulong dw_off, \
    __global float* col, int K, int CKK, int OHW, int NPIX, long dy_nstride
#if defined(CONV_DW)
#define PROLOGUE \
    const int g = ZID; const int M = K; const int NN = CKK; const int KK = NPIX; \
    dy += dy_off + (long)g * K * OHW; dw += dw_off + (long)g * K * CKK; col += (long)g * CKK * NPIX;
#define LOAD_A(m, k) dy[((k) / OHW) * (IDX)dy_nstride + (IDX)(m) * OHW + ((k) % OHW)]
#define LOAD_B(k, n) col[(IDX)(n) * NPIX + (k)]
#define STORE(m, n, v) dw[(IDX)(m) * CKK + (n)] = (v)
#else
#define PROLOGUE \
    const int g = ZID; const int M = CKK; const int NN = NPIX; const int KK = K; \
    dy += dy_off + (long)g * K * OHW; w += w_off + (long)g * K * CKK; col += (long)g * CKK * NPIX;
#define LOAD_A(m, k) w[(IDX)(k) * CKK + (m)]
#define LOAD_B(k, n) dy[((n) / OHW) * (IDX)dy_nstride + (IDX)(k) * OHW + ((n) % OHW)]
#define B_COLUMN(n) const IDX bbase_ = ((n) / OHW) * (IDX)dy_nstride + ((n) % OHW);
#define LOAD_BC(k) dy[bbase_ + (IDX)(k) * OHW]
#define STORE(m, n, v) col[(IDX)(m) * NPIX + (n)] = (v)
#endif
