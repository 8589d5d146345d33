// Convolution on CPU devices: B (the im2col matrix) in panels of NR columns, A (weights) in panels of MR rows, and
// one work-item per MR x NR output tile holding it in MR * NV float8 accumulators over the whole of K.
// No OpenCL built-ins inside loops: PoCL 3.0 links a built-in library compiled for a generic ISA level ("avx2") into
// kernels compiled for the host CPU (e.g. znver3), and LLVM does not inline across different target features, so
// every fma(), vload8(), min() is a function call that spills the accumulators (measured 3 against 130 GFLOP/s).
// a * b + c contracts to an FMA (OpenCL C's default FP_CONTRACT ON); float8u does unaligned vector loads/stores.
#if !defined(MR) || !defined(NV)
#error "conv_cpu.cl needs MR (rows per tile) and NV (float8 vectors of columns per tile)"
#endif
#ifndef ACT
#error "conv_cpu.cl needs ACT(v)"
#endif
#define NR (8 * NV)
typedef float8 __attribute__((aligned(4))) float8u;

// colp[g][nb][k][NR]: column n = nb * NR + e is (image, oy, ox); zeros past NN. One work-item per (k, g) walks
// every column in order, so no division per element (one work-item per element ran at 1 GB/s).
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void im2col_pack(__global const float* x, ulong x_off, __global float* colp, int C, int H, int W, int OH,
                 int OW, int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW, long x_nstride, int NN) {
    const int k = get_global_id(0), g = get_global_id(1);
    const int KK = C * KH * KW;
    if (k >= KK) return;
    const int NB = (NN + NR - 1) / NR, OHW = OH * OW;
    const int kx = k % KW, t = k / KW, ky = t % KH, c = t / KH;
    __global const float* xc = x + x_off + ((long)g * C + c) * H * W;
    __global float* out = colp + (long)g * NB * KK * NR + (long)k * NR;
    const long pstride = (long)KK * NR;  // from one panel to the next
    int n = 0;
    for (int img = 0; img < NN / OHW; img++) {
        for (int oy = 0; oy < OH; oy++) {
            const int iy = oy * SH - PH + ky * DH;
            const bool row_in = iy >= 0 && iy < H;
            __global const float* xr = xc + img * x_nstride + iy * W;
            int ox = 0;
            if (row_in) {  // after at most 7 columns, float8s of the panel while inside x
                for (; ox < OW && (n % 8 || ox * SW - PW + kx * DW < 0); ox++, n++) {
                    const int ix = ox * SW - PW + kx * DW;
                    out[(n / NR) * pstride + n % NR] = ix >= 0 && ix < W ? xr[ix] : 0.0f;
                }
                if (SW == 1) {
                    for (; ox + 8 <= OW && ox - PW + kx * DW + 8 <= W; ox += 8, n += 8)
                        *(__global float8u*)(out + (n / NR) * pstride + n % NR) =
                            *(__global const float8u*)(xr + ox - PW + kx * DW);
                } else {  // strided: eight loads gathered into one vector store
                    for (; ox + 8 <= OW && (ox + 7) * SW - PW + kx * DW < W; ox += 8, n += 8) {
                        __global const float* p = xr + ox * SW - PW + kx * DW;
                        *(__global float8u*)(out + (n / NR) * pstride + n % NR) =
                            (float8)(p[0], p[SW], p[2 * SW], p[3 * SW], p[4 * SW], p[5 * SW], p[6 * SW], p[7 * SW]);
                    }
                }
            }
            for (; ox < OW; ox++, n++) {
                const int ix = ox * SW - PW + kx * DW;
                out[(n / NR) * pstride + n % NR] = row_in && ix >= 0 && ix < W ? xr[ix] : 0.0f;
            }
        }
    }
    for (; n < NB * NR; n++) out[(n / NR) * pstride + n % NR] = 0.0f;
}

// The epilogues' bias and residual terms.
#if defined(HAS_BIAS)
#define ADD_BIAS(r, m) r += bias[m]
#else
#define ADD_BIAS(r, m)
#endif
#if defined(HAS_RES)
#define ADD_RES8(r, at) r += *(__global const float8u*)(res + (at))
#define ADD_RES(r, at) r += res[at]
#else
#define ADD_RES8(r, at)
#define ADD_RES(r, at)
#endif

