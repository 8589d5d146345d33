// Gradients of the direct depthwise convolution (dwconv.cl: output channel co reads input channel co / M).
// dw runs in two steps so few channels still fill the device: work-group (g, co) of dw_partial sums a slice of the
// (image, pixel) range for every tap into ws[co][g][tap]; dw_finish adds the G slices. TAPS = KH * KW.
#ifndef WG
#define WG 256
#endif
// The layer's geometry and channel multiplier are compiled in (geometry.cl's GEOMETRY, and MC for M)
#if !defined(MC)
#error "dwconv_grad.cl needs geometry.cl and MC"
#endif
#define COMPILED_GEOMETRY GEOMETRY M = MC;

__kernel __attribute__((reqd_work_group_size(WG, 1, 1)))
void dw_partial(__global const float* dy, ulong dy_off, __global const float* x, ulong x_off, int N, int C, int H,
                int W, int OH, int OW, int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW, int M, int G,
                __global float* ws) {
    __local float part[WG];
    COMPILED_GEOMETRY
    const int g = get_group_id(0), co = get_group_id(1), l = get_local_id(0);
    const int CO = C * M, OHW = OH * OW, count = N * OHW;
    dy += dy_off + (long)co * OHW;
    x += x_off + (long)(co / M) * H * W;
    float acc[TAPS];
    for (int t = 0; t < TAPS; t++) acc[t] = 0.0f;
    for (int j = g * WG + l; j < count; j += G * WG) {
        const int n = j / OHW, pix = j - n * OHW, oy = pix / OW, ox = pix - oy * OW;
        const float e = dy[(long)n * CO * OHW + pix];
        __global const float* xn = x + (long)n * C * H * W;
        for (int ky = 0; ky < KH; ky++) {
            const int iy = oy * SH - PH + ky * DH;
            const bool rowin = iy >= 0 && iy < H;
            for (int kx = 0; kx < KW; kx++) {
                const int ix = ox * SW - PW + kx * DW;
                if (rowin && ix >= 0 && ix < W) acc[ky * KW + kx] = fma(e, xn[iy * W + ix], acc[ky * KW + kx]);
            }
        }
    }
    for (int t = 0; t < TAPS; t++) {
        part[l] = acc[t];
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int s = WG / 2; s > 0; s >>= 1) {
            if (l < s) part[l] += part[l + s];
            barrier(CLK_LOCAL_MEM_FENCE);
        }
        if (l == 0) ws[((long)co * G + g) * TAPS + t] = part[0];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}

// dw[co, tap] = sum over the G slices
__kernel void dw_finish(__global float* dw, ulong dw_off, int CO, int G, __global const float* ws) {
    const int i = get_global_id(0);  // co * TAPS + tap
    if (i >= CO * TAPS) return;
    const int co = i / TAPS, t = i - co * TAPS;
    float s = 0.0f;
    for (int g = 0; g < G; g++) s += ws[((long)co * G + g) * TAPS + t];
    dw[dw_off + i] = s;
}

// dx[n, ci, iy, ix] = sum over the M output channels of ci and the taps that read (iy, ix): w * dy
__kernel void dw_dx(__global const float* dy, ulong dy_off, __global const float* w, ulong w_off,
                    __global float* dx, ulong dx_off, int C, int H, int W, int OH, int OW, int KH, int KW, int SH,
                    int SW, int PH, int PW, int DH, int DW, int M) {
    COMPILED_GEOMETRY
    const int ix = get_global_id(0), iy = get_global_id(1), nc = get_global_id(2);
    if (ix >= W || iy >= H) return;
    const int n = nc / C, ci = nc - n * C;
    float acc = 0.0f;
    for (int m = 0; m < M; m++) {
        const int co = ci * M + m;
        __global const float* d = dy + dy_off + ((long)n * C * M + co) * OH * OW;
        __global const float* wc = w + w_off + (long)co * KH * KW;
        for (int ky = 0; ky < KH; ky++) {
            const int ty = iy + PH - ky * DH;
            if (ty < 0 || ty % SH != 0 || ty / SH >= OH) continue;
            for (int kx = 0; kx < KW; kx++) {
                const int tx = ix + PW - kx * DW;
                if (tx < 0 || tx % SW != 0 || tx / SW >= OW) continue;
                acc = fma(wc[ky * KW + kx], d[(ty / SH) * OW + tx / SW], acc);
            }
        }
    }
    dx[dx_off + (long)nc * H * W + (long)iy * W + ix] = acc;
}
