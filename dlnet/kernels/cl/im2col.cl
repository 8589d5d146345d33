// precision "fp16" (kernels/half.py): COL_X_HALF: im2col's x is stored in half (read as float; col stays float);
// COL_DX_HALF: col2im's dx is stored in half
#if defined(COL_X_HALF)
#define COL_X_T half
#define COL_LDX(i) vload_half(i, x)
#else
#define COL_X_T float
#define COL_LDX(i) x[i]
#endif
// HC ... (CPUs: emitter.compiled_geometry before this file, with CC and NNC): the layer's geometry, channels and
// pixel count compiled in, so that the kernels' divisions and remainders become multiplications and shifts
#if defined(HC)
#define COL_CONSTANTS(NNV) GEOMETRY C = CC; NNV = NNC;
#else
#define COL_CONSTANTS(NNV)
#endif
#if defined(COL_DX_HALF)
#define COL_DX_T half
#define COL_STDX(i, v) vstore_half(v, i, dx)
#else
#define COL_DX_T float
#define COL_STDX(i, v) dx[i] = (v)
#endif

// col[k, n] for k = (c, ky, kx) and n = (image, oy, ox): the convolution's B matrix, laid out for gemm_vec.cl.
__kernel void im2col(__global const COL_X_T* x, ulong x_off, __global float* col, int C, int H, int W, int OH, int OW,
                     int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW, long x_nstride, int NN,
                     long total) {
    COL_CONSTANTS(NN)
    const long i = get_global_id(0);
    if (i >= total) return;
    const int n = i % NN; const int k = i / NN;
    const int kx = k % KW; const int t = k / KW; const int ky = t % KH; const int c = t / KH;
    const int ox = n % OW; const int t2 = n / OW; const int oy = t2 % OH; const int img = t2 / OH;
    const int iy = oy * SH - PH + ky * DH, ix = ox * SW - PW + kx * DW;
    const bool in = iy >= 0 && iy < H && ix >= 0 && ix < W;
    col[i] = in ? COL_LDX(x_off + img * x_nstride + ((long)c * H + iy) * W + ix) : 0.0f;
}

// rows[k, (image, p)] = x[image, k, p]: a tensor of images, KT channels and OHW pixels as rows of channels over every
// image's pixels (the CPU's convolution gradients' dy, a product's operand with one stride); a work-item per (image,
// channel) plane, one contiguous run copied (the geometry compiled in: OHC, OWC, NNC). 8 x 32 planes of 64 x 64 on 2
// cores: 1.05 ms at a work-item per element.
#if defined(HC)
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void rows_of_images(__global const COL_X_T* x, ulong x_off, __global float* rows, int KT) {
    const int img = get_global_id(0), k = get_global_id(1);
    const long src = x_off + ((long)img * KT + k) * (OHC * OWC);
    __global float* dst = rows + (long)k * NNC + (long)img * (OHC * OWC);
    for (int p = 0; p < OHC * OWC; p++)
        dst[p] = COL_LDX(src + p);
}
#endif

// dx[image, c, iy, ix] = sum over taps (ky, kx) that read (iy, ix) of colgrad[(c, ky, kx), (image, oy, ox)]:
// the adjoint of im2col as a gather (deterministic, no atomics).
__kernel void col2im(__global const float* col, __global COL_DX_T* dx, ulong dx_off, int C, int H, int W, int OH,
                     int OW, int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW, int NPIX, long total) {
    COL_CONSTANTS(NPIX)
    const long i = get_global_id(0);
    if (i >= total) return;
    const int ix = i % W; long t = i / W;
    const int iy = t % H; t /= H;
    const int c = t % C; const int img = t / C;
    float acc = 0.0f;
    for (int ky = 0; ky < KH; ky++) {
        const int ty = iy + PH - ky * DH;
        if (ty < 0 || ty % SH) continue;
        const int oy = ty / SH;
        if (oy >= OH) continue;
        for (int kx = 0; kx < KW; kx++) {
            const int tx = ix + PW - kx * DW;
            if (tx < 0 || tx % SW) continue;
            const int ox = tx / SW;
            if (ox >= OW) continue;
            acc += col[(long)((c * KH + ky) * KW + kx) * NPIX + ((long)img * OH + oy) * OW + ox];
        }
    }
    COL_STDX(dx_off + i, acc);
}

