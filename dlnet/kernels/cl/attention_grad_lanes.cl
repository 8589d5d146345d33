// Attention's gradient on CPUs with rows in vector lanes (attention_grad_q_lanes, attention_grad_kv_lanes: where Tq,
// Tk have 8 rows), the maths of attention_grad.cl's kernels, which come before this file with the same arguments. A
// work-item takes 8 query rows (dq) or 8 key rows (dk, dv) of one batch * head, row r in lane r of every float8,
// their own vectors transposed once (float8 of the 8 rows' values at d). The scores and dy . v of a block of 8 keys
// (queries) are 8 accumulators over the head dim, each a multiply-add of the 8 rows' values at d by one key's
// (query's) value: no horizontal sums, and each score's exp in a loop over all lanes that the compiler vectorises
// (attention_cpu.cl's attention_cpu_rows does the forward so). dq (dk, dv) accumulate transposed too and are stored
// row by row at the end. Rows past the end repeat the last one and are never stored; keys (queries) past the end read
// the last one and get p = 0.

// the 8 rows' value at d of rows p, p + st, ... (n of them: the rest repeat the last)
inline float8 lanes8(__global const float* p, long st, int n, int d) {
    return (float8)(p[d], p[IMIN(1, n - 1) * st + d], p[IMIN(2, n - 1) * st + d], p[IMIN(3, n - 1) * st + d],
                    p[IMIN(4, n - 1) * st + d], p[IMIN(5, n - 1) * st + d], p[IMIN(6, n - 1) * st + d],
                    p[IMIN(7, n - 1) * st + d]);
}

// row r of the 8 transposed vectors xt[0 .. n) into row (a row of n floats)
inline void put_lane(__global float* row, const float8* xt, int n, int r) {
    for (int d = 0; d < n; d++) {
        union { float8 v; float s[8]; } u;
        u.v = xt[d];
        row[d] = u.s[r];
    }
}

// named pointers X0..X7 to rows i0.. of base (stride st), past `last` the last
#define ROWS8(X, base, st, i0, last) \
    const __global float *X##0 = (base) + (long)IMIN((i0), (last)) * (st), \
        *X##1 = (base) + (long)IMIN((i0) + 1, (last)) * (st), *X##2 = (base) + (long)IMIN((i0) + 2, (last)) * (st), \
        *X##3 = (base) + (long)IMIN((i0) + 3, (last)) * (st), *X##4 = (base) + (long)IMIN((i0) + 4, (last)) * (st), \
        *X##5 = (base) + (long)IMIN((i0) + 5, (last)) * (st), *X##6 = (base) + (long)IMIN((i0) + 6, (last)) * (st), \
        *X##7 = (base) + (long)IMIN((i0) + 7, (last)) * (st);
