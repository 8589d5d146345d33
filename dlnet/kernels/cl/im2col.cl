// col[k, n] for k = (c, ky, kx) and n = (image, oy, ox): the convolution's B matrix, laid out for gemm_vec.cl.
__kernel void im2col(__global const float* x, ulong x_off, __global float* col, int C, int H, int W, int OH, int OW,
                     int KH, int KW, int SH, int SW, int PH, int PW, int DH, int DW, long x_nstride, int NN,
                     long total) {
    const long i = get_global_id(0);
    if (i >= total) return;
    const int n = i % NN; const int k = i / NN;
    const int kx = k % KW; const int t = k / KW; const int ky = t % KH; const int c = t / KH;
    const int ox = n % OW; const int t2 = n / OW; const int oy = t2 % OH; const int img = t2 / OH;
    const int iy = oy * SH - PH + ky * DH, ix = ox * SW - PW + kx * DW;
    col[i] = (iy >= 0 && iy < H && ix >= 0 && ix < W) ? x[x_off + img * x_nstride + ((long)c * H + iy) * W + ix]
                                                        : 0.0f;
}
