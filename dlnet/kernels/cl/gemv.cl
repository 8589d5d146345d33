// Skinny GEMM for a few rows (a fully connected layer at a small batch): y = act(alpha A B + beta C) with A [M, K]
// (M <= MR, rows contiguous along k) and B read as columns contiguous along k (B^T [N, K]: ONNX Gemm's transB=1
// weights). Such a layer is bound by reading B once, so the kernel streams B at full width and keeps every row of A
// in registers against it: a work-group of LK x LN work-items covers LN * NC columns; the LK work-items of a column
// group walk k in float4 steps LK apart (consecutive lanes, consecutive 16 bytes of each column) and sum their parts
// through local memory at the end. Offsets, row strides and K are multiples of 4 floats (the lowering checks).
// gemv_half.cl comes first (A4, B4: float4 loads of A and B, in half where defined so).
#ifndef ACT
#error "gemv.cl needs ACT(v)"
#endif

__kernel __attribute__((reqd_work_group_size(LK, LN, 1)))
void gemv(__global const A_T* a, ulong a_off, __global const B_T* b, ulong b_off,
          __global const C_T* c, ulong c_off, __global Y_T* y, ulong y_off,
          int M, int N, int K, int sam, int sbn, int scm, int scn, float alpha, float beta) {
    __local float part[LN * NC * MR][LK + 1];
    const int lk = get_local_id(0), ln = get_local_id(1);
    const int n0 = (get_group_id(0) * LN + ln) * NC;
    const int K4 = K / 4, sam4 = sam / 4, sbn4 = sbn / 4;
    int col[NC];
    for (int j = 0; j < NC; j++)
        col[j] = min(n0 + j, N - 1) * sbn4;  // a column past N reads the last one; its sum is not stored
    float acc[MR][NC];
    for (int m = 0; m < MR; m++)
        for (int j = 0; j < NC; j++)
            acc[m][j] = 0.0f;
#pragma unroll 2
    for (int k = lk; k < K4; k += LK) {
        float4 w[NC];
        for (int j = 0; j < NC; j++)
            w[j] = B4(col[j] + k);
        for (int m = 0; m < MR; m++) {
            if (m < M) {
                const float4 x = A4(m * sam4 + k);
                for (int j = 0; j < NC; j++)
                    acc[m][j] = fma(x.w, w[j].w, fma(x.z, w[j].z, fma(x.y, w[j].y, fma(x.x, w[j].x, acc[m][j]))));
            }
        }
    }
    for (int m = 0; m < MR; m++)
        for (int j = 0; j < NC; j++)
            part[(ln * NC + j) * MR + m][lk] = acc[m][j];
    barrier(CLK_LOCAL_MEM_FENCE);
    // each work-item sums whole rows of `part` (one (column, row) pair per row)
    for (int r = ln * LK + lk; r < LN * NC * MR; r += LK * LN) {
        const int m = r % MR, cj = r / MR, n = get_group_id(0) * LN * NC + cj;
        if (m >= M || n >= N) continue;
        float s = 0.0f;
        for (int i = 0; i < LK; i++)
            s += part[r][i];
        float v = alpha * s;
#ifdef HAS_C
        v += beta * LOAD_C(c, c_off + (long)m * scm + (long)n * scn);
#endif
        STORE_Y(y_off + (long)m * N + n, ACT(v));
    }
}
