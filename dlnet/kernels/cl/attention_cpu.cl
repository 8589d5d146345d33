// Attention on CPUs (PoCL): y = softmax(cap(q k^T * scale) + mask [+ causal]) v, the online softmax of attention.cl
// without its work-groups and barriers (PoCL runs a work-group's work-items as loops between barriers, with each
// private array spilled per work-item: 5x slower than the unfused products at T = 512). One work-item (local size 1)
// per RQ query rows of one batch * head: their q rows and output accumulators in float8 registers along the head
// dim, keys streamed from global memory (the cache holds a head's K and V) BK at a time; each key's score a float8
// dot product and one horizontal sum per row. No built-ins inside the loops (PoCL calls fma, fmax, exp and vload8
// out of line: 12 heads of 128 x 64, 7.6 -> 1.5 ms): multiply-adds that the compiler contracts, ternaries, cpu_math.cl's
// dl_exp_neg, unaligned float8 loads through a pointer.
//   Layouts (element strides of b, h and t), mask, CAUSAL and SOFTCAP as in attention.cl. Needs cpu_math.cl and
// attention_rows.cl before it.
#if !defined(D) || !defined(DV) || !defined(RQ) || !defined(BK)
#error "attention_cpu.cl needs D, DV, RQ and BK"
#endif
#if defined(Q_HALF)
#define Q_T half
#define CHUNK_Q chunk8h
#else
#define Q_T float
#define CHUNK_Q chunk8
#endif
#if defined(K_HALF)
#define K_T half
#define CHUNK_K chunk8h
#else
#define K_T float
#define CHUNK_K chunk8
#endif
#if defined(V_HALF)
#define V_T half
#define CHUNK_V chunk8h
#else
#define V_T float
#define CHUNK_V chunk8
#endif
#if defined(Y_HALF)
#define Y_T half
#define STY8(p, x) vstore_half8(x, 0, p)
#define STY(p, i, x) vstore_half(x, i, p)
#else
#define Y_T float
#define STY8(p, x) *(__global float8u*)(p) = (x)
#define STY(p, i, x) (p)[i] = (x)
#endif

// chunk c of an output row of DV values (the kernels' last step)
inline void store_chunk(__global Y_T* row, int c, float8 o) {
    if ((c + 1) * 8 <= DV) {
        STY8(row + 8 * c, o);
    } else {
        union { float8 v; float s[8]; } t;
        t.v = o;
        for (int i = 0; c * 8 + i < DV; i++) STY(row, c * 8 + i, t.s[i]);
    }
}

