// Skinny GEMM of 9..32 rows on NVIDIA tensor cores (tf32 mode): gemv_rows.cl's product, y = act(alpha A B + beta C)
// with A [MR, K] (rows contiguous along k) and B read as columns contiguous along k (B^T [N, K], Gemm transB=1
// weights), and its arguments. Bound by streaming B once: at 16 rows the FMA kernel does 8 flops per byte of B, which
// held it at 1.9-2.3 TB/s; here the products cost a few mma per 1 KiB of B.
//
// A work-group of WARPS warps covers CW = WARPS * NBW * 8 columns over a slice of K (SPLITS slices: partial sums,
// then gemv_rows_reduce), in chunks of KC floats. Per chunk:
// - each lane issues its loads of the next chunk's B (held in registers until then): for each of its warp's NBW
//   blocks of 8 columns, lane (g, t) reads column g's k = 8t .. 8t + 7 of each 32 of depth, two float4 (the 4 lanes
//   of a column read 128 consecutive bytes);
// - the work-group stores the chunk of A (read ahead into registers during the previous chunk) to __local memory,
//   rounded to tf32, MT * 16 rows (zero past MR and past K), KS floats apart;
// - per 32 of depth, each m-tile's A fragments are four float4 reads, and each block of columns takes 4 mma per
//   m-tile. The order of k inside one mma is free as long as A and B agree: mma q takes k = 8t + 2q, 8t + 2q + 1
//   in its slots t and t + 4, so a lane's 8 values of A's row (and of B's column) are two float4s.
// Steps past K read B clamped to its last float4 against zeros of A. mma_tf32.cl and gemv_epilogue.cl come first.
#if !defined(MR) || !defined(WARPS) || !defined(NBW) || !defined(KC) || !defined(SPLITS)
#error "gemv_mma.cl needs MR, WARPS, NBW, KC and SPLITS"
#endif
#define NTHREADS (32 * WARPS)
#define MT ((MR + 15) / 16)
#define KS (KC + 4)  // A's rows in __local memory: KS = 4 mod 32, so the 8 lanes of a float4 phase hit distinct banks
#define CW (WARPS * NBW * 8)
#define PA (MT * 16 * KC / 4 / NTHREADS)  // float4s of A per work-item per chunk
#if KC % 32 || (MT * 16 * KC / 4) % NTHREADS
#error "gemv_mma.cl: KC is whole steps of 32, and a chunk of A whole float4s per work-item"
#endif

__kernel __attribute__((reqd_work_group_size(NTHREADS, 1, 1)))
void gemv_mma(__global const float* a, ulong a_off, __global const float* b, ulong b_off,
              __global const float* c, ulong c_off, __global float* y, ulong y_off,
              int N, int K, int sam, int sbn, int scm, int scn, float alpha, float beta, int chunks,
              __global float* ws, ulong ws_off) {
    __local float As[MT * 16 * KS] __attribute__((aligned(16)));
    const int tid = get_local_id(0), warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int split = get_group_id(1), nw = get_group_id(0) * CW + warp * NBW * 8;
    __global const float* A = a + a_off;
    const int k_begin = split * chunks * KC, k_end = min(K, k_begin + chunks * KC);
    __global const float* brow[NBW];
    for (int j = 0; j < NBW; j++)  // a column past N reads the last one; its sums are not stored
        brow[j] = b + b_off + (long)min(nw + 8 * j + g, N - 1) * sbn;
    float acc[MT][NBW][4];
    for (int i = 0; i < MT; i++)
        for (int j = 0; j < NBW; j++)
            for (int q = 0; q < 4; q++)
                acc[i][j][q] = 0.0f;
    // float4 p of a chunk: row (tid + p NTHREADS) / (KC / 4), float4 (tid + p NTHREADS) % (KC / 4) of the row
#define A_AT(p, c0) { \
        const int i_ = tid + (p) * NTHREADS, m_ = i_ / (KC / 4), k_ = (c0) + i_ % (KC / 4) * 4; \
        pa[p] = m_ < MR && k_ < k_end ? *(__global const float4*)(A + (long)m_ * sam + k_) : (float4)(0.0f); }
    float4 pa[PA];
    for (int p = 0; p < PA; p++)
        A_AT(p, k_begin)
    // B of chunk c0 into w (NBW x 2 float4 per 32 of depth; constant trip counts, unrolled by the compiler)
