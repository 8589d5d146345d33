// Convolution gradients, direct form (correct first; float32, plain OpenCL). 1-D convolutions arrive as H = 1.
// conv2d_dx: one work-item per input element, the transposed convolution of dy with w.
// conv2d_dw: one work-item per weight, the correlation of x with dy over the batch and output pixels.
__kernel void conv2d_dx(__global const float* dy, ulong dy_off, __global const float* w, ulong w_off,
                        __global float* dx, ulong dx_off, int Cin, int H, int W, int Cout, int OH, int OW,
                        int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW, int groups, long total) {
    const long i = get_global_id(0);
    if (i >= total) return;
    const int ix = i % W; long t = i / W;
    const int iy = t % H; t /= H;
    const int ci = t % Cin; const long n = t / Cin;
    const int C = Cin / groups, K = Cout / groups;
    const int g = ci / C, c = ci % C;
    dy += dy_off; w += w_off;
    float acc = 0.0f;
    for (int k = 0; k < K; k++) {
        const int co = g * K + k;
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
                acc = fma(dy[((n * Cout + co) * OH + oy) * OW + ox], w[(((long)co * C + c) * KH + ky) * KW + kx], acc);
            }
        }
    }
    dx[dx_off + i] = acc;
}

__kernel void conv2d_dw(__global const float* dy, ulong dy_off, __global const float* x, ulong x_off,
                        __global float* dw, ulong dw_off, int N, int Cin, int H, int W, int Cout, int OH, int OW,
                        int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW, int groups, long total) {
    const long i = get_global_id(0);
    if (i >= total) return;
    const int kx = i % KW; long t = i / KW;
    const int ky = t % KH; t /= KH;
    const int C = Cin / groups, K = Cout / groups;
    const int c = t % C; const int co = t / C;
    const int ci = (co / K) * C + c;
    dy += dy_off; x += x_off;
    float acc = 0.0f;
    for (int n = 0; n < N; n++) {
        for (int oy = 0; oy < OH; oy++) {
            const int iy = oy * SH - PH + ky * DH;
            if (iy < 0 || iy >= H) continue;
            for (int ox = 0; ox < OW; ox++) {
                const int ix = ox * SW - PW + kx * DW;
                if (ix < 0 || ix >= W) continue;
                acc = fma(dy[(((long)n * Cout + co) * OH + oy) * OW + ox], x[(((long)n * Cin + ci) * H + iy) * W + ix], acc);
            }
        }
    }
    dw[dw_off + i] = acc;
}