// The epilogue of float8 j of every row of an MR x NR tile: acc -> y = ACT(acc + bias[m] + res) with y, res, bias at
// the tile's group, at y + m * OHW + vat as one vector (vec), else lane e at y + m * OHW + AT(e) (AT(e) < 0:
// dropped). res has y's layout (the callers pass one image stride for both). A macro, not a function: PoCL kept a
// function's acc[][] argument in memory even inlined (direct 1x1 layers 1.5 -> 2.9 ms). vec must be a variable: as
// an expression, or with the lanes' offsets in an array, a 512 -> 1000 layer at 13x13 ran 1.5x slower.
#define STORE_LANES(j, vec, vat, AT)                                                                                 \
    _Pragma("unroll") for (int i = 0; i < MR; i++) {                                                                 \
        const int m = m0 + i;                                                                                        \
        if (m >= K) break;                                                                                           \
        float8 r = acc[i][j];                                                                                        \
        ADD_BIAS(r, m);                                                                                              \
        if (vec) {                                                                                                   \
            ADD_RES8(r, (long)m * OHW + (vat));                                                                      \
            float8 o;                                                                                                \
            o.s0 = ACT(r.s0); o.s1 = ACT(r.s1); o.s2 = ACT(r.s2); o.s3 = ACT(r.s3);                                  \
            o.s4 = ACT(r.s4); o.s5 = ACT(r.s5); o.s6 = ACT(r.s6); o.s7 = ACT(r.s7);                                  \
            *(__global float8u*)(y + (long)m * OHW + (vat)) = o;                                                     \
        } else {                                                                                                     \
            union { float8 v; float s[8]; } t;                                                                       \
            t.v = r;                                                                                                 \
            for (int e = 0; e < 8; e++) {                                                                            \
                const long at = AT(e);                                                                               \
                if (at < 0) continue;                                                                                \
                float v = t.s[e];                                                                                    \
                ADD_RES(v, (long)m * OHW + at);                                                                      \
                y[(long)m * OHW + at] = ACT(v);                                                                      \
            }                                                                                                        \
        }                                                                                                            \
    }

// The epilogue of a tile of columns n0.. (image, pixel): per float8, one image's contiguous pixels as a vector, else
// lane by lane across images.
#define TILE_AT(e) (n + (e) < NN ? (long)((n + (e)) / OHW) * y_nstride + (n + (e)) % OHW : -1L)
#define STORE_TILE()                                                                                                 \
    _Pragma("unroll") for (int j = 0; j < NV; j++) {                                                                 \
        const int n = n0 + 8 * j;                                                                                    \
        if (n >= NN) break;                                                                                          \
        const int img = n / OHW, p = n - img * OHW;                                                                  \
        const bool vec = n + 8 <= NN && p + 8 <= OHW;                                                                \
        STORE_LANES(j, vec, img * y_nstride + p, TILE_AT);                                                           \
    }

// The start of the MR x NR tile at rows m0 (block mb) of group g: zero accumulators, and where column k of A lies.
// A is w packed as wp[g][mb][k][MR] (A_PACKED, rows past K zero) or w itself, row-major per group.
#if defined(A_PACKED)
#define TILE_START()                                                                                                 \
    float8 acc[MR][NV];                                                                                              \
    _Pragma("unroll") for (int i = 0; i < MR; i++)                                                                   \
        _Pragma("unroll") for (int j = 0; j < NV; j++) acc[i][j] = (float8)(0.0f);                                   \
    __global const float* ap = w + w_off + ((long)g * MB + mb) * KK * MR
#define A_AT(i, k) ap[(k) * MR + (i)]
#else
#define TILE_START()                                                                                                 \
    float8 acc[MR][NV];                                                                                              \
    _Pragma("unroll") for (int i = 0; i < MR; i++)                                                                   \
        _Pragma("unroll") for (int j = 0; j < NV; j++) acc[i][j] = (float8)(0.0f);                                   \
    __global const float* ar[MR];                                                                                    \
    _Pragma("unroll") for (int i = 0; i < MR; i++)                                                                   \
        ar[i] = w + w_off + ((long)g * K + (m0 + i < K ? m0 + i : K - 1)) * KK
#define A_AT(i, k) ar[i][k]
#endif

// One step of the hot loop: row k of B (NR floats at bk, read as type V) times column k of A into every accumulator.
#define FMA_STEP(V, bk, k)                                                                                           \
    do {                                                                                                             \
        float8 b[NV];                                                                                                \
        _Pragma("unroll") for (int j = 0; j < NV; j++) b[j] = *(V*)((bk) + 8 * j);                                   \
        _Pragma("unroll") for (int i = 0; i < MR; i++) {                                                             \
            const float8 a = (float8)(A_AT(i, (k)));                                                                 \
            _Pragma("unroll") for (int j = 0; j < NV; j++) acc[i][j] = a * b[j] + acc[i][j];                         \
        }                                                                                                            \
    } while (0)