#define W_AT(w, c0) \
    for (int s = 0; s < KC / 32; s++) \
        for (int j = 0; j < NBW; j++) \
            for (int h = 0; h < 2; h++) \
                w[s][j][h] = *(__global const float4*)(brow[j] + min((c0) + 32 * s + 8 * t + 4 * h, K - 4));
    float4 w[KC / 32][NBW][2], wn[KC / 32][NBW][2];
    W_AT(w, k_begin)
    for (int c0 = k_begin; c0 < k_end; c0 += KC) {
        if (c0 + KC < k_end)  // the next chunk's B in flight while this one is used
            W_AT(wn, c0 + KC)
        barrier(CLK_LOCAL_MEM_FENCE);  // the previous chunk's reads of As are done
        #pragma unroll
        for (int p = 0; p < PA; p++) {
            const int i = tid + p * NTHREADS;
            const uint4 r = (uint4)(TF32_BITS(pa[p].x), TF32_BITS(pa[p].y), TF32_BITS(pa[p].z), TF32_BITS(pa[p].w));
            *(__local float4*)&As[i / (KC / 4) * KS + i % (KC / 4) * 4] = as_float4(r);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (c0 + KC < k_end)
            for (int p = 0; p < PA; p++)
                A_AT(p, c0 + KC)
        #pragma unroll
        for (int s = 0; s < KC / 32; s++) {
            uint fa[MT][4][4];
            #pragma unroll
            for (int i = 0; i < MT; i++) {
                __local const float* r0 = &As[(i * 16 + g) * KS + 32 * s + 8 * t];
                const uint4 l0 = as_uint4(*(__local const float4*)r0), h0 = as_uint4(*(__local const float4*)(r0 + 4));
                const uint4 l1 = as_uint4(*(__local const float4*)(r0 + 8 * KS));
                const uint4 h1 = as_uint4(*(__local const float4*)(r0 + 8 * KS + 4));
                fa[i][0][0] = l0.x; fa[i][0][1] = l1.x; fa[i][0][2] = l0.y; fa[i][0][3] = l1.y;
                fa[i][1][0] = l0.z; fa[i][1][1] = l1.z; fa[i][1][2] = l0.w; fa[i][1][3] = l1.w;
                fa[i][2][0] = h0.x; fa[i][2][1] = h1.x; fa[i][2][2] = h0.y; fa[i][2][3] = h1.y;
                fa[i][3][0] = h0.z; fa[i][3][1] = h1.z; fa[i][3][2] = h0.w; fa[i][3][3] = h1.w;
            }
            #pragma unroll
            for (int j = 0; j < NBW; j++) {
                const float4 lo = w[s][j][0], hi = w[s][j][1];
                const uint fb[4][2] = {{TF32_BITS(lo.x), TF32_BITS(lo.y)}, {TF32_BITS(lo.z), TF32_BITS(lo.w)},
                                       {TF32_BITS(hi.x), TF32_BITS(hi.y)}, {TF32_BITS(hi.z), TF32_BITS(hi.w)}};
                #pragma unroll
                for (int i = 0; i < MT; i++)
                    #pragma unroll
                    for (int q = 0; q < 4; q++)
                        MMA_TF32(acc[i][j], fa[i][q], fb[q]);
            }
        }
        #pragma unroll
        for (int s = 0; s < KC / 32; s++)
            #pragma unroll
            for (int j = 0; j < NBW; j++) {
                w[s][j][0] = wn[s][j][0];
                w[s][j][1] = wn[s][j][1];
            }
    }
    #pragma unroll
    for (int i = 0; i < MT; i++)
        #pragma unroll
        for (int j = 0; j < NBW; j++)
            #pragma unroll
            for (int q = 0; q < 4; q++) {
                const int m = i * 16 + g + (q >> 1) * 8, n = nw + 8 * j + 2 * t + (q & 1);
                if (m >= MR || n >= N)
                    continue;
#if SPLITS > 1
                ws[ws_off + ((long)split * MR + m) * N + n] = acc[i][j][q];
#else
                y[y_off + (long)m * N + n] = epilogue(acc[i][j][q], m, n, c + c_off, scm, scn, alpha, beta);
#endif
            }
}
