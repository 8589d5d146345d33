// Zero-padded input planes for CPU convolutions (conv_cpu.cl's direct and Winograd tiles, dwconv_cpu.cl's planes
// kernel), in place of im2col or bounds checks. pad_planes copies x into planes split by phase where the stride is
// over 1: phase (py, px) of channel c holds the padded input's rows py, py + SH, ... and columns px, px + SW, ... in a
// plane of Hq x Wq. Output pixel (oy, ox) at position q = oy * Wq + ox reads, for tap (ky, kx), phase
// ((ky * DHC) % SH, (kx * DWC) % SW) at q + (ky * DHC / SH) * Wq + kx * DWC / SW (TAP_OFF): consecutive positions are
// consecutive floats for every tap, so vectors load straight from the planes. Positions with ox >= OW are computed
// and dropped (2 of 15 at 13x13 3x3, 1 of 56 at 112x112 3x3 stride 2). SHP x SWP phases are stored: 1 along an axis
// where every tap reads phase 0 (one tap, or the dilation a multiple of the stride).
#if !defined(KHC) || !defined(KWC) || !defined(SHC) || !defined(SWC) || !defined(DHC) || !defined(DWC)
#error "planes.cl needs KHC, KWC (kernel size), SHC, SWC (strides), DHC, DWC (dilations)"
#endif
#define SHP (KHC > 1 && DHC % SHC ? SHC : 1)
#define SWP (KWC > 1 && DWC % SWC ? SWC : 1)
// where tap (ky, kx) reads, from a channel's first phase plane (planes of `plane` floats, Wq a row)
#define TAP_OFF(ky, kx, plane, Wq) (((ky) * DHC % SHC * SWP + (kx) * DWC % SWC) * (plane) + \
                                    (ky) * DHC / SHC * (Wq) + (kx) * DWC / SWC)
// the columns [lo, hi) of a row of phase px that come from x (0 <= j * SWC + px - PW < W), the others zero
#define PHASE_COLS(lo, hi, px, PW, W, Wq) \
    int lo = (PW) - (px) > 0 ? ((PW) - (px) + SWC - 1) / SWC : 0; \
    int hi = (W) - 1 + (PW) - (px) >= 0 ? ((W) - 1 + (PW) - (px)) / SWC + 1 : 0; \
    lo = lo < (Wq) ? lo : (Wq); \
    hi = hi < (Wq) ? (hi > lo ? hi : lo) : (Wq);
// that row of Wq floats at out, from x's row at in (in + j * SWC: column j * SWC + px - PW of x's row)
#define PAD_ROW(out, in, lo, hi, Wq) { \
    for (int j = 0; j < (lo); j++) (out)[j] = 0.0f; \
    for (int j = (lo); j < (hi); j++) (out)[j] = (in)[j * SWC]; \
    for (int j = (hi); j < (Wq); j++) (out)[j] = 0.0f; }
typedef float8 __attribute__((aligned(4))) planes_f8u;  // unaligned vector loads and stores
typedef float16 __attribute__((aligned(4))) planes_f16u;

// PAD_ROW of stride 2 in pad_planes: eight columns at a time, a float16's even lanes, while that stays inside x's row
// (in[n - 1] its last column); the last ones the odd lanes of the float16 that ends at the last column read. Against
// PAD_ROW's strided element copies (2 cores, the pad launch alone): squeezenet 1.1's stem (3 x 224 x 224 into 12
// planes) 0.062 -> 0.033 ms, resnet50's 0.077 -> 0.058, its 128 x 56 x 56 stride-2 layer's 0.096 -> 0.067. (Writing
// both column phases of a row from one pass over it, where a work-item holds both, ran no faster; nor did more planes
// per work-item. PAD_SCALAR builds PAD_ROW's copies for A/B runs: bench/probes/cpu_layer_ab.py --flag define:PAD_SCALAR.)
inline void pad_row2(__global float* out, __global const float* in, int lo, int hi, int Wq, int n) {
    int j = 0;
    for (; j < lo; j++) out[j] = 0.0f;
    for (; j + 8 <= hi && 2 * j + 16 <= n; j += 8)
        *(__global planes_f8u*)(out + j) = (*(__global const planes_f16u*)(in + 2 * j)).even;
    if (j < hi && hi - 8 > lo) {  // (in[2 (hi - 8) - 1] lies in the row: in[2 lo] is its first column or later)
        *(__global planes_f8u*)(out + hi - 8) = (*(__global const planes_f16u*)(in + 2 * (hi - 8) - 1)).odd;
        j = hi;
    }
    for (; j < hi; j++) out[j] = in[2 * j];
    for (; j < Wq; j++) out[j] = 0.0f;
}

// One work-item per PER phase planes (phase ph of channel c, image img: cph = c * SHP * SWP + ph, CPH of them), row by
// row (a work-item per row: 15k of them for 128 channels at 56x56 stride 2, 0.3 ms of PoCL's dispatch); the one with
// the image's last plane also zeroes its tail (tail floats past the planes, read by the dropped positions at the end).
// CHANNEL_MAP: plane c copies x's channel cmap[c] (a channel shuffle folded in: passes/fuse.py's
// fold_channel_shuffles).
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void pad_planes(__global const float* x, ulong x_off, __global float* xp, int H, int W, int Hq, int Wq, int PH,
                int PW, long x_nstride, long xp_nstride, int tail, int CPH, int PER
#if defined(CHANNEL_MAP)
                , __global const int* cmap, ulong cmap_off
#endif
                ) {
    const int img = get_global_id(1);
    const int cph_end = (get_global_id(0) + 1) * PER < CPH ? (get_global_id(0) + 1) * PER : CPH;
    __global float* out = xp + img * xp_nstride + (long)get_global_id(0) * PER * Hq * Wq;
    for (int cph = get_global_id(0) * PER; cph < cph_end; cph++) {
        const int c = cph / (SHP * SWP), ph = cph - c * (SHP * SWP), py = ph / SWP, px = ph - py * SWP;
#if defined(CHANNEL_MAP)
        const long cx = cmap[cmap_off + c];
#else
        const long cx = c;
#endif
        PHASE_COLS(lo, hi, px, PW, W, Wq)
        for (int i = 0; i < Hq; i++, out += Wq) {
            const int iy = i * SHC + py - PH;
            if (iy < 0 || iy >= H) {
                for (int j = 0; j < Wq; j++) out[j] = 0.0f;
                continue;
            }
            __global const float* in = x + x_off + img * x_nstride + (cx * H + iy) * W + px - PW;
#if SWC == 2 && !defined(PAD_SCALAR)
            pad_row2(out, in, lo, hi, Wq, W - px + PW);
#else
            PAD_ROW(out, in, lo, hi, Wq)
#endif
        }
    }
    if (cph_end == CPH)
        for (int j = 0; j < tail; j++) out[j] = 0.0f;
}