// y[img, g * K + m, oy, ox] = ACT(sum_k A[m, k] B[k, n] + bias[m] + res[...]); B is colp, packed by im2col_pack.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void conv2d_cpu(__global const float* x, ulong x_off, __global const float* w, ulong w_off,
                __global const float* bias, ulong bias_off, __global const float* res, ulong res_off,
                __global float* y, ulong y_off, __global const float* colp, int C, int K, int KK, int OHW, int NN,
                long y_nstride, long res_nstride) {
    const int mb = get_global_id(0), nb = get_global_id(1), g = get_global_id(2);
    const int m0 = mb * MR, n0 = nb * NR;
    const int MB = (K + MR - 1) / MR;
    TILE_START();
    __global const float* bp = colp + ((long)g * ((NN + NR - 1) / NR) + nb) * KK * NR;
    for (int k = 0; k < KK; k++) FMA_STEP(__global const float8u, bp + k * NR, k);  // the hot loop
    y += y_off + (long)g * K * OHW;
    res += res_off + (long)g * K * OHW;
    bias += bias_off + g * K;
    STORE_TILE();
}

// The same tiles with B packed per panel into __local memory instead of by a separate im2col pass: one work-item per
// (panel nb, share ms of the row blocks, group) packs its KK x NR panel and runs MBS row blocks on it. PoCL gives
// each thread one __local area that it reuses, so the panel stays in cache: a whole-layer im2col buffer went out to
// memory and back (densenet121's im2col: 137 ms of 300). B_LOCAL (floats) is the whole local memory, at least KK * NR.
#if defined(B_LOCAL)
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void conv2d_cpu_local(__global const float* x, ulong x_off, __global const float* w, ulong w_off,
                      __global const float* bias, ulong bias_off, __global const float* res, ulong res_off,
                      __global float* y, ulong y_off, int C, int K, int KK, int OHW, int NN, long y_nstride,
                      long res_nstride, int H, int W, int OW, int KH, int KW, int SH, int SW, int PH, int PW, int DH,
                      int DW, long x_nstride, int MBS, int NPW
#if defined(PROLOGUE)
                      , __global const float* pro, ulong pro_off
#endif
                      ) {
    __local float panels[B_LOCAL];
    const int ns = get_global_id(0), ms = get_global_id(1), g = get_global_id(2);
    const int MB = (K + MR - 1) / MR, NB = (NN + NR - 1) / NR;
    const int nb0 = ns * NPW, nb_end = nb0 + NPW < NB ? nb0 + NPW : NB;
    __global const float* xg = x + x_off + (long)g * C * H * W;
// PROLOGUE (1x1 layers): x is first taken through relu?(x * scale[c] + shift[c]) (pro: scale [C * groups], then
// shift), a pointwise producer folded in (densenet's BatchNorm + Relu before each 1x1 layer); PRO_RELU: the Relu
#if defined(PROLOGUE)
    pro += pro_off + g * C;
    const int CG = get_global_size(2) * C;
#define AFFINE(T, v, c) ((v) * (T)(pro[c]) + (T)(pro[CG + (c)]))
#if defined(PRO_RELU)
#define PRO(T, v, c) (AFFINE(T, v, c) > (T)(0.0f) ? AFFINE(T, v, c) : (T)(0.0f))
#else
#define PRO(T, v, c) AFFINE(T, v, c)
#endif
#else
#define PRO(T, v, c) (v)
#endif
    for (int nb = nb0; nb < nb_end; nb++) {  // pack the work-item's NPW panels, one after the other
        __local float* panel = panels + (nb - nb0) * KK * NR;
        const int n0 = nb * NR;
#if defined(PACK_1X1)  // 1x1, stride 1, no pads: a whole panel of one image is NR consecutive floats of each channel
        const int img0 = n0 / OHW;
        if (n0 + NR <= NN && (n0 + NR - 1) / OHW == img0) {
            __global const float* xp = xg + img0 * x_nstride + (n0 - img0 * OHW);
            for (int k = 0; k < KK; k++)
                _Pragma("unroll") for (int j = 0; j < NV; j++) {
                    const float8 v = *(__global const float8u*)(xp + (long)k * OHW + 8 * j);
                    *(__local float8*)(panel + k * NR + 8 * j) = PRO(float8, v, k);
                }
            continue;
        }
#endif
        // per column: its image's offset and the window's top-left corner; columns past NN read nothing
        long cb[NR];
        int iy0[NR], ix0[NR];
        _Pragma("unroll") for (int e = 0; e < NR; e++) {
            const int n = n0 + e < NN ? n0 + e : NN - 1;
            const int img = n / OHW, p = n - img * OHW, oy = p / OW, ox = p - oy * OW;
            cb[e] = img * x_nstride;
            iy0[e] = n0 + e < NN ? oy * SH - PH : -(1 << 30);
            ix0[e] = ox * SW - PW;
        }
        int kx = 0, ky = 0;
        long coff = 0;
        for (int k = 0; k < KK; k++) {  // (a prologue only comes with PACK_1X1: channel k)
            const int dy = ky * DH, dx = kx * DW;
            _Pragma("unroll") for (int e = 0; e < NR; e++) {
                const int iy = iy0[e] + dy, ix = ix0[e] + dx;
                const bool inside = (uint)iy < (uint)H && (uint)ix < (uint)W;
                panel[k * NR + e] = inside ? PRO(float, xg[cb[e] + coff + iy * W + ix], k) : 0.0f;
            }
            if (++kx == KW) {
                kx = 0;
                if (++ky == KH) { ky = 0; coff += H * W; }
            }
        }
    }
    y += y_off + (long)g * K * OHW;
    res += res_off + (long)g * K * OHW;
    bias += bias_off + g * K;
    const int mb_end = (ms + 1) * MBS < MB ? (ms + 1) * MBS : MB;
    for (int mb = ms * MBS; mb < mb_end; mb++) {  // each row block over the panels in turn: a row's output lines
        const int m0 = mb * MR;                   // that two panels share are written one tile after the other
        for (int nb = nb0; nb < nb_end; nb++) {
            const int n0 = nb * NR;
            __local const float* panel = panels + (nb - nb0) * KK * NR;
            TILE_START();
            for (int k = 0; k < KK; k++) FMA_STEP(__local const float8, panel + k * NR, k);
            STORE_TILE();
        }
    }
}
#endif

