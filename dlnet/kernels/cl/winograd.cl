// Winograd F(2x2, 3x3) for 3x3 stride-1 convolutions (Lavin & Gray, 2015); F(4x4, 3x3) for inference further down,
// in programs of their own (WINO_M 4). Per 2x2 output tile and channel pair, y = A^T [U . V] A with U = G w G^T (the weights, transformed once at plan time) and V = B^T d B (d: the 4x4 input
// tile under it). The sixteen sums over channels of U[xi] . V[xi] are a batched GEMM on the device's core
// (M[xi] = U[xi] V[xi], K x C times C x T); these two kernels are the transforms around it. t numbers the tiles
// (image, tile row, tile column); a launch covers the chunk of tiles t0 .. t0 + tc, with V [16][C][tc] and
// M [16][K][tc], so work-items along t touch consecutive words.
#ifndef IDX
#define IDX long
#endif
#ifndef ACT
#error "winograd.cl needs ACT(v)"
#endif
#ifndef WINO_M
#define WINO_M 2  // F(2x2, 3x3) (inference and training) or 4: F(4x4, 3x3) (inference), each program one of them
#endif
// conv_half.cl comes first: x, bias, res and y in half where precision "fp16" stores them so (V and M stay float)
#if defined(HAS_RES)
#define RES(o) LDRES(o)
#else
#define RES(o) 0.0f
#endif
#if defined(HAS_BIAS)
#define BIAS(k) LDBIAS(k)
#else
#define BIAS(k) 0.0f
#endif

#if WINO_M != 4
// global (T, C): one 4x4 input tile of one channel -> its 16 transformed values
__kernel void wino_input(__global const X_T* x, ulong x_off, __global float* v, ulong v_off,
                         int C, int H, int W, int PH, int PW, int TH, int TW, int t0, int tc) {
    const int tl = get_global_id(0), c = get_global_id(1), t = t0 + tl;
    if (tl >= tc) return;
    const int tx = t % TW, r = t / TW, ty = r % TH, img = r / TH;
    x += x_off + ((IDX)img * C + c) * H * W;
    const int y0 = 2 * ty - PH, x0 = 2 * tx - PW;
    float d[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            const int iy = y0 + i, ix = x0 + j;
            const bool in = (uint)iy < (uint)H && (uint)ix < (uint)W;
            const float val = LDX(in ? iy * W + ix : 0);
            d[i][j] = in ? val : 0.0f;
        }
    float e[4][4];  // B^T d
    for (int j = 0; j < 4; j++) {
        e[0][j] = d[0][j] - d[2][j]; e[1][j] = d[1][j] + d[2][j];
        e[2][j] = d[2][j] - d[1][j]; e[3][j] = d[1][j] - d[3][j];
    }
    const IDX plane = (IDX)C * tc;
    v += v_off + (IDX)c * tc + tl;
    for (int i = 0; i < 4; i++) {  // (B^T d) B
        v[(4 * i + 0) * plane] = e[i][0] - e[i][2];
        v[(4 * i + 1) * plane] = e[i][1] + e[i][2];
        v[(4 * i + 2) * plane] = e[i][2] - e[i][1];
        v[(4 * i + 3) * plane] = e[i][1] - e[i][3];
    }
}

