// precision "fp16" (kernels/half.py) for the skinny products (gemv.cl, gemv_rows.cl, and gemv_epilogue.cl's C and y):
// A_HALF, B_HALF, C_HALF, Y_HALF store that operand in half. A4(i) / B4(i) read float4 i of A / B (from their
// offsets), A1(i) element i of A, LOAD_C(p, i) an element of C, STORE_Y(i, v) an element of y, STORE_Y4(i, v) 4 from element i (a multiple of 4);
// the sums stay float.
#if defined(A_HALF)
#define A_T half
#define A4(i) vload_half4(i, a + a_off)
#define A1(i) vload_half(i, a + a_off)
#else
#define A_T float
#define A4(i) ((__global const float4*)(a + a_off))[i]
#define A1(i) (a + a_off)[i]
#endif
#if defined(B_HALF)
#define B_T half
#define B4(i) vload_half4(i, b + b_off)
#else
#define B_T float
#define B4(i) ((__global const float4*)(b + b_off))[i]
#endif
#if defined(C_HALF)
#define C_T half
#define LOAD_C(p, i) vload_half(i, p)
#else
#define C_T float
#define LOAD_C(p, i) (p)[i]
#endif
#if defined(Y_HALF)
#define Y_T half
#define STORE_Y(i, v) vstore_half(v, i, y)
#define STORE_Y4(i, v) vstore_half4(v, 0, y + (i))
#else
#define Y_T float
#define STORE_Y(i, v) y[i] = (v)
#define STORE_Y4(i, v) *(__global float4*)(y + (i)) = (v)
#endif