// z[0..8) = the transposed xt[0 .. n) dotted with rows X0..X7 (8 independent chains)
#define DOTS8(z, xt, X, n) { \
    float8 a0 = (float8)(0.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0; \
    for (int d = 0; d < (n); d++) { \
        const float8 x_ = (xt)[d]; \
        a0 = x_ * X##0[d] + a0; a1 = x_ * X##1[d] + a1; a2 = x_ * X##2[d] + a2; a3 = x_ * X##3[d] + a3; \
        a4 = x_ * X##4[d] + a4; a5 = x_ * X##5[d] + a5; a6 = x_ * X##6[d] + a6; a7 = x_ * X##7[d] + a7; } \
    z[0] = a0; z[1] = a1; z[2] = a2; z[3] = a3; z[4] = a4; z[5] = a5; z[6] = a6; z[7] = a7; }
// acc[d] += sum over the 8 rows X0..X7 of c[i] (a float8) times row i's value at d
#define ACC8(acc, c, X, n) \
    for (int d = 0; d < (n); d++) \
        acc[d] = c[0] * X##0[d] + c[1] * X##1[d] + c[2] * X##2[d] + c[3] * X##3[d] + c[4] * X##4[d] + \
                 c[5] * X##5[d] + c[6] * X##6[d] + c[7] * X##7[d] + acc[d];

// e^(x) of every lane of x[0..8) (each <= 0 or -inf)
inline void exp8x8(float8* x) {
    union { float8 v[8]; float s[64]; } u;
    for (int i = 0; i < 8; i++) u.v[i] = x[i];
    for (int i = 0; i < 64; i++) u.s[i] = dl_exp_neg(u.s[i]);
    for (int i = 0; i < 8; i++) x[i] = u.v[i];
}

// the mask of rows in lanes at one key: lane r reads mrow[r * sr] (r < n, else the last row's)
inline float8 mask_lanes(__global const MASK_T* mrow, long sr, int n) {
    union { float8 v; float s[8]; } u;
    for (int r = 0; r < 8; r++) u.s[r] = (float)mrow[IMIN(r, n - 1) * sr];
    return u.v;
}
#if MASK == 1
#define MASK_LANES(z, mrow, sr, n) ((z) + mask_lanes(mrow, sr, n))
#elif MASK == 2
#define MASK_LANES(z, mrow, sr, n) (mask_lanes(mrow, sr, n) != (float8)(0.0f) ? (z) : (float8)(-INFINITY))
#else
#define MASK_LANES(z, mrow, sr, n) (z)
#endif

__kernel void attention_grad_q_lanes(GRAD_Q_ARGS) {
    GRAD_Q_START(8)
    float8 qt[D], dyt[DV], dqt[D], rowsum = (float8)(0.0f);
    for (int d = 0; d < D; d++) {
        qt[d] = lanes8(q, qst, nq, d) * scale;
        dqt[d] = (float8)(0.0f);
    }
    for (int d = 0; d < DV; d++) {
        dyt[d] = lanes8(dy, dyst, nq, d);
        rowsum = dyt[d] * lanes8(y, yst, nq, d) + rowsum;
    }
    const int8 lane = (int8)(0, 1, 2, 3, 4, 5, 6, 7);
#if CAUSAL
    const int kv_end = IMIN(Tk, i0 + nq + causal_offset);
#else
    const int kv_end = Tk;
#endif
    // the scores of keys j0 .. j0 + 7 (rows in lanes) with the mask, causal and keys past kv_end at -inf
#define SCORES(z, j0) { \
        DOTS8(z, qt, kr, D) \
        for (int jj = 0; jj < 8; jj++) { \
            const int j = (j0) + jj; \
            z[jj] = j < kv_end ? MASK_LANES(z[jj], mask + IMIN(j, Tk - 1) * msk, msq, nq) : (float8)(-INFINITY); \
            if (CAUSAL) z[jj] = (int8)(j) > lane + (int8)(i0 + causal_offset) ? (float8)(-INFINITY) : z[jj]; } }
    float8 m = (float8)(-INFINITY), l = (float8)(0.0f);
    for (int j0 = 0; j0 < kv_end; j0 += 8) {  // each row's log-sum-exp, online
        ROWS8(kr, k, kst, j0, Tk - 1)
        float8 z[8];
        SCORES(z, j0)
        float8 top = m;
        for (int jj = 0; jj < 8; jj++) top = z[jj] > top ? z[jj] : top;  // (NaN scores ignored, as fmax)
        const float8 mu = top == (float8)(-INFINITY) ? (float8)(0.0f) : top;  // nothing visible yet: e^-inf = 0
        for (int jj = 0; jj < 8; jj++) z[jj] -= mu;
        exp8x8(z);
        union { float8 v; float s[8]; } al;
        al.v = m - mu;
        for (int r = 0; r < 8; r++) al.s[r] = dl_exp_neg(al.s[r]);
        float8 sum = (float8)(0.0f);
        for (int jj = 0; jj < 8; jj++) sum += z[jj];
        l = l * al.v + sum;
        m = top;
    }
    union { float8 v; float s[8]; } lse, ml, ll, rs;
    ml.v = m;
    ll.v = l;
    rs.v = rowsum;
    for (int r = 0; r < 8; r++) lse.s[r] = ll.s[r] > 0.0f ? ml.s[r] + log(ll.s[r]) : INFINITY;
    for (int r = 0; r < nq; r++) {
        stats[2 * r] = lse.s[r];
        stats[2 * r + 1] = rs.s[r];
    }
    for (int j0 = 0; j0 < kv_end; j0 += 8) {  // dq = scale sum_j p (dy . v_j - D) k_j
        ROWS8(kr, k, kst, j0, Tk - 1)
        ROWS8(vr, v, vst, j0, Tk - 1)
        float8 z[8], t[8];
        SCORES(z, j0)
        DOTS8(t, dyt, vr, DV)
        for (int jj = 0; jj < 8; jj++) z[jj] -= lse.v;  // (a row that sees no key: lse +inf, p = 0)
        exp8x8(z);
        for (int jj = 0; jj < 8; jj++) z[jj] = z[jj] * (t[jj] - rowsum) * scale;
        ACC8(dqt, z, kr, D)
    }
#undef SCORES
    for (int r = 0; r < nq; r++) put_lane(dq + r * dqst, dqt, D, r);
}

__kernel void attention_grad_kv_lanes(GRAD_KV_ARGS) {
    GRAD_KV_START(8)
    float8 kt[D], vt[DV], dkt[D], dvt[DV];
    for (int d = 0; d < D; d++) {
        kt[d] = lanes8(k, kst, nk, d) * scale;
        dkt[d] = (float8)(0.0f);
    }
    for (int d = 0; d < DV; d++) {
        vt[d] = lanes8(v, vst, nk, d);
        dvt[d] = (float8)(0.0f);
    }
    const int8 key = (int8)(0, 1, 2, 3, 4, 5, 6, 7) + (int8)(j0);
    for (int g = 0; g < group; g++) {
        GRAD_KV_HEAD(g)
        for (int i0 = i_first; i0 < Tq; i0 += 8) {
            ROWS8(qr, qh, qst, i0, Tq - 1)
            ROWS8(dyr, dyh, dyst, i0, Tq - 1)
            float8 z[8], t[8], ds[8];
            DOTS8(z, kt, qr, D)
            DOTS8(t, vt, dyr, DV)
            for (int ii = 0; ii < 8; ii++) {
                const int i = IMIN(i0 + ii, Tq - 1);
                const float lse = st[2 * i];  // (+inf for a row that sees no key: p = 0)
                z[ii] = i0 + ii < Tq ? MASK_LANES(z[ii], mh + i * msq, msk, nk) : (float8)(-INFINITY);
                if (CAUSAL) z[ii] = key > (int8)(i + causal_offset) ? (float8)(-INFINITY) : z[ii];
                z[ii] -= lse;
            }
            exp8x8(z);  // p
            for (int ii = 0; ii < 8; ii++)
                ds[ii] = z[ii] * (t[ii] - st[2 * IMIN(i0 + ii, Tq - 1) + 1]) * scale;
            ACC8(dvt, z, dyr, DV)
            ACC8(dkt, ds, qr, D)
        }
    }
    for (int r = 0; r < nk; r++) {
        put_lane(dk + r * dkst, dkt, D, r);
        put_lane(dv + r * dvst, dvt, DV, r);
    }
}
