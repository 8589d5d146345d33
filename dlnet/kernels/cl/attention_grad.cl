// Attention's gradient in two kernels, without the T x T scores (AttentionGrad, graph/ops/attention.py): each score
// z = scale q_i . k_j (+ mask, causal as attention.cl's) is recomputed where it is needed, from the row's log-sum-exp:
// p = e^(z - lse_i), dp = dy_i . v_j, ds = p (dp - D_i) with D_i = dy_i . y_i; then dq_i = scale sum_j ds k_j,
// dk_j = scale sum_i ds q_i, dv_j = sum_i p dy_i (FlashAttention-2's backward, without its tiles).
//   attention_grad_q: a work-item per RB query rows: their lse and D (into stats [B, Hq, Tq, 2]; lse +inf for a row
// that sees no key, whose p are then 0), then dq. attention_grad_kv: a work-item per RB key rows of a k / v head: dk
// and dv over the query rows of every q head that reads them (grouped-query heads: no atomics). RB rows at once give
// RB independent chains of multiply-adds for each loaded chunk (one row's dot product is a chain of D8 dependent ones;
// kernels/families/attention.py GRAD_ROWS). Vectors of 8 along the head dim as
// attention_cpu.cl's (needs cpu_math.cl and attention_rows.cl before it); float32 operands, each in any layout (its
// element strides of b, h and t: STRIDES3).
#define STRIDES3(x) long x##sb, long x##sh, long x##st
#ifndef RB
#define RB 4
#endif

// chunk c of a row of n floats stored
inline void put8(__global float* row, int c, int n, float8 x) {
    if ((c + 1) * 8 <= n) {
        *(__global float8u*)(row + 8 * c) = x;
        return;
    }
    union { float8 v; float s[8]; } t;
    t.v = x;
    for (int i = 0; c * 8 + i < n; i++) row[c * 8 + i] = t.s[i];
}

// the visibility of key j to query row i (causal; the mask is read where the score is made)
#if CAUSAL
#define SEEN(i, j) ((j) <= (i) + causal_offset)
#else
#define SEEN(i, j) 1
#endif
#if MASK == 1
#define MASKED(z, mrow, j) ((z) + (mrow)[(j) * msk])
#elif MASK == 2
#define MASKED(z, mrow, j) ((mrow)[(j) * msk] ? (z) : -INFINITY)
#else
#define MASKED(z, mrow, j) (z)
#endif

// the kernels' arguments (attention_grad_lanes.cl's too), and where a work-item's ROWS query (key) rows of one batch *
// head start: i0 and nq (j0 and nk), the operands moved to them
#define GRAD_Q_ARGS \
    __global const float* q, ulong q_off, __global const float* k, ulong k_off, __global const float* v, \
    ulong v_off, __global const float* y, ulong y_off, __global const float* dy, ulong dy_off, \
    __global const MASK_T* mask, ulong mask_off, __global float* dq, ulong dq_off, __global float* stats, \
    ulong stats_off, int Tq, int Tk, int Hq, int Hk, float scale, int causal_offset, long msb, long msh, long msq, \
    long msk, STRIDES3(q), STRIDES3(k), STRIDES3(v), STRIDES3(y), STRIDES3(dy), STRIDES3(dq)
#define GRAD_Q_START(ROWS) \
    const int i0 = get_global_id(0) * (ROWS); \
    const long bh = get_global_id(1); \
    if (i0 >= Tq) return; \
    const int nq = IMIN((ROWS), Tq - i0); \
    const long b = bh / Hq; \
    const int h = bh % Hq; \
    const long kvh = h / (Hq / Hk); \
    q += q_off + b * qsb + h * qsh + i0 * qst; \
    dq += dq_off + b * dqsb + h * dqsh + i0 * dqst; \
    y += y_off + b * ysb + h * ysh + i0 * yst; \
    dy += dy_off + b * dysb + h * dysh + i0 * dyst; \
    k += k_off + b * ksb + kvh * ksh; \
    v += v_off + b * vsb + kvh * vsh; \
    mask += mask_off + b * msb + h * msh + i0 * msq; \
    stats += stats_off + 2 * (bh * Tq + i0);
