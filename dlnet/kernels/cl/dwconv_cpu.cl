// Depthwise convolution on CPU devices (groups == channels, M filters per channel): one work-item per ROWS output
// rows of one (image, output channel). Outputs whose every tap lies inside the row run as float8 blocks with the
// tap's weight broadcast (SW, the horizontal stride, is a define so that stride 1 is one unaligned vector load; the
// kernel's size KHC x KWC too, so that a row of taps unrolls); the last block ends where those outputs end,
// overlapping the one before it. The borders run one output at a time. No fma(): PoCL calls built-ins out of line
// (dwconv.cl's fma per tap ran shufflenet's depthwise layers in 42 ms).
#if !defined(ACT) || !defined(SW) || !defined(KHC) || !defined(KWC)
#error "dwconv_cpu.cl needs ACT(v), SW (horizontal stride), KHC and KWC (kernel size)"
#endif
typedef float8 __attribute__((aligned(4))) float8u;
#if SW == 1
#define LOAD8(p) (*(__global const float8u*)(p))
#else
#define LOAD8(p) ((float8)((p)[0], (p)[SW], (p)[2 * SW], (p)[3 * SW], (p)[4 * SW], (p)[5 * SW], (p)[6 * SW], \
                           (p)[7 * SW]))
#endif

// One output near a border: taps outside the row are skipped (rows outside the image never reach here: ky0, ky1)
inline float scalar_out(__global const float* x, __global const float* w, __global const float* res, float b, int ox,
                        int iy0, int ky0, int ky1, int W, int PW, int DH, int DW) {
    float acc = b;
    const int ix0 = ox * SW - PW;
    for (int ky = ky0; ky < ky1; ky++) {
        __global const float* xr = x + (iy0 + ky * DH) * W;
        for (int kx = 0; kx < KWC; kx++) {
            const int ix = ix0 + kx * DW;
            if (ix >= 0 && ix < W) acc = w[ky * KWC + kx] * xr[ix] + acc;
        }
    }
#if defined(HAS_RES)
    acc += res[ox];
#endif
    return acc;
}

#ifndef ROWS
#define ROWS 1
#endif

