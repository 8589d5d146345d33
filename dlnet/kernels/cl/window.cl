// One element of a convolution window: the input at (iy0 + t.y, ix0 + t.z) of the image whose window corner sits at
// `base`, or 0 in the padding. t is the layer's table entry for (c, ky, kx): (c * H * W + ky * DH * W + kx * DW,
// ky * DH, kx * DW), written once by the planner so no division by KW or KH runs per element.
// The load is unconditional (from x[0] in the padding), so callers can have many in flight: see gemm_fetch.cl.
// The table ends with rows whose ky offset is OUTSIDE: every tap of them lies in the padding (B_SAFE).
#define OUTSIDE (-0x40000000)
// X_HALF (precision "fp16", kernels/half.py): the input x is stored in half, LDX(i) reads it as float
#if defined(X_HALF)
#define X_T half
#define LDX(i) vload_half(i, x)
#else
#define X_T float
#define LDX(i) x[i]
#endif
// The same as an address for cp.async (gemm_fetch.cl with STAGES): p = the element (x itself in the padding), ok =
// inside the image
#define IM2COL_PTR(x, t, base, iy0, ix0, H, W, p, ok) { \
    const int iy_ = (iy0) + (t).y, ix_ = (ix0) + (t).z; \
    ok = (uint)iy_ < (uint)(H) && (uint)ix_ < (uint)(W); p = (x) + (ok ? (base) + (t).x : 0); }
inline float im2col_at(__global const X_T* x, int4 t, IDX base, int iy0, int ix0, int H, int W) {
    const int iy = iy0 + t.y, ix = ix0 + t.z;
    const bool in = (uint)iy < (uint)H && (uint)ix < (uint)W;
    const float v = LDX(in ? base + t.x : 0);
    return in ? v : 0.0f;
}