#define GRAD_KV_ARGS \
    __global const float* q, ulong q_off, __global const float* k, ulong k_off, __global const float* v, \
    ulong v_off, __global const float* dy, ulong dy_off, __global const MASK_T* mask, ulong mask_off, \
    __global const float* stats, ulong stats_off, __global float* dk, ulong dk_off, __global float* dv, \
    ulong dv_off, int Tq, int Tk, int Hq, int Hk, float scale, int causal_offset, long msb, long msh, long msq, \
    long msk, STRIDES3(q), STRIDES3(k), STRIDES3(v), STRIDES3(dy), STRIDES3(dk), STRIDES3(dv)
#define GRAD_KV_START(ROWS) \
    const int j0 = get_global_id(0) * (ROWS); \
    const long bh = get_global_id(1); \
    if (j0 >= Tk) return; \
    const int nk = IMIN((ROWS), Tk - j0); \
    const long b = bh / Hk; \
    const int hk = bh % Hk, group = Hq / Hk; \
    k += k_off + b * ksb + hk * ksh + j0 * kst; \
    v += v_off + b * vsb + hk * vsh + j0 * vst; \
    dk += dk_off + b * dksb + hk * dksh + j0 * dkst; \
    dv += dv_off + b * dvsb + hk * dvsh + j0 * dvst; \
    const int i_first = CAUSAL && j0 - causal_offset > 0 ? j0 - causal_offset : 0;  /* (the first row to see j0) */
// q head g of the group's: its q and dy rows (qh, dyh), statistics (st) and mask rows at key j0 (mh)
#define GRAD_KV_HEAD(g) \
    const int h = hk * group + (g); \
    __global const float* qh = q + q_off + b * qsb + h * qsh; \
    __global const float* dyh = dy + dy_off + b * dysb + h * dysh; \
    __global const float* st = stats + stats_off + 2 * (b * Hq + h) * (long)Tq; \
    __global const MASK_T* mh = mask + mask_off + b * msb + h * msh + j0 * msk;