// wf[g * C + c, k, ky, kx] = w[g * K + k, c, KH - 1 - ky, KW - 1 - kx]: the weights of dx = conv(dy, wf) for a
// stride-1 convolution with K output and C input channels per group (KHW = KH * KW).
__kernel void flip_weights(__global const float* w, ulong w_off, __global float* wf, int G, int K, int C, int KHW,
                           long total) {
    const long i = get_global_id(0);
    if (i >= total) return;
    const int t = i % KHW; long r = i / KHW;
    const int k = r % K; r /= K;
    const int c = r % C; const int g = r / C;
    wf[i] = w[w_off + (((long)g * K + k) * C + c) * KHW + (KHW - 1 - t)];
}

// The same two on CPUs (the geometry compiled in), a work-item per plane: im2col_planes writes the row of col of tap
// k = (c, ky, kx) over image img's pixels (oy, ox) in turn, col2im_planes gathers image img's channel c of dx pixel by
// pixel; no division per element.
#if defined(HC)
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void im2col_planes(__global const COL_X_T* x, ulong x_off, __global float* col, long x_nstride) {
    const int img = get_global_id(0), k = get_global_id(1);
    const int kx = k % KWC, ky = k / KWC % KHC, c = k / (KWC * KHC);
    __global float* row = col + (long)k * NNC + (long)img * OHC * OWC;
    const long base = x_off + img * x_nstride + (long)c * HC * WC;
    for (int oy = 0; oy < OHC; oy++) {
        const int iy = oy * SHC - PHC + ky * DHC;
        if (iy < 0 || iy >= HC) {
            for (int ox = 0; ox < OWC; ox++) row[oy * OWC + ox] = 0.0f;
            continue;
        }
        for (int ox = 0; ox < OWC; ox++) {
            const int ix = ox * SWC - PWC + kx * DWC;
            row[oy * OWC + ox] = ix >= 0 && ix < WC ? COL_LDX(base + (long)iy * WC + ix) : 0.0f;
        }
    }
}

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void col2im_planes(__global const float* col, __global COL_DX_T* dx, ulong dx_off) {
    const int img = get_global_id(0), c = get_global_id(1);
    const long out = dx_off + ((long)img * CC + c) * HC * WC;
    for (int iy = 0; iy < HC; iy++)
        for (int ix = 0; ix < WC; ix++) {
            float acc = 0.0f;
            for (int ky = 0; ky < KHC; ky++) {
                const int ty = iy + PHC - ky * DHC;
                if (ty < 0 || ty % SHC || ty / SHC >= OHC) continue;
                const __global float* r = col + (long)((c * KHC + ky) * KWC) * NNC + ((long)img * OHC + ty / SHC) * OWC;
                for (int kx = 0; kx < KWC; kx++) {
                    const int tx = ix + PWC - kx * DWC;
                    if (tx < 0 || tx % SWC || tx / SWC >= OWC) continue;
                    acc += r[(long)kx * NNC + tx / SWC];
                }
            }
            COL_STDX(out + (long)iy * WC + ix, acc);
        }
}

#if !defined(COL_DX_HALF)
// ... or, with dx in float, by scatter: the work-item owns its plane of dx (no atomics), zeroes it, then adds each
// tap's row of col into the pixels it read, one output row at a time over the run of columns inside the image (a
// strided add, no test per element). A 3x3 stride-2 layer's 256 planes of 64 x 64 on 2 cores: 2.87 -> 0.9 ms.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void col2im_scatter(__global const float* col, __global float* dx, ulong dx_off) {
    const int img = get_global_id(0), c = get_global_id(1);
    __global float* plane = dx + dx_off + ((long)img * CC + c) * HC * WC;
    for (int i = 0; i < HC * WC; i++)
        plane[i] = 0.0f;
    for (int ky = 0; ky < KHC; ky++)
        for (int kx = 0; kx < KWC; kx++) {
            const __global float* r = col + (long)((c * KHC + ky) * KWC + kx) * NNC + (long)img * OHC * OWC;
            const int x0 = kx * DWC - PWC;  // (ix = ox SWC + x0: the columns ox in [lo, hi) fall inside)
            const int lo = x0 < 0 ? (SWC - 1 - x0) / SWC : 0;
            const int hi = WC - 1 - x0 < 0 ? 0 : min(OWC, (WC - 1 - x0) / SWC + 1);
            for (int oy = 0; oy < OHC; oy++) {
                const int iy = oy * SHC - PHC + ky * DHC;
                if (iy < 0 || iy >= HC) continue;
                __global float* d = plane + iy * WC + x0;
                const __global float* src = r + oy * OWC;
                for (int ox = lo; ox < hi; ox++)
                    d[ox * SWC] += src[ox];
            }
        }
}
#endif
#endif