// Small maps with many channels (resnet50's 7x7 stage, PIXEL_ROWS): the product turned around, MR output pixels as
// rows and NR output channels as columns, so the pixels pad only up to MR (49 = 7 x 7: none) where NR-column panels of
// pixels padded 49 to 56 or 64. The weights are packed as wq[g][nb][k][NR] (channels past K zero). Each row of a tile
// stores its 8-channel vectors lane by lane (a pixel's channels lie OHW apart in y).
#if defined(PIXEL_ROWS)
// The KK x MR panel of pixels p0.. (pixel panel block) from x: zero outside x and past NN; no padded copy of x.
#define PACK_PIXELS(panel)                                                                                           \
    do {                                                                                                             \
        long cb[MR];                                                                                                 \
        int iy0[MR], ix0[MR];                                                                                        \
        _Pragma("unroll") for (int e = 0; e < MR; e++) {  /* per pixel: its image's offset, its window's corner */    \
            const int n = p0 + e < NN ? p0 + e : NN - 1;                                                             \
            const int img = n / OHW, p = n - img * OHW, oy = p / OW, ox = p - oy * OW;                               \
            cb[e] = img * x_nstride;                                                                                 \
            iy0[e] = p0 + e < NN ? oy * SH - PH : -(1 << 30);                                                        \
            ix0[e] = ox * SW - PW;                                                                                   \
        }                                                                                                            \
        int kx = 0, ky = 0;                                                                                          \
        long coff = 0;                                                                                               \
        for (int k = 0; k < KK; k++) {                                                                               \
            const int dy = ky * DH, dx = kx * DW;                                                                    \
            _Pragma("unroll") for (int e = 0; e < MR; e++) {                                                         \
                const int iy = iy0[e] + dy, ix = ix0[e] + dx;                                                        \
                const bool inside = (uint)iy < (uint)H && (uint)ix < (uint)W;                                        \
                panel[k * MR + e] = inside ? xg[cb[e] + coff + iy * W + ix] : 0.0f;                                  \
            }                                                                                                        \
            if (++kx == KW) {                                                                                        \
                kx = 0;                                                                                              \
                if (++ky == KH) { ky = 0; coff += H * W; }                                                           \
            }                                                                                                        \
        }                                                                                                            \
    } while (0)

