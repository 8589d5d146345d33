// Attention's gradient in two kernels, without the T x T scores (AttentionGrad, graph/ops/attention.py): each score
// z = scale q_i . k_j (+ mask, causal as attention.cl's) is recomputed where it is needed, from the row's log-sum-exp:
// p = e^(z - lse_i), dp = dy_i . v_j, ds = p (dp - D_i) with D_i = dy_i . y_i; then dq_i = scale sum_j ds k_j,
// dk_j = scale sum_i ds q_i, dv_j = sum_i p dy_i (FlashAttention-2's backward, without its tiles).
//   attention_grad_q: a work-item per query row: its lse and D (into stats [B, Hq, Tq, 2]; lse +inf for a row that
// sees no key, whose p are then 0), then dq. attention_grad_kv: a work-item per key row of a k / v head: dk and dv over
// the query rows of every q head that reads it (grouped-query heads: no atomics). Vectors of 8 along the head dim as
// attention_cpu.cl's (needs cpu_math.cl and attention_rows.cl before it); float32 operands, each in any layout (its
// element strides of b, h and t: STRIDES3).
#define STRIDES3(x) long x##sb, long x##sh, long x##st

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

// the score of query row qv (D8 chunks) and key row kr, or -inf where it is hidden
#if MASK == 1
#define MASKED(z, mrow, j) ((z) + (mrow)[(j) * msk])
#elif MASK == 2
#define MASKED(z, mrow, j) ((mrow)[(j) * msk] ? (z) : -INFINITY)
#else
#define MASKED(z, mrow, j) (z)
#endif

__kernel void attention_grad_q(__global const float* q, ulong q_off, __global const float* k, ulong k_off,
                               __global const float* v, ulong v_off, __global const float* y, ulong y_off,
                               __global const float* dy, ulong dy_off, __global const MASK_T* mask, ulong mask_off,
                               __global float* dq, ulong dq_off, __global float* stats, ulong stats_off, int Tq,
                               int Tk, int Hq, int Hk, float scale, int causal_offset, long msb, long msh, long msq,
                               long msk, STRIDES3(q), STRIDES3(k), STRIDES3(v), STRIDES3(y), STRIDES3(dy),
                               STRIDES3(dq)) {
    const int i = get_global_id(0);
    const long bh = get_global_id(1);
    if (i >= Tq) return;
    const long b = bh / Hq;
    const int h = bh % Hq;
    const long kvh = h / (Hq / Hk);
    q += q_off + b * qsb + h * qsh + i * qst;
    dq += dq_off + b * dqsb + h * dqsh + i * dqst;
    y += y_off + b * ysb + h * ysh + i * yst;
    dy += dy_off + b * dysb + h * dysh + i * dyst;
    k += k_off + b * ksb + kvh * ksh;
    v += v_off + b * vsb + kvh * vsh;
    mask += mask_off + b * msb + h * msh + i * msq;
    stats += stats_off + 2 * (bh * Tq + i);
    float8 qv[D8], dyv[DV8], acc[D8];
    float8 e = (float8)(0.0f);
    for (int c = 0; c < D8; c++) {
        qv[c] = chunk8(q, c, D) * scale;
        acc[c] = (float8)(0.0f);
    }
    for (int c = 0; c < DV8; c++) {
        dyv[c] = chunk8(dy, c, DV);
        e = dyv[c] * chunk8(y, c, DV) + e;
    }
    const float rowsum = hsum8(e);
#if CAUSAL
    int kv_end = IMIN(Tk, i + 1 + causal_offset);
#else
    int kv_end = Tk;
#endif
    float m = -INFINITY, l = 0.0f;
    for (int j = 0; j < kv_end; j++) {
        float8 a = qv[0] * chunk8(k + j * kst, 0, D);
        for (int c = 1; c < D8; c++) a = qv[c] * chunk8(k + j * kst, c, D) + a;
        const float z = MASKED(hsum8(a), mask, j);
        if (z == -INFINITY) continue;
        if (z > m) {
            l = l * dl_exp_neg(m - z) + 1.0f;
            m = z;
        } else {
            l += dl_exp_neg(z - m);
        }
    }
    const float lse = l > 0.0f ? m + log(l) : INFINITY;
    stats[0] = lse;
    stats[1] = rowsum;
    if (lse == INFINITY) kv_end = 0;
    for (int j = 0; j < kv_end; j++) {
        float8 a = qv[0] * chunk8(k + j * kst, 0, D);
        for (int c = 1; c < D8; c++) a = qv[c] * chunk8(k + j * kst, c, D) + a;
        const float z = MASKED(hsum8(a), mask, j);
        if (z == -INFINITY) continue;
        const float p = dl_exp_neg(z - lse);
        float8 t = dyv[0] * chunk8(v + j * vst, 0, DV);
        for (int c = 1; c < DV8; c++) t = dyv[c] * chunk8(v + j * vst, c, DV) + t;
        const float8 ds = (float8)(p * (hsum8(t) - rowsum) * scale);
        for (int c = 0; c < D8; c++) acc[c] = ds * chunk8(k + j * kst, c, D) + acc[c];
    }
    for (int c = 0; c < D8; c++) put8(dq, c, D, acc[c]);
}