// global (T, K): the 16 products of one tile and output channel -> its 2x2 outputs, + bias, + residual, activation
__kernel void wino_output(__global const float* m, ulong m_off, __global const BIAS_T* bias, ulong bias_off,
                          __global const RES_T* res, ulong res_off, __global Y_T* y, ulong y_off,
                          int K, int OH, int OW, int TH, int TW, int t0, int tc, long y_nstride,
                          long res_nstride) {
    const int tl = get_global_id(0), k = get_global_id(1), t = t0 + tl;
    if (tl >= tc) return;
    const int tx = t % TW, r = t / TW, ty = r % TH, img = r / TH;
    const IDX plane = (IDX)K * tc;
    m += m_off + (IDX)k * tc + tl;
    float a[16];
    for (int i = 0; i < 16; i++)
        a[i] = m[i * plane];
    float s[2][4];  // A^T a
    for (int j = 0; j < 4; j++) {
        s[0][j] = a[j] + a[4 + j] + a[8 + j];
        s[1][j] = a[4 + j] - a[8 + j] - a[12 + j];
    }
    bias += bias_off;
    const float b = BIAS(k);
    const IDX ybase = (IDX)img * y_nstride + (IDX)k * OH * OW, rbase = (IDX)img * res_nstride + (IDX)k * OH * OW;
    y += y_off; res += res_off;
    for (int i = 0; i < 2; i++) {  // (A^T a) A
        const int oy = 2 * ty + i;
        const float o0 = s[i][0] + s[i][1] + s[i][2], o1 = s[i][1] - s[i][2] - s[i][3];
        if (oy < OH) {
            const int ox = 2 * tx;
            const IDX p = (IDX)oy * OW + ox;
            { float r_ = o0 + b + RES(rbase + p); STY(ybase + p, ACT(r_)); }
            if (ox + 1 < OW) { float r_ = o1 + b + RES(rbase + p + 1); STY(ybase + p + 1, ACT(r_)); }
        }
    }
}

#endif
#if WINO_M == 4
// F(4x4, 3x3) for inference (passes/winograd.py's AT4, BT4: interpolation points 0, 1, -1, 1/2, -2): 6x6 input
// tiles 4 apart, 36 products per tile (U [6, 6, K, C] made on the host), V [36][C][tc] and M [36][K][tc] as above.
#define BT4_ROWS { {1.f, -1.5f, -2.f, 1.5f, 1.f, 0.f}, {0.f, -1.f, .5f, 2.5f, 1.f, 0.f}, \
                   {0.f, 1.f, -2.5f, .5f, 1.f, 0.f}, {0.f, -2.f, -1.f, 2.f, 1.f, 0.f}, \
                   {0.f, .5f, -1.f, -.5f, 1.f, 0.f}, {0.f, 1.f, -1.5f, -2.f, 1.5f, 1.f} }
#define AT4_ROWS { {1.f, 1.f, 1.f, 1.f, 1.f, 0.f}, {0.f, 1.f, -1.f, .5f, -2.f, 0.f}, \
                   {0.f, 1.f, 1.f, .25f, 4.f, 0.f}, {0.f, 1.f, -1.f, .125f, -8.f, 1.f} }

// global (T, C): one 6x6 input tile of one channel -> its 36 transformed values B^T d B
__kernel void wino_input4(__global const X_T* x, ulong x_off, __global float* v, ulong v_off,
                          int C, int H, int W, int PH, int PW, int TH, int TW, int t0, int tc) {
    const int tl = get_global_id(0), c = get_global_id(1), t = t0 + tl;
    if (tl >= tc) return;
    const float bt[6][6] = BT4_ROWS;
    const int tx = t % TW, r = t / TW, ty = r % TH, img = r / TH;
    x += x_off + ((IDX)img * C + c) * H * W;
    const int y0 = 4 * ty - PH, x0 = 4 * tx - PW;
    float d[6][6];
    #pragma unroll
    for (int i = 0; i < 6; i++)
        #pragma unroll
        for (int j = 0; j < 6; j++) {
            const int iy = y0 + i, ix = x0 + j;
            const bool in = (uint)iy < (uint)H && (uint)ix < (uint)W;
            const float val = LDX(in ? iy * W + ix : 0);
            d[i][j] = in ? val : 0.0f;
        }
    float e[6][6];  // B^T d
    #pragma unroll
    for (int i = 0; i < 6; i++)
        #pragma unroll
        for (int j = 0; j < 6; j++) {
            float acc = 0.0f;
            #pragma unroll
            for (int l = 0; l < 6; l++)
                acc += bt[i][l] * d[l][j];
            e[i][j] = acc;
        }
    const IDX plane = (IDX)C * tc;
    v += v_off + (IDX)c * tc + tl;
    #pragma unroll
    for (int i = 0; i < 6; i++)  // (B^T d) B
        #pragma unroll
        for (int j = 0; j < 6; j++) {
            float acc = 0.0f;
            #pragma unroll
            for (int l = 0; l < 6; l++)
                acc += e[i][l] * bt[j][l];
            v[(6 * i + j) * plane] = acc;
        }
}