__kernel void attention_cpu(__global const Q_T* q, ulong q_off, __global const K_T* k, ulong k_off,
                            __global const V_T* v, ulong v_off, __global const MASK_T* mask, ulong mask_off,
                            __global Y_T* y, ulong y_off, int Tq, int Tk, int Hq, int Hk, float scale,
                            float softcap, int causal_offset, long msb, long msh, long msq, long msk, long qsb, long qsh, long qst, long ksb, long ksh,
               long kst, long vsb, long vsh, long vst, long ysb, long ysh, long yst) {
    const int q0 = get_global_id(0) * RQ;
    const long bh = get_global_id(1);
    if (q0 >= Tq) return;
    const int nq = IMIN(RQ, Tq - q0);
    const long b = bh / Hq;
    const int h = bh % Hq;
    const long kvh = h / (Hq / Hk);
    q += q_off + b * qsb + h * qsh + q0 * qst;
    k += k_off + b * ksb + kvh * ksh;
    v += v_off + b * vsb + kvh * vsh;
    y += y_off + b * ysb + h * ysh + q0 * yst;
#if MASK
    mask += mask_off + b * msb + h * msh + q0 * msq;
#endif
    float8 qv[RQ][D8], acc[RQ][DV8];
    float m[RQ], l[RQ];
    for (int r = 0; r < RQ; r++) {
        for (int c = 0; c < D8; c++) qv[r][c] = r < nq ? CHUNK_Q(q + r * qst, c, D) : (float8)(0.0f);
        for (int c = 0; c < DV8; c++) acc[r][c] = (float8)(0.0f);
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
#if CAUSAL
    const int kv_end = IMIN(Tk, q0 + nq + causal_offset);
#else
    const int kv_end = Tk;
#endif
    for (int j0 = 0; j0 < kv_end; j0 += BK) {
        const int nk = IMIN(BK, kv_end - j0);
        float s[RQ][BK];
        for (int r = 0; r < RQ; r++)  // (keys past the block's end: e^-inf = 0 in the whole-block exp below)
            for (int jj = nk; jj < BK; jj++) s[r][jj] = -INFINITY;
        for (int jj = 0; jj < nk; jj++) {
            const int j = j0 + jj;
            float8 kv[D8];
            for (int c = 0; c < D8; c++) kv[c] = CHUNK_K(k + j * kst, c, D);
            for (int r = 0; r < RQ; r++) {
                float8 a = qv[r][0] * kv[0];
                for (int c = 1; c < D8; c++) a = qv[r][c] * kv[c] + a;
                float z = hsum8(a) * scale;
#if SOFTCAP
                z = softcap * dl_tanh(z / softcap);
#endif
#if MASK == 1
                if (r < nq) z += mask[r * msq + j * msk];
#elif MASK == 2
                if (r < nq && !mask[r * msq + j * msk]) z = -INFINITY;
#endif
#if CAUSAL
                if (j > q0 + r + causal_offset) z = -INFINITY;
#endif
                s[r][jj] = r < nq ? z : -INFINITY;
            }
        }
        for (int r = 0; r < RQ; r++) {
            float top = m[r];
            for (int jj = 0; jj < nk; jj++) top = s[r][jj] > top ? s[r][jj] : top;  // (fmax's: NaN ignored)
            const float mu = top == -INFINITY ? 0.0f : top;  // nothing visible yet: exp(-inf - 0) = 0
            const float alpha = dl_exp_neg(m[r] - mu);
            m[r] = top;
            // the exps over the whole block, apart from the sum: a fixed trip count and no float reduction, so the
            // compiler vectorises dl_exp_neg across keys (12 heads of 128 x 64: 2.37 -> 1.4-1.8 ms, A/B interleaved)
            for (int jj = 0; jj < BK; jj++) s[r][jj] = dl_exp_neg(s[r][jj] - mu);
            float sum = 0.0f;
            for (int jj = 0; jj < nk; jj++) sum += s[r][jj];
            l[r] = l[r] * alpha + sum;
            for (int c = 0; c < DV8; c++) acc[r][c] *= alpha;
        }
        for (int jj = 0; jj < nk; jj++) {
            float8 vv[DV8];
            for (int c = 0; c < DV8; c++) vv[c] = CHUNK_V(v + (j0 + jj) * vst, c, DV);
            for (int r = 0; r < RQ; r++)
                for (int c = 0; c < DV8; c++) acc[r][c] = (float8)(s[r][jj]) * vv[c] + acc[r][c];
        }
    }
    for (int r = 0; r < nq; r++) {
        const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
        for (int c = 0; c < DV8; c++) store_chunk(y + r * yst, c, acc[r][c] * inv);
    }
}

// --- Query rows in vector lanes (attention_cpu_rows): a work-item per 8 query rows of one batch * head, row r in
// lane r of every float8. The scores of 8 keys come from 8 accumulators over the head dim, each a multiply-add of
// the 8 rows' q[d] (a float8 of q transposed once, the scale folded in) by one key's k[d]: no horizontal sums. The
// online softmax runs across lanes (a max, exps and a sum per row at once), and p v as a register tile of 4 rows x 16
// output columns over the block's keys (8 float8 accumulators; p broadcast, v in float8 chunks). Tq >= 8: the
// one-row-per-lane work of decoding stays on attention_cpu. Needs BK a multiple of 8.
#if defined(Q_HALF)
#define LD_Q(p, i) vload_half(i, p)
#else
#define LD_Q(p, i) ((p)[i])
#endif
#if defined(K_HALF)
#define LD_K(p, i) vload_half(i, p)
#else
#define LD_K(p, i) ((p)[i])
#endif
#define DVP (DV8 + (DV8 & 1))  /* (chunks of acc: a whole number of 16-column tiles) */

__kernel void attention_cpu_rows(__global const Q_T* q, ulong q_off, __global const K_T* k, ulong k_off,
                                 __global const V_T* v, ulong v_off, __global const MASK_T* mask, ulong mask_off,
                                 __global Y_T* y, ulong y_off, int Tq, int Tk, int Hq, int Hk, float scale,
                                 float softcap, int causal_offset, long msb, long msh, long msq, long msk, long qsb,
                                 long qsh, long qst, long ksb, long ksh, long kst, long vsb, long vsh, long vst,
                                 long ysb, long ysh, long yst) {
    const int q0 = get_global_id(0) * 8;
    const long bh = get_global_id(1);
    if (q0 >= Tq) return;
    const int nq = IMIN(8, Tq - q0);
    const long b = bh / Hq;
    const int h = bh % Hq;
    const long kvh = h / (Hq / Hk);
    q += q_off + b * qsb + h * qsh + q0 * qst;
    k += k_off + b * ksb + kvh * ksh;
    v += v_off + b * vsb + kvh * vsh;
    y += y_off + b * ysb + h * ysh + q0 * yst;
#if MASK
    mask += mask_off + b * msb + h * msh + q0 * msq;
#endif
    float8 qt[D], acc[8][DVP];
    // q transposed, a float8 of the 8 rows' q[d] built in registers (through memory, 8 scalar stores and a vector
    // load per d stalled on store forwarding: 7% of ViT's attention); rows past nq repeat the last row, whose lanes
    // are never stored
    const __global Q_T* q1 = q + IMIN(1, nq - 1) * qst;
    const __global Q_T* q2 = q + IMIN(2, nq - 1) * qst;
    const __global Q_T* q3 = q + IMIN(3, nq - 1) * qst;
    const __global Q_T* q4 = q + IMIN(4, nq - 1) * qst;
    const __global Q_T* q5 = q + IMIN(5, nq - 1) * qst;
    const __global Q_T* q6 = q + IMIN(6, nq - 1) * qst;
    const __global Q_T* q7 = q + IMIN(7, nq - 1) * qst;
    for (int d = 0; d < D; d++)
        qt[d] = (float8)(LD_Q(q, d), LD_Q(q1, d), LD_Q(q2, d), LD_Q(q3, d), LD_Q(q4, d), LD_Q(q5, d), LD_Q(q6, d),
                         LD_Q(q7, d)) * scale;
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < DVP; c++) acc[r][c] = (float8)(0.0f);
    float8 m = (float8)(-INFINITY), l = (float8)(0.0f);
    const int8 lane = (int8)(0, 1, 2, 3, 4, 5, 6, 7);
#if CAUSAL
    const int kv_end = IMIN(Tk, q0 + nq + causal_offset);
#else
    const int kv_end = Tk;
#endif
    for (int j0 = 0; j0 < kv_end; j0 += BK) {
        const int nk = IMIN(BK, kv_end - j0);
        float8 st[BK];
        for (int g = 0; g < BK; g += 8) {  // 8 keys' scores (keys past Tk read the last key, then masked out)
            const __global K_T* k0 = k + (long)IMIN(j0 + g, Tk - 1) * kst;
            const __global K_T* k1 = k + (long)IMIN(j0 + g + 1, Tk - 1) * kst;
            const __global K_T* k2 = k + (long)IMIN(j0 + g + 2, Tk - 1) * kst;
            const __global K_T* k3 = k + (long)IMIN(j0 + g + 3, Tk - 1) * kst;
            const __global K_T* k4 = k + (long)IMIN(j0 + g + 4, Tk - 1) * kst;
            const __global K_T* k5 = k + (long)IMIN(j0 + g + 5, Tk - 1) * kst;
            const __global K_T* k6 = k + (long)IMIN(j0 + g + 6, Tk - 1) * kst;
            const __global K_T* k7 = k + (long)IMIN(j0 + g + 7, Tk - 1) * kst;
            float8 a0 = (float8)(0.0f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
            for (int d = 0; d < D; d++) {
                const float8 x = qt[d];
                a0 = x * LD_K(k0, d) + a0;
                a1 = x * LD_K(k1, d) + a1;
                a2 = x * LD_K(k2, d) + a2;
                a3 = x * LD_K(k3, d) + a3;
                a4 = x * LD_K(k4, d) + a4;
                a5 = x * LD_K(k5, d) + a5;
                a6 = x * LD_K(k6, d) + a6;
                a7 = x * LD_K(k7, d) + a7;
            }
            st[g] = a0; st[g + 1] = a1; st[g + 2] = a2; st[g + 3] = a3;
            st[g + 4] = a4; st[g + 5] = a5; st[g + 6] = a6; st[g + 7] = a7;
        }
        for (int jj = 0; jj < BK; jj++) {
            const int j = j0 + jj;
            float8 z = st[jj];
#if SOFTCAP || MASK
            union { float8 v; float s[8]; } u;
            u.v = z;
            for (int r = 0; r < 8; r++) {
                float zr = u.s[r];
#if SOFTCAP
                zr = softcap * dl_tanh(zr / softcap);
#endif
#if MASK == 1
                if (r < nq && jj < nk) zr += mask[r * msq + j * msk];
#elif MASK == 2
                if (r < nq && jj < nk && !mask[r * msq + j * msk]) zr = -INFINITY;
#endif
                u.s[r] = zr;
            }
            z = u.v;
#endif
#if CAUSAL
            z = j > lane + (q0 + causal_offset) ? (float8)(-INFINITY) : z;
#endif
            st[jj] = jj < nk ? z : (float8)(-INFINITY);
        }
        float8 top = m;
        for (int jj = 0; jj < BK; jj++) top = st[jj] > top ? st[jj] : top;  // (NaN scores ignored, as fmax)
        const float8 mu = top == (float8)(-INFINITY) ? (float8)(0.0f) : top;  // nothing visible yet: e^-inf = 0
        union { float8 v[BK]; float s[BK * 8]; } p;
        union { float8 v; float s[8]; } al;
        al.v = m - mu;
        for (int r = 0; r < 8; r++) al.s[r] = dl_exp_neg(al.s[r]);
        for (int jj = 0; jj < BK; jj++) p.v[jj] = st[jj] - mu;
        for (int i = 0; i < BK * 8; i++) p.s[i] = dl_exp_neg(p.s[i]);
        float8 sum = (float8)(0.0f);
        for (int jj = 0; jj < BK; jj++) sum += p.v[jj];
        l = l * al.v + sum;
        m = top;
        for (int r0 = 0; r0 < 8; r0 += 4)
            for (int c0 = 0; c0 < DVP; c0 += 2) {  // acc[r0..r0+3][c0..c0+1] = its rows' alpha acc + p v over the
                const float a0 = al.s[r0], a1 = al.s[r0 + 1], a2 = al.s[r0 + 2], a3 = al.s[r0 + 3];  // block's keys
                float8 o00 = acc[r0][c0] * a0, o01 = acc[r0][c0 + 1] * a0;
                float8 o10 = acc[r0 + 1][c0] * a1, o11 = acc[r0 + 1][c0 + 1] * a1;
                float8 o20 = acc[r0 + 2][c0] * a2, o21 = acc[r0 + 2][c0 + 1] * a2;
                float8 o30 = acc[r0 + 3][c0] * a3, o31 = acc[r0 + 3][c0 + 1] * a3;
                for (int jj = 0; jj < nk; jj++) {
                    const __global V_T* vr = v + (long)(j0 + jj) * vst;
                    const float8 v0 = CHUNK_V(vr, c0, DV), v1 = CHUNK_V(vr, c0 + 1, DV);
                    const float p0 = p.s[jj * 8 + r0], p1 = p.s[jj * 8 + r0 + 1];
                    const float p2 = p.s[jj * 8 + r0 + 2], p3 = p.s[jj * 8 + r0 + 3];
                    o00 = p0 * v0 + o00; o01 = p0 * v1 + o01;
                    o10 = p1 * v0 + o10; o11 = p1 * v1 + o11;
                    o20 = p2 * v0 + o20; o21 = p2 * v1 + o21;
                    o30 = p3 * v0 + o30; o31 = p3 * v1 + o31;
                }
                acc[r0][c0] = o00; acc[r0][c0 + 1] = o01; acc[r0 + 1][c0] = o10; acc[r0 + 1][c0 + 1] = o11;
                acc[r0 + 2][c0] = o20; acc[r0 + 2][c0 + 1] = o21; acc[r0 + 3][c0] = o30;
                acc[r0 + 3][c0 + 1] = o31;
            }
    }
    union { float8 v; float s[8]; } lu;
    lu.v = l;
    for (int r = 0; r < nq; r++) {
        const float inv = lu.s[r] > 0.0f ? 1.0f / lu.s[r] : 0.0f;
        for (int c = 0; c < DV8; c++) store_chunk(y + r * yst, c, acc[r][c] * inv);
    }
}