__kernel void attention_grad_kv(__global const float* q, ulong q_off, __global const float* k, ulong k_off,
                                __global const float* v, ulong v_off, __global const float* dy, ulong dy_off,
                                __global const MASK_T* mask, ulong mask_off, __global const float* stats,
                                ulong stats_off, __global float* dk, ulong dk_off, __global float* dv, ulong dv_off,
                                int Tq, int Tk, int Hq, int Hk, float scale, int causal_offset, long msb, long msh,
                                long msq, long msk, STRIDES3(q), STRIDES3(k), STRIDES3(v), STRIDES3(dy),
                                STRIDES3(dk), STRIDES3(dv)) {
    const int j = get_global_id(0);
    const long bh = get_global_id(1);
    if (j >= Tk) return;
    const long b = bh / Hk;
    const int hk = bh % Hk, group = Hq / Hk;
    float8 kv[D8], vv[DV8], dkv[D8], dvv[DV8];
    for (int c = 0; c < D8; c++) {
        kv[c] = chunk8(k + k_off + b * ksb + hk * ksh + j * kst, c, D) * scale;
        dkv[c] = (float8)(0.0f);
    }
    for (int c = 0; c < DV8; c++) {
        vv[c] = chunk8(v + v_off + b * vsb + hk * vsh + j * vst, c, DV);
        dvv[c] = (float8)(0.0f);
    }
#if CAUSAL
    const int i0 = j - causal_offset > 0 ? j - causal_offset : 0;
#else
    const int i0 = 0;
#endif
    for (int g = 0; g < group; g++) {
        const int h = hk * group + g;
        __global const float* qh = q + q_off + b * qsb + h * qsh;
        __global const float* dyh = dy + dy_off + b * dysb + h * dysh;
        __global const float* st = stats + stats_off + 2 * (b * Hq + h) * (long)Tq;
        __global const MASK_T* mh = mask + mask_off + b * msb + h * msh + j * msk;
        for (int i = i0; i < Tq; i++) {
            float8 a = kv[0] * chunk8(qh + i * qst, 0, D);
            for (int c = 1; c < D8; c++) a = kv[c] * chunk8(qh + i * qst, c, D) + a;
#if MASK == 1
            const float z = hsum8(a) + mh[i * msq];
#elif MASK == 2
            const float z = mh[i * msq] ? hsum8(a) : -INFINITY;
#else
            const float z = hsum8(a);
#endif
            if (z == -INFINITY || st[2 * i] == INFINITY) continue;
            const float p = dl_exp_neg(z - st[2 * i]);
            float8 t = vv[0] * chunk8(dyh + i * dyst, 0, DV);
            for (int c = 1; c < DV8; c++) t = vv[c] * chunk8(dyh + i * dyst, c, DV) + t;
            const float8 ds = (float8)(p * (hsum8(t) - st[2 * i + 1]) * scale);
            for (int c = 0; c < DV8; c++) dvv[c] = (float8)(p) * chunk8(dyh + i * dyst, c, DV) + dvv[c];
            for (int c = 0; c < D8; c++) dkv[c] = ds * chunk8(qh + i * qst, c, D) + dkv[c];
        }
    }
    for (int c = 0; c < D8; c++) put8(dk + dk_off + b * dksb + hk * dksh + j * dkst, c, D, dkv[c]);
    for (int c = 0; c < DV8; c++) put8(dv + dv_off + b * dvsb + hk * dvsh + j * dvst, c, DV, dvv[c]);
}
