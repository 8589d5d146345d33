// Pooling gradients over 2 spatial dims (1-D pools arrive as H = 1); one work-item per input element, gathering
// from every window that covers it, so no atomics. Pads are the begin pads; the end pads only set OH/OW.
#if !defined(POOL_MAX) && !defined(POOL_AVG)
#error "pool_grad.cl needs POOL_MAX or POOL_AVG"
#endif
// precision "fp16" (kernels/half.py): X_HALF, DY_HALF, DX_HALF store that operand in half (float arithmetic)
#if defined(X_HALF)
#define X_T half
#define LD_X(i) vload_half(i, x)
#else
#define X_T float
#define LD_X(i) x[i]
#endif
#if defined(DY_HALF)
#define DY_T half
#define LD_DY(i) vload_half(i, dy)
#else
#define DY_T float
#define LD_DY(i) dy[i]
#endif
#if defined(DX_HALF)
#define DX_T half
#define ST_DX(i, v) vstore_half(v, i, dx)
#else
#define DX_T float
#define ST_DX(i, v) dx[i] = (v)
#endif
// pool_argmax and pool_grad start with geometry.cl's GEOMETRY: the layer's geometry compiled in
#if defined(POOL_MAX)
// Max pools first find each window's first maximum in scan order (as the forward pass and torch pick it), once per
// window: at[window] = its index in the plane, -1 where the window holds no input element. pool_grad then gives each
// input element the dy of the windows whose maximum it is.
__kernel void pool_argmax(__global const X_T* x, ulong x_off, __global int* at, int H, int W, int OH, int OW,
                          int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW, long total) {
    GEOMETRY
    const long i = get_global_id(0);
    if (i >= total) return;
    const int ox = i % OW; long t = i / OW;
    const int oy = t % OH; const long nc = t / OH;
    x += x_off + nc * H * W;
    float best = -INFINITY;
    int found = -1;
    for (int wy = 0; wy < KH; wy++) {
        const int yy = oy * SH - PH + wy * DH;
        if (yy < 0 || yy >= H) continue;
        for (int wx = 0; wx < KW; wx++) {
            const int xx = ox * SW - PW + wx * DW;
            if (xx < 0 || xx >= W) continue;
            const float v = LD_X(yy * W + xx);
            if (v > best || found < 0) { best = v; found = yy * W + xx; }
        }
    }
    at[i] = found;
}
#define POOL_AT , __global const int* at
#else
#define POOL_AT
#endif

__kernel void pool_grad(__global const DY_T* dy, ulong dy_off, __global const X_T* x, ulong x_off,
                        __global DX_T* dx, ulong dx_off, int H, int W, int OH, int OW, int KH, int KW,
                        int SH, int SW, int PH, int PW, int DH, int DW, int count_include_pad, long total POOL_AT) {
    GEOMETRY
    const long i = get_global_id(0);
    if (i >= total) return;
    const int ix = i % W; long t = i / W;
    const int iy = t % H; const long nc = t / H;
    dy += dy_off + nc * OH * OW;
#if defined(POOL_MAX)
    at += nc * OH * OW;
#endif
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
#if defined(POOL_MAX)
            if (at[oy * OW + ox] == iy * W + ix) acc += LD_DY(oy * OW + ox);
#else
            int n = 0;
            for (int wy = 0; wy < KH; wy++) {
                const int yy = oy * SH - PH + wy * DH;
                for (int wx = 0; wx < KW; wx++) {
                    const int xx = ox * SW - PW + wx * DW;
                    const bool inside = yy >= 0 && yy < H && xx >= 0 && xx < W;
                    const bool in_pad = yy < H + PH && xx < W + PW;
                    if (inside || (count_include_pad && in_pad)) n++;
                }
            }
            acc += LD_DY(oy * OW + ox) / (float)n;
#endif
        }
    }
    ST_DX(dx_off + i, acc);
}

// Windows that tile the input exactly (kernel = stride, no pads, no dilation, H = OH KH, W = OW KW): one work-item
// per window, which writes every input element under it once (max: the first maximum in scan order gets dy, the
// rest 0; average: dy / (KH KW)).
__kernel void pool_grad_tiled(__global const DY_T* dy, ulong dy_off, __global const X_T* x, ulong x_off,
                              __global DX_T* dx, ulong dx_off, int OH, int OW, int KH, int KW, long total) {
    const long i = get_global_id(0);
    if (i >= total) return;
    const int ox = i % OW; const long t = i / OW;
    const int oy = t % OH; const long nc = t / OH;
    const int W = OW * KW;
    const long base = (nc * OH * KH + (long)oy * KH) * W + (long)ox * KW;
    const float g = LD_DY(dy_off + i);
    x += x_off + base;
    dx += dx_off + base;
#if defined(POOL_MAX)
    float best = LD_X(0);
    int at = 0;
    for (int wy = 0; wy < KH; wy++)
        for (int wx = 0; wx < KW; wx++) {
            const float v = LD_X(wy * W + wx);
            if (v > best) { best = v; at = wy * W + wx; }
        }
    for (int wy = 0; wy < KH; wy++)
        for (int wx = 0; wx < KW; wx++)
            ST_DX(wy * W + wx, wy * W + wx == at ? g : 0.0f);
#else
    const float share = g / (float)(KH * KW);
    for (int wy = 0; wy < KH; wy++)
        for (int wx = 0; wx < KW; wx++)
            ST_DX(wy * W + wx, share);
#endif
}