// global (T, K): the 36 products of one tile and output channel -> its 4x4 outputs A^T m A, + bias, + residual,
// activation
__kernel void wino_output4(__global const float* m, ulong m_off, __global const BIAS_T* bias, ulong bias_off,
                           __global const RES_T* res, ulong res_off, __global Y_T* y, ulong y_off,
                           int K, int OH, int OW, int TH, int TW, int t0, int tc, long y_nstride,
                           long res_nstride) {
    const int tl = get_global_id(0), k = get_global_id(1), t = t0 + tl;
    if (tl >= tc) return;
    const float at[4][6] = AT4_ROWS;
    const int tx = t % TW, r = t / TW, ty = r % TH, img = r / TH;
    const IDX plane = (IDX)K * tc;
    m += m_off + (IDX)k * tc + tl;
    float a[6][6];
    #pragma unroll
    for (int i = 0; i < 6; i++)
        #pragma unroll
        for (int j = 0; j < 6; j++)
            a[i][j] = m[(6 * i + j) * plane];
    float s[4][6];  // A^T a
    #pragma unroll
    for (int i = 0; i < 4; i++)
        #pragma unroll
        for (int j = 0; j < 6; j++) {
            float acc = 0.0f;
            #pragma unroll
            for (int l = 0; l < 6; l++)
                acc += at[i][l] * a[l][j];
            s[i][j] = acc;
        }
    bias += bias_off;
    const float b = BIAS(k);
    const IDX ybase = (IDX)img * y_nstride + (IDX)k * OH * OW, rbase = (IDX)img * res_nstride + (IDX)k * OH * OW;
    y += y_off; res += res_off;
    #pragma unroll
    for (int i = 0; i < 4; i++) {  // (A^T a) A
        const int oy = 4 * ty + i;
        if (oy >= OH) break;
        #pragma unroll
        for (int j = 0; j < 4; j++) {
            const int ox = 4 * tx + j;
            float acc = 0.0f;
            #pragma unroll
            for (int l = 0; l < 6; l++)
                acc += s[i][l] * at[j][l];
            if (ox < OW) {
                const IDX p = (IDX)oy * OW + ox;
                float r_ = acc + b + RES(rbase + p);
                STY(ybase + p, ACT(r_));
            }
        }
    }
}
#else

// global (K * C): one 3x3 filter -> its 16 transformed values U[xi][k][c] = (G g G^T)[xi], for weights that change
// every step (training). g = w[k][c] ([K, C, 3, 3]); with FLIP, the filter of dX = conv(dy, w flipped and
// transposed): g[i][j] = w[c][k][2 - i][2 - j] (w [C, K, 3, 3]: dy's channels are this convolution's inputs).
__kernel void wino_weights(__global const float* w, ulong w_off, __global float* u, ulong u_off, int K, int C) {
    const int id = get_global_id(0);
    if (id >= K * C) return;
    const int k = id / C, c = id % C;
    float g[3][3];
#ifdef FLIP
    w += w_off + ((IDX)c * K + k) * 9;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++)
            g[i][j] = w[(2 - i) * 3 + (2 - j)];
#else
    w += w_off + ((IDX)k * C + c) * 9;
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++)
            g[i][j] = w[i * 3 + j];
