// precision "fp16" (kernels/half.py) for the convolutions (conv.cl, dwconv.cl): X_HALF, W_HALF, BIAS_HALF, RES_HALF,
// Y_HALF store that operand in half. LDX(i), LDW(i), LDBIAS(i), LDRES(i) read one element of x, w, bias, res as
// float (from those names' pointers), STY(i, v) writes one of y; the products and sums stay float.
#ifndef X_T  // (window.cl defines x's where it comes first)
#if defined(X_HALF)
#define X_T half
#define LDX(i) vload_half(i, x)
#else
#define X_T float
#define LDX(i) x[i]
#endif
#endif
#if defined(W_HALF)
#define W_T half
#define LDW(i) vload_half(i, w)
#else
#define W_T float
#define LDW(i) w[i]
#endif
#if defined(BIAS_HALF)
#define BIAS_T half
#define LDBIAS(i) vload_half(i, bias)
#else
#define BIAS_T float
#define LDBIAS(i) bias[i]
#endif
#if defined(RES_HALF)
#define RES_T half
#define LDRES(i) vload_half(i, res)
#else
#define RES_T float
#define LDRES(i) res[i]
#endif
#if defined(Y_HALF)
#define Y_T half
#define STY(i, v) vstore_half(v, i, y)
#else
#define Y_T float
#define STY(i, v) y[i] = (v)
#endif
