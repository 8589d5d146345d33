// Skinny GEMM for 9..32 rows (a fully connected layer at batch 9..32): y = act(alpha A B + beta C) with A [M, K]
// (M = MR, rows contiguous along k) and B read as columns contiguous along k (B^T [N, K]: ONNX Gemm's transB=1
// weights). Bound by streaming B once, like gemv.cl, but with too many rows to re-read from global memory per column
// group: a work-group of LK x LN work-items covers LN * NC columns over a slice of K, in chunks of KC floats. Per
// chunk, the work-group copies the chunk of every row of A to __local memory once; then each work-item walks the
// chunk in float4 steps LK apart (consecutive lanes, consecutive 16 bytes of each of its NC columns) and uses each
// float4 of A read from __local memory against NC columns (the LN column groups of a lane read the same address: a
// broadcast). At the end the LK lanes of each column sum their MR x NC partial sums through __local memory, RED_ROWS
// rows at a time. With SPLITS > 1 each slice of K writes its sums to ws ([SPLITS, M, N]) and gemv_rows_reduce adds
// them and applies the epilogue (gemv_epilogue.cl, which comes first). Offsets, row strides and K are multiples of 4 floats (the lowering checks).
#if !defined(MR) || !defined(LK) || !defined(LN) || !defined(NC) || !defined(KC4) || !defined(RED_ROWS) || \
    !defined(LOCAL4) || !defined(SPLITS)
#error "gemv_rows.cl needs MR, LK, LN, NC, KC4, RED_ROWS, LOCAL4 and SPLITS"
#endif
#if KC4 % LK
#error "gemv_rows.cl: a chunk (KC4 float4s) is whole steps of LK lanes"
#endif

// chunks: KC4-float4 chunks of K per slice (the last slice may have fewer; the last chunk of K may be partial)
__kernel __attribute__((reqd_work_group_size(LK, LN, 1)))
void gemv_rows(__global const A_T* a, ulong a_off, __global const B_T* b, ulong b_off,
               __global const C_T* c, ulong c_off, __global Y_T* y, ulong y_off,
               int N, int K, int sam, int sbn, int scm, int scn, float alpha, float beta, int chunks,
               __global float* ws, ulong ws_off) {
    __local float4 As[LOCAL4];  // MR x KC4 float4s of A per chunk; then the partial sums (as floats)
    const int lk = get_local_id(0), ln = get_local_id(1), tid = ln * LK + lk;
    const int n_base = get_group_id(0) * LN * NC, split = get_group_id(1);
    const int K4 = K / 4, sam4 = sam / 4, sbn4 = sbn / 4;
    const int k_begin = split * chunks * KC4, k_end = min(K4, k_begin + chunks * KC4);
    int col[NC];
    for (int j = 0; j < NC; j++)
        col[j] = min(n_base + ln * NC + j, N - 1) * sbn4;  // a column past N reads the last one; its sum is not stored
    float acc[MR][NC];
    for (int m = 0; m < MR; m++)
        for (int j = 0; j < NC; j++)
            acc[m][j] = 0.0f;
#ifdef PREFETCH_A
    // PREFETCH_A: the next chunk of A is read into registers while this one is used (its latency hidden)
#if (MR * KC4) % (LK * LN)
#error "gemv_rows.cl: PREFETCH_A takes whole float4s of A per work-item"
#endif
#define PA (MR * KC4 / (LK * LN))
    float4 pa[PA];
    for (int p = 0; p < PA; p++) {
        const int i = tid + p * LK * LN, m = i / KC4, kk = i % KC4;
        pa[p] = kk < k_end - k_begin ? A4(m * sam4 + k_begin + kk) : (float4)(0.0f);
    }
#endif
    for (int c0 = k_begin; c0 < k_end; c0 += KC4) {
        barrier(CLK_LOCAL_MEM_FENCE);  // the previous chunk's reads of As are done
#ifdef PREFETCH_A
        for (int p = 0; p < PA; p++)
            As[tid + p * LK * LN] = pa[p];
        barrier(CLK_LOCAL_MEM_FENCE);
        const int n0 = c0 + KC4;
        if (n0 < k_end)
            for (int p = 0; p < PA; p++) {
                const int i = tid + p * LK * LN, m = i / KC4, kk = i % KC4;
                pa[p] = kk < k_end - n0 ? A4(m * sam4 + n0 + kk) : (float4)(0.0f);
            }
#else
        const int cl = min(KC4, k_end - c0);
        for (int i = tid; i < MR * KC4; i += LK * LN) {
            const int m = i / KC4, kk = i % KC4;
            As[i] = kk < cl ? A4(m * sam4 + c0 + kk) : (float4)(0.0f);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
        // Whole chunks of steps with no bounds test: past K (the last chunk only) A is zero in As and B's index is
        // clamped into the column, so those steps add nothing.
#pragma unroll 4
        for (int step = 0; step < KC4 / LK; step++) {
            const int kk = lk + step * LK, k = min(c0 + kk, K4 - 1);
            float4 w[NC];
            for (int j = 0; j < NC; j++)
                w[j] = B4(col[j] + k);
            for (int m = 0; m < MR; m++) {
                const float4 x = As[m * KC4 + kk];
                for (int j = 0; j < NC; j++)
                    acc[m][j] = fma(x.w, w[j].w, fma(x.z, w[j].z, fma(x.y, w[j].y, fma(x.x, w[j].x, acc[m][j]))));
            }
        }
    }
    // sum the LK lanes of each (row, column): red[(row - m0) * LN * NC + column][lane], RED_ROWS rows per pass
    __local float* red = (__local float*)As;
#pragma unroll
    for (int m0 = 0; m0 < MR; m0 += RED_ROWS) {
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int mm = 0; mm < RED_ROWS; mm++)
            if (m0 + mm < MR)
                for (int j = 0; j < NC; j++)
                    red[((mm * LN + ln) * NC + j) * (LK + 1) + lk] = acc[m0 + mm][j];
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int r = tid; r < RED_ROWS * LN * NC; r += LK * LN) {
            const int m = m0 + r / (LN * NC), n = n_base + r % (LN * NC);
            if (m >= MR || n >= N) continue;
            float s = 0.0f;
            for (int i = 0; i < LK; i++)
                s += red[r * (LK + 1) + i];
#if SPLITS > 1
            ws[ws_off + ((long)split * MR + m) * N + n] = s;
#else
            STORE_Y(y_off + (long)m * N + n, epilogue(s, m, n, c + c_off, scm, scn, alpha, beta));
#endif
        }
    }
}