// The MR x NR tile of pixels p0.. and channel panel nb: NV vectors of channels times MR broadcast pixels of `panel`,
// weights at bp (y, res, bias at the tile's group).
#define PIXEL_TILE(panel, bp)                                                                                        \
    do {                                                                                                             \
        float8 acc[MR][NV];                                                                                          \
        _Pragma("unroll") for (int i = 0; i < MR; i++)                                                               \
            _Pragma("unroll") for (int j = 0; j < NV; j++) acc[i][j] = (float8)(0.0f);                               \
        for (int k = 0; k < KK; k++) {  /* the hot loop */                                                           \
            float8 b[NV];                                                                                            \
            _Pragma("unroll") for (int j = 0; j < NV; j++) b[j] = *(__global const float8*)((bp) + k * NR + 8 * j);  \
            _Pragma("unroll") for (int i = 0; i < MR; i++) {                                                         \
                const float8 a = (float8)((panel)[k * MR + i]);                                                      \
                _Pragma("unroll") for (int j = 0; j < NV; j++) acc[i][j] = a * b[j] + acc[i][j];                     \
            }                                                                                                        \
        }                                                                                                            \
        _Pragma("unroll") for (int i = 0; i < MR; i++) {                                                             \
            const int n = p0 + i;                                                                                    \
            if (n >= NN) break;                                                                                      \
            const int img = n / OHW, p = n - img * OHW;                                                              \
            _Pragma("unroll") for (int j = 0; j < NV; j++) {                                                         \
                const int m0 = nb * NR + 8 * j;                                                                      \
                union { float8 v; float s[8]; } t;                                                                   \
                t.v = acc[i][j];                                                                                     \
                _Pragma("unroll") for (int e = 0; e < 8; e++) {                                                      \
                    if (m0 + e >= K) break;  /* (channels past K: the last panel's zero weights) */                  \
                    float v = t.s[e];                                                                                \
                    ADD_BIAS(v, m0 + e);                                                                             \
                    ADD_RES(v, img * res_nstride + (long)(m0 + e) * OHW + p);                                        \
                    y[img * y_nstride + (long)(m0 + e) * OHW + p] = ACT(v);                                          \
                }                                                                                                    \
            }                                                                                                        \
        }                                                                                                            \
    } while (0)

#if defined(PIXELS_PACKED)
// The weights stay, the pixels pass: every pixel panel packed once, by pixels_pack into xp[g][mb][k][MR], then one
// work-item per (NBS channel panels, share ps of the pixel blocks, group) runs its panels of weights over the pixel
// blocks, each weight panel (KK x NR floats) read from memory once and then from cache. Weights read once per pixel
// block (the __local path) came from memory every time inside a network (resnet50's 3x3 512 at 7 x 7: 9.4 MB of
// weights, 10 blocks of 5 pixels).
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void pixels_pack(__global const float* x, ulong x_off, __global float* xp, int C, int KK, int OHW, int NN, int H,
                 int W, int OW, int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW, long x_nstride) {
    const int mb = get_global_id(0), g = get_global_id(1), MB = get_global_size(0);
    const int p0 = mb * MR;
    __global const float* xg = x + x_off + (long)g * C * H * W;
    __global float* panel = xp + ((long)g * MB + mb) * KK * MR;
    PACK_PIXELS(panel);
}

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void conv2d_cpu_pixels(__global const float* xp, ulong xp_off, __global const float* w, ulong w_off,
                       __global const float* bias, ulong bias_off, __global const float* res, ulong res_off,
                       __global float* y, ulong y_off, int K, int KK, int OHW, int NN, long y_nstride,
                       long res_nstride, int NBS, int MBS) {
    const int ns = get_global_id(0), ps = get_global_id(1), g = get_global_id(2);
    const int NB = (K + NR - 1) / NR, MB = (NN + MR - 1) / MR;
    y += y_off + (long)g * K * OHW;
    res += res_off + (long)g * K * OHW;
    bias += bias_off + g * K;
    const int nb_end = (ns + 1) * NBS < NB ? (ns + 1) * NBS : NB, mb_end = (ps + 1) * MBS < MB ? (ps + 1) * MBS : MB;
    for (int nb = ns * NBS; nb < nb_end; nb++) {
        __global const float* bp = w + w_off + ((long)g * NB + nb) * KK * NR;
        for (int mb = ps * MBS; mb < mb_end; mb++) {
            const int p0 = mb * MR;
            __global const float* panel = xp + xp_off + ((long)g * MB + mb) * KK * MR;
            PIXEL_TILE(panel, bp);
        }
    }
}
#elif defined(B_LOCAL)
// One work-item per (block mb of MR pixels, share ns of the channel panels, group) packs its KK x MR pixel panel into
// __local memory and runs NBS panels of weights on it.
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void conv2d_cpu_pixels(__global const float* x, ulong x_off, __global const float* w, ulong w_off,
                       __global const float* bias, ulong bias_off, __global const float* res, ulong res_off,
                       __global float* y, ulong y_off, int C, int K, int KK, int OHW, int NN, long y_nstride,
                       long res_nstride, int H, int W, int OW, int KH, int KW, int SH, int SW, int PH, int PW, int DH,
                       int DW, long x_nstride, int NBS) {
    __local float panel[B_LOCAL];  // [KK][MR]
    const int mb = get_global_id(0), ns = get_global_id(1), g = get_global_id(2);
    const int p0 = mb * MR, NB = (K + NR - 1) / NR;
    __global const float* xg = x + x_off + (long)g * C * H * W;
    PACK_PIXELS(panel);
    y += y_off + (long)g * K * OHW;
    res += res_off + (long)g * K * OHW;
    bias += bias_off + g * K;
    const int nb_end = (ns + 1) * NBS < NB ? (ns + 1) * NBS : NB;
    for (int nb = ns * NBS; nb < nb_end; nb++) {
        __global const float* bp = w + w_off + ((long)g * NB + nb) * KK * NR;
        PIXEL_TILE(panel, bp);
    }
}
#endif
#endif