__kernel void attention_grad_q(GRAD_Q_ARGS) {
    GRAD_Q_START(RB)
    float8 qv[RB][D8], dyv[RB][DV8], acc[RB][D8];
    float m[RB], l[RB], rowsum[RB], lse[RB];
    for (int r = 0; r < RB; r++) {
        float8 e = (float8)(0.0f);
        for (int c = 0; c < D8; c++) {
            qv[r][c] = r < nq ? chunk8(q + r * qst, c, D) * scale : (float8)(0.0f);
            acc[r][c] = (float8)(0.0f);
        }
        for (int c = 0; c < DV8; c++) {
            dyv[r][c] = r < nq ? chunk8(dy + r * dyst, c, DV) : (float8)(0.0f);
            e = r < nq ? dyv[r][c] * chunk8(y + r * yst, c, DV) + e : e;
        }
        rowsum[r] = hsum8(e);
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
#if CAUSAL
    const int kv_end = IMIN(Tk, i0 + nq + causal_offset);
#else
    const int kv_end = Tk;
#endif
    for (int j = 0; j < kv_end; j++) {
        float8 kc[D8], a[RB];
        for (int c = 0; c < D8; c++) kc[c] = chunk8(k + j * kst, c, D);
        for (int r = 0; r < RB; r++) a[r] = qv[r][0] * kc[0];
        for (int c = 1; c < D8; c++)
            for (int r = 0; r < RB; r++) a[r] = qv[r][c] * kc[c] + a[r];
        for (int r = 0; r < nq; r++) {
            const float z = SEEN(i0 + r, j) ? MASKED(hsum8(a[r]), mask + r * msq, j) : -INFINITY;
            if (z == -INFINITY) continue;
            if (z > m[r]) {
                l[r] = l[r] * dl_exp_neg(m[r] - z) + 1.0f;
                m[r] = z;
            } else {
                l[r] += dl_exp_neg(z - m[r]);
            }
        }
    }
    for (int r = 0; r < nq; r++) {
        lse[r] = l[r] > 0.0f ? m[r] + log(l[r]) : INFINITY;
        stats[2 * r] = lse[r];
        stats[2 * r + 1] = rowsum[r];
    }
    for (int j = 0; j < kv_end; j++) {
        float8 kc[D8], vc[DV8], a[RB], t[RB];
        for (int c = 0; c < D8; c++) kc[c] = chunk8(k + j * kst, c, D);
        for (int c = 0; c < DV8; c++) vc[c] = chunk8(v + j * vst, c, DV);
        for (int r = 0; r < RB; r++) {
            a[r] = qv[r][0] * kc[0];
            t[r] = dyv[r][0] * vc[0];
        }
        for (int c = 1; c < D8; c++)
            for (int r = 0; r < RB; r++) a[r] = qv[r][c] * kc[c] + a[r];
        for (int c = 1; c < DV8; c++)
            for (int r = 0; r < RB; r++) t[r] = dyv[r][c] * vc[c] + t[r];
        for (int r = 0; r < nq; r++) {
            const float z = SEEN(i0 + r, j) ? MASKED(hsum8(a[r]), mask + r * msq, j) : -INFINITY;
            if (z == -INFINITY || lse[r] == INFINITY) continue;
            const float p = dl_exp_neg(z - lse[r]);
            const float8 ds = (float8)(p * (hsum8(t[r]) - rowsum[r]) * scale);
            for (int c = 0; c < D8; c++) acc[r][c] = ds * kc[c] + acc[r][c];
        }
    }
    for (int r = 0; r < nq; r++)
        for (int c = 0; c < D8; c++) put8(dq + r * dqst, c, D, acc[r][c]);
}

__kernel void attention_grad_kv(GRAD_KV_ARGS) {
    GRAD_KV_START(RB)
    float8 kv[RB][D8], vv[RB][DV8], dkv[RB][D8], dvv[RB][DV8];
    for (int r = 0; r < RB; r++) {
        for (int c = 0; c < D8; c++) {
            kv[r][c] = r < nk ? chunk8(k + r * kst, c, D) * scale : (float8)(0.0f);
            dkv[r][c] = (float8)(0.0f);
        }
        for (int c = 0; c < DV8; c++) {
            vv[r][c] = r < nk ? chunk8(v + r * vst, c, DV) : (float8)(0.0f);
            dvv[r][c] = (float8)(0.0f);
        }
    }
    for (int g = 0; g < group; g++) {
        GRAD_KV_HEAD(g)
        for (int i = i_first; i < Tq; i++) {
            const float lse = st[2 * i], rowsum = st[2 * i + 1];
            if (lse == INFINITY) continue;
            float8 qc[D8], dyc[DV8], a[RB], t[RB];
            for (int c = 0; c < D8; c++) qc[c] = chunk8(qh + i * qst, c, D);
            for (int c = 0; c < DV8; c++) dyc[c] = chunk8(dyh + i * dyst, c, DV);
            for (int r = 0; r < RB; r++) {
                a[r] = kv[r][0] * qc[0];
                t[r] = vv[r][0] * dyc[0];
            }
            for (int c = 1; c < D8; c++)
                for (int r = 0; r < RB; r++) a[r] = kv[r][c] * qc[c] + a[r];
            for (int c = 1; c < DV8; c++)
                for (int r = 0; r < RB; r++) t[r] = vv[r][c] * dyc[c] + t[r];
            for (int r = 0; r < nk; r++) {
                const float z = SEEN(i, j0 + r) ? MASKED(hsum8(a[r]), mh + i * msq, r) : -INFINITY;
                if (z == -INFINITY) continue;
                const float p = dl_exp_neg(z - lse);
                const float8 ds = (float8)(p * (hsum8(t[r]) - rowsum) * scale);
                for (int c = 0; c < DV8; c++) dvv[r][c] = (float8)(p) * dyc[c] + dvv[r][c];
                for (int c = 0; c < D8; c++) dkv[r][c] = ds * qc[c] + dkv[r][c];
            }
        }
    }
    for (int r = 0; r < nk; r++) {
        for (int c = 0; c < D8; c++) put8(dk + r * dkst, c, D, dkv[r][c]);
        for (int c = 0; c < DV8; c++) put8(dv + r * dvst, c, DV, dvv[r][c]);
    }
}