// ROWS output rows per work-item, one after another (PoCL's cost per work-group outweighed 14 outputs of work)
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void dwconv2d_cpu(__global const float* x, ulong x_off, __global const float* w, ulong w_off,
                  __global const float* bias, ulong bias_off, __global const float* res, ulong res_off,
                  __global float* y, ulong y_off, int C, int H, int W, int OH, int OW, int KH, int KW, int SH,
                  int PH, int PW, int DH, int DW, int M, long y_nstride, long res_nstride) {
    const int nc = get_global_id(1);
    const int CO = C * M;
    const int n = nc / CO, co = nc - n * CO, ci = co / M;
    x += x_off + ((long)n * C + ci) * H * W;
    w += w_off + (long)co * KHC * KWC;
    const int oy0 = get_global_id(0) * ROWS, oy_end = min(OH, oy0 + ROWS);
    y += y_off + n * y_nstride + (long)co * OH * OW + (long)oy0 * OW;
    res += res_off + n * res_nstride + (long)co * OH * OW + (long)oy0 * OW;
    for (int oy = oy0; oy < oy_end; oy++, y += OW, res += OW) {
    const int iy0 = oy * SH - PH;
    int ky0 = 0, ky1 = KHC;  // taps [ky0, ky1) inside the image
    while (ky0 < KHC && iy0 + ky0 * DH < 0) ky0++;
    while (ky1 > ky0 && iy0 + (ky1 - 1) * DH >= H) ky1--;
#if defined(HAS_BIAS)
    const float b = bias[bias_off + co];
#else
    const float b = 0.0f;
#endif
    // outputs [ox_lo, ox_hi) have every tap inside the row
    int ox_lo = 0;
    while (ox_lo < OW && ox_lo * SW - PW < 0) ox_lo++;
    int ox_hi = OW;
    while (ox_hi > ox_lo && (ox_hi - 1) * SW - PW + (KWC - 1) * DW >= W) ox_hi--;
    int ox = 0;
    for (; ox < OW; ox++) {  // the left border, one output at a time
        if (ox >= ox_lo && ox_hi - ox_lo >= 8) break;
        y[ox] = ACT(scalar_out(x, w, res, b, ox, iy0, ky0, ky1, W, PW, DH, DW));
    }
    if (ox < OW) {
        // blocks of 8 outputs; the last one ends at ox_hi, overlapping the one before it, whose outputs it leaves
        for (;; ox += 8) {
            const int base = min(ox, ox_hi - 8);
            float8 acc = (float8)(b);
            for (int ky = ky0; ky < ky1; ky++) {
                __global const float* xr = x + (iy0 + ky * DH) * W + base * SW - PW;
                #pragma unroll
                for (int kx = 0; kx < KWC; kx++) acc = (float8)(w[ky * KWC + kx]) * LOAD8(xr + kx * DW) + acc;
            }
#if defined(HAS_RES)
            acc += *(__global const float8u*)(res + base);
#endif
            float o[8];
            o[0] = ACT(acc.s0); o[1] = ACT(acc.s1); o[2] = ACT(acc.s2); o[3] = ACT(acc.s3);
            o[4] = ACT(acc.s4); o[5] = ACT(acc.s5); o[6] = ACT(acc.s6); o[7] = ACT(acc.s7);
            if (base == ox) {
                *(__global float8u*)(y + ox) = (float8)(o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7]);
            } else {  // (y may be res itself: the outputs already written are not read again)
                for (int j = ox - base; j < 8; j++) y[base + j] = o[j];
            }
            if (base + 8 >= ox_hi) break;
        }
        for (ox = ox_hi; ox < OW; ox++)  // the right border
            y[ox] = ACT(scalar_out(x, w, res, b, ox, iy0, ky0, ky1, W, PW, DH, DW));
    }
    }
}