// Convolutions without im2col read zero-padded planes (planes.cl, prepended to this file where KHC is defined).
#if defined(KHC)
// The epilogue of a tile at positions p0.. of one image (y, res, bias at that image and group): float8s that lie in
// one output row are vectors, the rest go element by element, dropping ox >= OW and oy >= OH.
#define PADDED_AT(e) ((q + (e)) % Wq < OW && (q + (e)) / Wq < OH ? (q + (e)) / Wq * OW + (q + (e)) % Wq : -1L)
#define STORE_TILE_PADDED()                                                                                          \
    _Pragma("unroll") for (int j = 0; j < NV; j++) {                                                                 \
        const int q = p0 + 8 * j, oy = q / Wq, ox = q - oy * Wq;                                                     \
        if (oy >= OH) break;                                                                                         \
        const bool vec = ox + 8 <= OW;                                                                               \
        STORE_LANES(j, vec, oy * OW + ox, PADDED_AT);                                                                \
    }

// ROW_TILES (panels per output row, NBI = OH * ROW_TILES): a panel lies in one output row, at ox0 = NR * (its index in
// the row); without a residual the row's last one ends at the row's end (overlapping the one before it, whose
// outputs it writes again with the same values), with one (y may be res) its outputs past the row are dropped. No
// division per store and no lane by lane stores where a panel of positions crossed a row's end (squeezenet 1.1's
// stem: 1 vector in 14).
#define ROW_AT(e) (ox + (e) < OW ? (long)oy0 * OW + ox + (e) : -1L)
#define STORE_TILE_ROW()                                                                                             \
    _Pragma("unroll") for (int j = 0; j < NV; j++) {                                                                 \
        const int ox = ox0 + 8 * j;                                                                                  \
        if (ox >= OW) break;                                                                                         \
        const bool vec = ox + 8 <= OW;                                                                               \
        STORE_LANES(j, vec, oy0 * OW + ox, ROW_AT);                                                                  \
    }

// One work-item per (NPW consecutive panels of the NBT, NBI per image; share ms of the row blocks; group): MBS row
// blocks over NR positions each, each row block over the panels in turn (a row's 64-byte lines that two panels share,
// in planes of an odd size, are written one tile after the other). B read in place from the planes xp (pad_planes'
// output), or first copied into __local memory (B_LOCAL).
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void conv2d_cpu_direct(__global const float* xp, ulong xp_off, __global const float* w, ulong w_off,
                       __global const float* bias, ulong bias_off, __global const float* res_base, ulong res_off,
                       __global float* y_base, ulong y_off, int C, int K, int Hq, int Wq, int OH, int OW, int NBI,
                       long xp_nstride, long y_nstride, long res_nstride, int MBS, int NPW, int NBT) {
    const int ns = get_global_id(0), ms = get_global_id(1), g = get_global_id(2);
    const int nb0 = ns * NPW, nb_end = nb0 + NPW < NBT ? nb0 + NPW : NBT;
    const int MB = (K + MR - 1) / MR, KK = C * KHC * KWC, OHW = OH * OW;
    const long plane = (long)Hq * Wq;
    __global const float* x0 = xp + xp_off + g * C * SHP * SWP * plane;
    bias += bias_off + g * K;
// Panel nb: its image, first position p0 in the planes' rows of Wq, and (ROW_TILES) its output row oy0 and column ox0
#if defined(ROW_TILES)
#if defined(HAS_RES)
#define PANEL_OX(t) ((t) * NR)
#else
#define PANEL_OX(t) ((t) * NR < OW - NR ? (t) * NR : OW - NR)
#endif
#define PANEL(nb)                                                                                                    \
    const int img = (nb) / NBI, oy0 = ((nb) - img * NBI) / ROW_TILES;                                               \
    const int ox0 = PANEL_OX((nb) - img * NBI - oy0 * ROW_TILES), p0 = oy0 * Wq + ox0
#else
#define PANEL(nb) const int img = (nb) / NBI, p0 = ((nb) - img * NBI) * NR
#endif
// B row k of tap (c, ky, kx): NR floats at TAP_AT(xr, kx) with xr at (c, ky)
#define TAP_ROWS(c, ky) (xg + (c) * SHP * SWP * plane + TAP_OFF(ky, 0, plane, Wq))
#define TAP_AT(xr, kx) ((xr) + TAP_OFF(0, kx, plane, Wq))
#if defined(B_LOCAL)  // copy each panel's B rows into __local memory first: one contiguous KK x NR block each
    __local float panels[B_LOCAL];
    for (int nb = nb0; nb < nb_end; nb++) {
        PANEL(nb);
        __global const float* xg = x0 + img * xp_nstride + p0;
        __local float* panel = panels + (nb - nb0) * KK * NR;
        for (int c = 0, k = 0; c < C; c++)
            _Pragma("nounroll") for (int ky = 0; ky < KHC; ky++) {
                __global const float* xr = TAP_ROWS(c, ky);
                _Pragma("unroll") for (int kx = 0; kx < KWC; kx++, k++)
                    _Pragma("unroll") for (int j = 0; j < NV; j++)
                        *(__local float8*)(panel + k * NR + 8 * j) = *(__global const float8u*)(TAP_AT(xr, kx) + 8 * j);
            }
    }
#endif
    const int mb_end = (ms + 1) * MBS < MB ? (ms + 1) * MBS : MB;
    for (int mb = ms * MBS; mb < mb_end; mb++) {
        const int m0 = mb * MR;
        for (int nb = nb0; nb < nb_end; nb++) {
            PANEL(nb);
            __global float* y = y_base + y_off + img * y_nstride + (long)g * K * OHW;
            __global const float* res = res_base + res_off + img * res_nstride + (long)g * K * OHW;
            TILE_START();
#if defined(B_LOCAL)
            __local const float* panel = panels + (nb - nb0) * KK * NR;
            for (int k = 0; k < KK; k++) FMA_STEP(__local const float8, panel + k * NR, k);
#else
            __global const float* xg = x0 + img * xp_nstride + p0;
            int k = 0;
            for (int c = 0; c < C; c++)
                _Pragma("nounroll") for (int ky = 0; ky < KHC; ky++) {  // unrolled, a 5x5 layer ran at half speed
                    __global const float* xr = TAP_ROWS(c, ky);
                    _Pragma("unroll") for (int kx = 0; kx < KWC; kx++, k++)
                        FMA_STEP(__global const float8u, TAP_AT(xr, kx), k);
                }
#endif
#if defined(ROW_TILES)
            STORE_TILE_ROW();
#else
            STORE_TILE_PADDED();
#endif
        }
    }
}
#endif