#endif
    float t[4][3];  // G g
    for (int j = 0; j < 3; j++) {
        const float s = g[0][j] + g[2][j];
        t[0][j] = g[0][j]; t[1][j] = (s + g[1][j]) * 0.5f; t[2][j] = (s - g[1][j]) * 0.5f; t[3][j] = g[2][j];
    }
    const IDX plane = (IDX)K * C;
    u += u_off + (IDX)k * C + c;
    for (int i = 0; i < 4; i++) {  // (G g) G^T
        const float s = t[i][0] + t[i][2];
        u[(4 * i + 0) * plane] = t[i][0];
        u[(4 * i + 1) * plane] = (s + t[i][1]) * 0.5f;
        u[(4 * i + 2) * plane] = (s - t[i][1]) * 0.5f;
        u[(4 * i + 3) * plane] = t[i][2];
    }
}

// Weight gradients. With Y = A^T [U . V] A per tile, dL/dU = sum over tiles of (A dY A^T) . V, and dw = G^T (dL/dU) G.
// global (T, K): one 2x2 tile of dy (zeros past the output's edge) of one channel -> its 16 values A dY A^T,
// laid out as wino_input lays out V ([16][K][tc]), so that the sixteen sums over tiles are a batched GEMM.
__kernel void wino_dy(__global const float* dy, ulong dy_off, __global float* e, ulong e_off,
                      int K, int OH, int OW, int TH, int TW, int t0, int tc) {
    const int tl = get_global_id(0), k = get_global_id(1), t = t0 + tl;
    if (tl >= tc) return;
    const int tx = t % TW, r = t / TW, ty = r % TH, img = r / TH;
    dy += dy_off + ((IDX)img * K + k) * OH * OW;
    float g[2][2];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            const int oy = 2 * ty + i, ox = 2 * tx + j;
            const bool in = oy < OH && ox < OW;
            const float val = dy[in ? oy * OW + ox : 0];
            g[i][j] = in ? val : 0.0f;
        }
    float s[4][2];  // A g, A = [[1, 0], [1, 1], [1, -1], [0, -1]]
    for (int j = 0; j < 2; j++) {
        s[0][j] = g[0][j]; s[1][j] = g[0][j] + g[1][j]; s[2][j] = g[0][j] - g[1][j]; s[3][j] = -g[1][j];
    }
    const IDX plane = (IDX)K * tc;
    e += e_off + (IDX)k * tc + tl;
    for (int i = 0; i < 4; i++) {  // (A g) A^T
        e[(4 * i + 0) * plane] = s[i][0];
        e[(4 * i + 1) * plane] = s[i][0] + s[i][1];
        e[(4 * i + 2) * plane] = s[i][0] - s[i][1];
        e[(4 * i + 3) * plane] = -s[i][1];
    }
}

// global (K * C): the 16 sums m[xi][k][c] of one filter -> its 3x3 gradient G^T m G, stored as w [K, C, 3, 3]
__kernel void wino_dw(__global const float* m, ulong m_off, __global float* dw, ulong dw_off, int K, int C) {
    const int id = get_global_id(0);
    if (id >= K * C) return;
    const IDX plane = (IDX)K * C;
    m += m_off + id;
    float a[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            a[i][j] = m[(4 * i + j) * plane];
    float t[3][4];  // G^T a, G^T = [[1, .5, .5, 0], [0, .5, -.5, 0], [0, .5, .5, 1]]
    for (int j = 0; j < 4; j++) {
        const float p = 0.5f * (a[1][j] + a[2][j]);
        t[0][j] = a[0][j] + p; t[1][j] = 0.5f * (a[1][j] - a[2][j]); t[2][j] = p + a[3][j];
    }
    dw += dw_off + (IDX)id * 9;
    for (int i = 0; i < 3; i++) {  // (G^T a) G
        const float p = 0.5f * (t[i][1] + t[i][2]);
        dw[3 * i + 0] = t[i][0] + p;
        dw[3 * i + 1] = 0.5f * (t[i][1] - t[i][2]);
        dw[3 * i + 2] = p + t[i][3];
    }
}
#endif