#if defined(SHC)  // planes.cl prepended
// The same convolution over zero-padded planes (planes.cl): no borders, every output a lane of a float8 of
// consecutive positions q = oy * Wq + ox, ox >= OW dropped (7x7 planes ran one output at a time through scalar_out:
// shufflenet's 544-channel layers 0.20 ms each). A work-item per ROWS output rows of PER (image, output channel)
// planes.
// PAD_IN: no pad_planes launch before it; the work-item copies the padded rows its outputs read, rows
// oy0 .. oy0 + BUF_ROWS of each phase plane (WQ floats each), from x itself (channel cmap[ci] with CHANNEL_MAP) into
// a private buffer, and reads them there (shufflenet's pad launches took 0.02-0.10 ms each, most of it PoCL's cost
// per launch).
#if defined(PAD_IN)
#define XAS __private
#if defined(RB)  // (row blocks of RB rows: the last one's rows past ROWS are computed from the buffer and dropped)
#define BUF_ROWS ((ROWS + RB - 1) / RB * RB + (KHC - 1) * DHC / SHC)
#else
#define BUF_ROWS (ROWS + (KHC - 1) * DHC / SHC)
#endif
#else
#define XAS __global
#endif
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void dwconv2d_cpu_planes(__global const float* xp, ulong xp_off, __global const float* w, ulong w_off,
                         __global const float* bias, ulong bias_off, __global const float* res, ulong res_off,
                         __global float* y, ulong y_off, int C, int Hq, int Wq, int OH, int OW, int M,
                         long xp_nstride, long y_nstride, long res_nstride, int NCO, int PER
#if defined(PAD_IN)
                         , int H, int W, int PH, int PW
#if defined(CHANNEL_MAP)
                         , __global const int* cmap, ulong cmap_off
#endif
#endif
                         ) {
    const int nc_end = (get_global_id(1) + 1) * PER < NCO ? (get_global_id(1) + 1) * PER : NCO;
    for (int nc = get_global_id(1) * PER; nc < nc_end; nc++) {
    const int CO = C * M;
    const int n = nc / CO, co = nc - n * CO, ci = co / M;
#if defined(PAD_IN)
    const long plane = BUF_ROWS * WQ;
    const int oy0 = get_global_id(0) * ROWS, oy_end = min(OH, oy0 + ROWS);
#if defined(CHANNEL_MAP)
    const long cx = cmap[cmap_off + ci];
#else
    const long cx = ci;
#endif
    __global const float* xs = xp + xp_off + n * xp_nstride + cx * H * W;
    float buf[SHP * SWP * BUF_ROWS * WQ + 8];  // (dropped positions of the last row read up to 7 floats past it)
    for (int ph = 0; ph < SHP * SWP; ph++) {
        const int py = ph / SWP, px = ph - py * SWP;
        PHASE_COLS(lo, hi, px, PW, W, WQ)
        for (int r = 0; r < BUF_ROWS; r++) {
            float* row = buf + (ph * BUF_ROWS + r) * WQ;
            const int iy = (oy0 + r) * SHC + py - PH;
            if (iy < 0 || iy >= H || oy0 + r >= Hq) {
                for (int j = 0; j < WQ; j++) row[j] = 0.0f;
                continue;
            }
            PAD_ROW(row, xs + iy * W + px - PW, lo, hi, WQ)
        }
    }
    for (int j = 0; j < 8; j++) buf[SHP * SWP * BUF_ROWS * WQ + j] = 0.0f;
    XAS const float* xc = buf;
    const int qrow0 = oy0;  // the buffer's first row is the plane's row oy0
#else
    const long plane = (long)Hq * Wq;
    XAS const float* xc = xp + xp_off + n * xp_nstride + (long)ci * SHP * SWP * plane;
    const int qrow0 = 0;
#endif
    float wt[KHC * KWC];
    _Pragma("unroll") for (int t = 0; t < KHC * KWC; t++) wt[t] = w[w_off + (long)co * KHC * KWC + t];
#if defined(HAS_BIAS)
    const float b = bias[bias_off + co];
#else
    const float b = 0.0f;
#endif
#if !defined(PAD_IN)
    const int oy0 = get_global_id(0) * ROWS, oy_end = min(OH, oy0 + ROWS);
#endif
    __global float* yc = y + y_off + n * y_nstride + (long)co * OH * OW;
    __global const float* rc = res + res_off + n * res_nstride + (long)co * OH * OW;
#if defined(RB)
    // Row blocks (OWC, VC, RB: rules.dw_row_block): RB output rows x VC float8s of a row at once, VC * RB independent
    // accumulators (one vector at a time, a chain of 9 dependent FMAs: shufflenet's 136 x 28 x 28 layer 0.043 against
    // 0.031 ms); a row's
    // vector j starts at VBASE(j), the last ending at the row's end (overlapping the one before it; those past the
    // row's vectors repeat it). Overlapping vectors store all their lanes, the repeated ones the same values; with a
    // residual (y may be res) they add rlast, the row's last 8 residuals read before any of the row's stores.
#define NVR ((OWC + 7) / 8)
#define VBASE(j) (8 * (j) + 8 <= OWC || OWC < 8 ? 8 * (j) : OWC - 8)
    for (int oy = oy0; oy < oy_end; oy += RB) {
#if defined(HAS_RES) && OWC >= 8
        float8 rlast[RB];
        _Pragma("unroll") for (int r = 0; r < RB; r++)
            if (oy + r < oy_end) rlast[r] = *(__global const float8u*)(rc + (oy + r) * OW + OWC - 8);
#endif
        for (int c0 = 0; c0 < NVR; c0 += VC) {
            float8 acc[RB][VC];
            _Pragma("unroll") for (int r = 0; r < RB; r++)
                _Pragma("unroll") for (int v = 0; v < VC; v++) acc[r][v] = (float8)(b);
            _Pragma("unroll") for (int ky = 0; ky < KHC; ky++)
                _Pragma("unroll") for (int kx = 0; kx < KWC; kx++) {
                    const float8 wv = (float8)(wt[ky * KWC + kx]);
                    _Pragma("unroll") for (int r = 0; r < RB; r++)
                        _Pragma("unroll") for (int v = 0; v < VC; v++)
                            acc[r][v] = wv * *(XAS const float8u*)(xc + (oy - qrow0 + r) * Wq + VBASE(c0 + v) +
                                                                  TAP_OFF(ky, kx, plane, Wq)) + acc[r][v];
                }
#if OWC >= 8
#if defined(HAS_RES)  // (every residual of the block read before its first store)
            _Pragma("unroll") for (int r = 0; r < RB; r++)
                _Pragma("unroll") for (int v = 0; v < VC; v++)
                    if (oy + r < oy_end)
                        acc[r][v] += VBASE(c0 + v) == 8 * (c0 + v) ?
                            *(__global const float8u*)(rc + (oy + r) * OW + 8 * (c0 + v)) : rlast[r];
#endif
            _Pragma("unroll") for (int r = 0; r < RB; r++) {
                if (oy + r >= oy_end) break;
                _Pragma("unroll") for (int v = 0; v < VC; v++) {
                    union { float8 v; float s[8]; } o;
                    o.v = acc[r][v];
                    _Pragma("unroll") for (int e = 0; e < 8; e++) o.s[e] = ACT(o.s[e]);
                    *(__global float8u*)(yc + (oy + r) * OW + VBASE(c0 + v)) = o.v;
                }
            }
#else  // rows shorter than a vector: OWC lanes each
            _Pragma("unroll") for (int r = 0; r < RB; r++) {
                if (oy + r >= oy_end) break;
                union { float8 v; float s[8]; } o;
                o.v = acc[r][0];
                _Pragma("unroll") for (int e = 0; e < OWC; e++) {
                    float t = o.s[e];
#if defined(HAS_RES)
                    t += rc[(oy + r) * OW + e];
#endif
                    yc[(oy + r) * OW + e] = ACT(t);
                }
            }
#endif
        }
    }
#else
    for (int oy = oy0; oy < oy_end; oy++)
        for (int ox = 0; ox < OW; ox += 8) {  // a row's last vector ends at its end, overlapping the one before
            const int base = ox + 8 <= OW || OW < 8 ? ox : OW - 8;
            const int q = (oy - qrow0) * Wq + base;
            float8 acc = (float8)(b);
            _Pragma("unroll") for (int ky = 0; ky < KHC; ky++)
                _Pragma("unroll") for (int kx = 0; kx < KWC; kx++)
                    acc = (float8)(wt[ky * KWC + kx]) * *(XAS const float8u*)(xc + q + TAP_OFF(ky, kx, plane, Wq))
                          + acc;
            union { float8 v; float s[8]; } o;
            o.v = acc;
            if (base == ox && ox + 8 <= OW) {  // eight new outputs
#if defined(HAS_RES)
                o.v += *(__global const float8u*)(rc + oy * OW + ox);
#endif
                _Pragma("unroll") for (int e = 0; e < 8; e++) o.s[e] = ACT(o.s[e]);
                *(__global float8u*)(yc + oy * OW + ox) = o.v;
            } else {  // the new outputs of an overlapping or short vector (y may be res: none is read after written)
                for (int e = ox - base; e < 8 && base + e < OW; e++) {
                    float r = o.s[e];
#if defined(HAS_RES)
                    r += rc[oy * OW + base + e];
#endif
                    yc[oy * OW + base + e] = ACT(r);
                }
            }
        }
#endif
    }
}
#endif