#if defined(WINO_CPU) && defined(B_LOCAL)
// Winograd F(2x2, 3x3) on CPUs, fused: one work-item per (panel of NR 2x2 output tiles of one image, share ms of the
// row blocks) transforms its tiles' 4x4 inputs from the padded planes (pad_planes) into __local V [16][C][NR]
// (V = B^T d B), then per block of MR output channels runs the 16 products M[xi] = U[xi] V[xi] on the register
// tiles, keeps them in __local Mt [16][MR][NR] and writes y = A^T M A with the epilogue. The same F(2x2, 3x3) as
// winograd.cl's GPU kernels; U = G w G^T packed as u[xi][mb][c][MR] (rows past K zero). 16 products of C per 2x2
// outputs against 36 for the direct tiles. Tiles are numbered along rows of TWP (TW rounded up to 8; the rest are
// computed and dropped), so each float8 of a panel is 8 tiles side by side in one row: its inputs are two float16
// loads per row (even and odd columns), its outputs 16 consecutive pixels of two rows (a scalar transform per tile
// took 1.07 ms of a 64-channel 56x56 layer, the products 0.56). Planes of Wq = 2 TWP + 2 hold every tile read.
typedef float16 __attribute__((aligned(4))) float16u;
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void conv2d_cpu_wino(__global const float* xp, ulong xp_off, __global const float* u, ulong u_off,
                     __global const float* bias, ulong bias_off, __global const float* res, ulong res_off,
                     __global float* y, ulong y_off, int C, int K, int Wq, int OH, int OW, int TH, int TW, int TWP,
                     int NBI, long xp_nstride, long y_nstride, long res_nstride, int MBS) {
    __local float panel[B_LOCAL];
    __local float* V = panel;                   // [16][C][NR]
    __local float* Mt = panel + 16 * C * NR;    // [16][MR][NR]
    const int nb = get_global_id(0), ms = get_global_id(1);
    const int img = nb / NBI, t0 = (nb - img * NBI) * NR;
    const int MB = (K + MR - 1) / MR, OHW = OH * OW;
    const long plane = (long)(2 * TH + 2) * Wq;
    int org[NV];  // each float8's first tile: top-left in its plane (rows past the image repeat the last)
    _Pragma("unroll") for (int j = 0; j < NV; j++) {
        const int t = t0 + 8 * j, ty = t / TWP < TH ? t / TWP : TH - 1;
        org[j] = 2 * ty * Wq + 2 * (t - (t / TWP) * TWP);
    }
    __global const float* xg = xp + xp_off + img * xp_nstride;
    for (int c = 0; c < C; c++) {
        _Pragma("unroll") for (int j = 0; j < NV; j++) {
            __global const float* d = xg + c * plane + org[j];
            float8 r[4][4];  // B^T d, 8 tiles at once: column q of tile e at 2 e + q
            _Pragma("unroll") for (int q = 0; q < 2; q++) {
                float16 a[4];
                _Pragma("unroll") for (int i = 0; i < 4; i++) a[i] = *(__global const float16u*)(d + i * Wq + 2 * q);
                const float8 e0 = a[0].even, e1 = a[1].even, e2 = a[2].even, e3 = a[3].even;
                const float8 o0 = a[0].odd, o1 = a[1].odd, o2 = a[2].odd, o3 = a[3].odd;
                r[0][2 * q] = e0 - e2; r[1][2 * q] = e1 + e2; r[2][2 * q] = e2 - e1; r[3][2 * q] = e1 - e3;
                r[0][2 * q + 1] = o0 - o2; r[1][2 * q + 1] = o1 + o2; r[2][2 * q + 1] = o2 - o1;
                r[3][2 * q + 1] = o1 - o3;
            }
            __local float* v = V + c * NR + 8 * j;
            _Pragma("unroll") for (int i = 0; i < 4; i++) {  // (B^T d) B
                *(__local float8*)(v + (4 * i + 0) * C * NR) = r[i][0] - r[i][2];
                *(__local float8*)(v + (4 * i + 1) * C * NR) = r[i][1] + r[i][2];
                *(__local float8*)(v + (4 * i + 2) * C * NR) = r[i][2] - r[i][1];
                *(__local float8*)(v + (4 * i + 3) * C * NR) = r[i][1] - r[i][3];
            }
        }
    }
    y += y_off + img * y_nstride;
    res += res_off + img * res_nstride;
    bias += bias_off;
    const int mb_end = (ms + 1) * MBS < MB ? (ms + 1) * MBS : MB;
    for (int mb = ms * MBS; mb < mb_end; mb++) {
        const int m0 = mb * MR;
        for (int xi = 0; xi < 16; xi++) {
            float8 acc[MR][NV];
            _Pragma("unroll") for (int i = 0; i < MR; i++)
                _Pragma("unroll") for (int j = 0; j < NV; j++) acc[i][j] = (float8)(0.0f);
            __global const float* ap = u + u_off + ((long)xi * MB + mb) * C * MR;
            __local const float* vx = V + xi * C * NR;
            for (int c = 0; c < C; c++) FMA_STEP(__local const float8, vx + c * NR, c);
            _Pragma("unroll") for (int i = 0; i < MR; i++)
                _Pragma("unroll") for (int j = 0; j < NV; j++)
                    *(__local float8*)(Mt + (xi * MR + i) * NR + 8 * j) = acc[i][j];
        }
        for (int i = 0; i < MR && m0 + i < K; i++) {
            const int m = m0 + i;
            _Pragma("unroll") for (int j = 0; j < NV; j++) {
                const int t = t0 + 8 * j, ty = t / TWP, tx = t - ty * TWP;
                if (ty >= TH) break;
                float8 a[16];
                _Pragma("unroll") for (int xi = 0; xi < 16; xi++)
                    a[xi] = *(__local const float8*)(Mt + (xi * MR + i) * NR + 8 * j);
                _Pragma("unroll") for (int h = 0; h < 2; h++) {  // (A^T a) A: output row 2 ty + h of 8 tiles
                    const int oy = 2 * ty + h;
                    if (oy >= OH) break;
                    float8 s[4];
                    _Pragma("unroll") for (int q = 0; q < 4; q++)
                        s[q] = h == 0 ? a[q] + a[4 + q] + a[8 + q] : a[4 + q] - a[8 + q] - a[12 + q];
                    union { float16 v; float s[16]; } o;
                    o.v.even = s[0] + s[1] + s[2];
                    o.v.odd = s[1] - s[2] - s[3];
                    const long at = (long)m * OHW + oy * OW + 2 * tx;
                    const int n = OW - 2 * tx < 16 ? OW - 2 * tx : 16;
                    if (n == 16) {  // 16 pixels of the row: one vector store
                        _Pragma("unroll") for (int e = 0; e < 16; e++) {
                            float r = o.s[e];
                            ADD_BIAS(r, m);
                            ADD_RES(r, at + e);
                            o.s[e] = ACT(r);
                        }
                        *(__global float16u*)(y + at) = o.v;
                    } else {
                        for (int e = 0; e < n; e++) {
                            float r = o.s[e];
                            ADD_BIAS(r, m);
                            ADD_RES(r, at + e);
                            y[at + e] = ACT(r);
                        }
                    }
                }
            }
        }
    }
}
#endif
