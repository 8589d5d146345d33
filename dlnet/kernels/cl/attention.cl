// Attention, FlashAttention style: y = softmax(cap(q k^T * scale) + mask [+ causal]) v without the Tq x Tk scores.
// One work-group per (block of BQ query rows, batch * head): the block's q rows sit in __local memory; K and V are
// streamed through __local memory BK keys at a time; each row keeps a running maximum m, a running sum l of
// exp(z - m) and its output accumulator, rescaled by exp(m_old - m_new) whenever the maximum grows (online softmax).
// The NTR x NTC work-items tile the block: work-item (tr, tc) owns rows tr + NTR * i (i < RQ), score columns
// tc + NTC * c of each key tile (c < CK) and output columns tc + NTC * c (c < CV): strided, so that the work-items
// of a row read consecutive words of a tile (no bank conflicts), and the tiles' rows are padded by one word for
// the same reason across rows. Portable OpenCL C: no subgroups, no half, float accumulation.
//   q [B, Hq, Tq, D], k [B, Hk, Tk, D], v [B, Hk, Tk, DV], y [B, Hq, Tq, DV] through element strides: row t of
//   head h of batch b of q at b * qsb + h * qsh + t * qst (k, v, y alike), its D (DV) floats contiguous; so a
//   [B, T, H, D] operand is read or written in place, no head Transpose. q head h reads kv head h / (Hq / Hk)
//   (grouped-query attention). mask: element (b, h, i, j) at b * msb + h * msh + i * msq + j * msk
//   (strides 0 where it broadcasts); MASK 1 adds it (float), MASK 2 lets key j through where it is nonzero (bool).
//   CAUSAL: key j is visible to query i iff j <= i + causal_offset. SOFTCAP: s = softcap * tanh(s / softcap)
//   before the mask. A row with no visible key writes 0.
#if !defined(D) || !defined(DV) || !defined(BQ) || !defined(BK) || !defined(NTR) || !defined(NTC) || !defined(MASK) || \
    !defined(MASK_T) || !defined(CAUSAL) || !defined(SOFTCAP)
#error "attention.cl needs D, DV, BQ, BK, NTR, NTC, MASK, MASK_T, CAUSAL and SOFTCAP"
#endif
#if BQ % NTR || BK % NTC || NTC > BK || BK % 4
#error "attention.cl: NTR must divide BQ, NTC divide BK, and BK be a multiple of 4"
#endif

#define NT (NTR * NTC)
#define RQ (BQ / NTR)
#define CK (BK / NTC)
#define CV ((DV + NTC - 1) / NTC)
// Head dims that are a multiple of 4 read q and k four floats at a time (rows padded by 4 words: 16-byte aligned,
// and the 8 rows a warp reads start in 8 different groups of 4 banks); the scores' rows likewise, for the p . v
// product. The rows' maxima go through `red`, NTC partial maxima a row, not every work-item reading the row's BK
// scores. H200, `bench/probes/attention_tiles.py`, kernel ms at the 64x32/16x8 tile before -> after: 16 x 12 x 256 x 64
// 0.202 -> 0.184, 1 x 12 x 197 x 64 0.051 -> 0.048, at 197 rows 0.162 -> 0.144.
#define QK4 (D % 4 == 0)
#if QK4
#define DP (D + 4)
#else
#define DP (D + 1)
#endif
#define DVP (DV + 1)
#define BKP (BK + 4)
#define KV_ROW (DP > DVP ? DP : DVP)

// precision "fp16" (kernels/half.py): Q_HALF, K_HALF, V_HALF, Y_HALF store that operand in half (LDQ/LDK/LDV read
// one element as float, STY writes one); the scores, the softmax and the sums stay float
#if defined(Q_HALF)
#define Q_T half
#define LDQ(i) vload_half(i, q)
#else
#define Q_T float
#define LDQ(i) q[i]
#endif
#if defined(K_HALF)
#define K_T half
#define LDK(i) vload_half(i, k)
#else
#define K_T float
#define LDK(i) k[i]
#endif
#if defined(V_HALF)
#define V_T half
#define LDV(i) vload_half(i, v)
#else
#define V_T float
#define LDV(i) v[i]
#endif
#if defined(Y_HALF)
#define Y_T half
#define STY(i, x) vstore_half(x, i, y)
#else
#define Y_T float
#define STY(i, x) y[i] = TF32Y(x)
#endif
// SPLITS (decoding, FlashDecoding's split of the keys): SPLITS work-groups per block of query rows, split s taking
// the key tiles from s * KS to (s + 1) * KS; each writes its rows' running maximum m, sum l and unnormalised output
// to `part` (per row of all B * Hq * Tq and split: DV + 2 floats), then counts itself in `done` (one int per block of
// rows, zero between runs); the last of a block's splits merges them into y and sets its count back to 0. A decoding
// step's few query rows made one work-group per head, streaming every key tile in turn (12 of 132 SMs busy); a
// second kernel to merge cost a launch a layer.
__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void attention(__global const Q_T* q, ulong q_off, __global const K_T* k, ulong k_off,
               __global const V_T* v, ulong v_off, __global const MASK_T* mask, ulong mask_off,
               __global Y_T* y, ulong y_off, int Tq, int Tk, int Hq, int Hk, float scale, float softcap,
               int causal_offset, long msb, long msh, long msq, long msk, long qsb, long qsh, long qst, long ksb, long ksh,
               long kst, long vsb, long vsh, long vst, long ysb, long ysh, long yst
#if defined(SPLITS)
               , __global volatile float* part, int KS, __global volatile int* done
#endif
               ) {
    __local float qs[BQ * DP] __attribute__((aligned(16)));
    __local float kvs[BK * KV_ROW] __attribute__((aligned(16)));
    __local float ps[BQ * BKP] __attribute__((aligned(16)));  // a tile's exponentials; at the end the partial sums
    __local float red[BQ * NTC] __attribute__((aligned(16)));  // the rows' partial maxima
    const int lid = get_local_id(0);
    const int tr = lid / NTC, tc = lid % NTC;
#if defined(SPLITS)
    const int split = get_group_id(0) % SPLITS;
    const int q0 = get_group_id(0) / SPLITS * BQ;
#else
    const int q0 = get_group_id(0) * BQ;
#endif
    const long bh = get_group_id(1);
    const long b = bh / Hq;
    const int h = bh % Hq;
    const long kvh = h / (Hq / Hk);
    const int nq = min(BQ, Tq - q0);
    q += q_off + b * qsb + h * qsh + q0 * qst;
    k += k_off + b * ksb + kvh * ksh;
    v += v_off + b * vsb + kvh * vsh;
    y += y_off + b * ysb + h * ysh + q0 * yst;
#if MASK
    mask += mask_off + b * msb + h * msh + q0 * msq;
#endif
    for (int e = lid; e < BQ * D; e += NT) {
        const int r = e / D, d = e % D;
        qs[r * DP + d] = r < nq ? LDQ(r * qst + d) : 0.0f;
    }
    float acc[RQ][CV], m[RQ], l[RQ];
    for (int i = 0; i < RQ; i++) {
        m[i] = -INFINITY;
        l[i] = 0.0f;
        for (int c = 0; c < CV; c++) acc[i][c] = 0.0f;
    }
#if CAUSAL
    const int kv_end = min(Tk, q0 + nq + causal_offset);  // past the last key the block's last row sees
#else
    const int kv_end = Tk;
#endif
#if defined(SPLITS)
    const int kv_lo = split * KS, kv_hi = min(kv_end, kv_lo + KS);
#else
    const int kv_lo = 0, kv_hi = kv_end;
#endif
    for (int k0 = kv_lo; k0 < kv_hi; k0 += BK) {
        const int nk = min(BK, Tk - k0);
        barrier(CLK_LOCAL_MEM_FENCE);  // the last tile's readers of kvs and ps are done (the first time: qs written)
        for (int e = lid; e < BK * D; e += NT) {
            const int r = e / D, d = e % D;
            kvs[r * DP + d] = r < nk ? LDK((k0 + r) * kst + d) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        float s[RQ][CK];
        for (int i = 0; i < RQ; i++)
            for (int c = 0; c < CK; c++) s[i][c] = 0.0f;
#if QK4
        for (int d = 0; d < D; d += 4) {
            float4 qv[RQ], kv[CK];
            for (int i = 0; i < RQ; i++) qv[i] = *(__local const float4*)(qs + (tr + NTR * i) * DP + d);
            for (int c = 0; c < CK; c++) kv[c] = *(__local const float4*)(kvs + (tc + NTC * c) * DP + d);
            for (int i = 0; i < RQ; i++)
                for (int c = 0; c < CK; c++)
                    s[i][c] = fma(qv[i].w, kv[c].w, fma(qv[i].z, kv[c].z, fma(qv[i].y, kv[c].y,
                                  fma(qv[i].x, kv[c].x, s[i][c]))));
        }
#else
        for (int d = 0; d < D; d++) {
            float qv[RQ], kv[CK];
            for (int i = 0; i < RQ; i++) qv[i] = qs[(tr + NTR * i) * DP + d];
            for (int c = 0; c < CK; c++) kv[c] = kvs[(tc + NTC * c) * DP + d];
            for (int i = 0; i < RQ; i++)
                for (int c = 0; c < CK; c++) s[i][c] = fma(qv[i], kv[c], s[i][c]);
        }
#endif
        for (int i = 0; i < RQ; i++) {
            const int r = tr + NTR * i;
            float top = -INFINITY;
            for (int c = 0; c < CK; c++) {
                const int j = tc + NTC * c;
                float z = -INFINITY;
                if (r < nq && j < nk) {
                    z = s[i][c] * scale;
#if SOFTCAP
                    z = softcap * tanh(z / softcap);
#endif
#if MASK == 1
                    z += mask[r * msq + (k0 + j) * msk];
#elif MASK == 2
                    if (!mask[r * msq + (k0 + j) * msk]) z = -INFINITY;
#endif
#if CAUSAL
                    if (k0 + j > q0 + r + causal_offset) z = -INFINITY;
#endif
                }
                s[i][c] = z;
                top = fmax(top, z);
            }
            red[r * NTC + tc] = top;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        // each row's new maximum from its NTC partial ones, while the V tile goes where the K tile was
        float alpha[RQ], mu[RQ];
        for (int i = 0; i < RQ; i++) {
            const int r = tr + NTR * i;
            float top = m[i];
            for (int t = 0; t < NTC; t++) top = fmax(top, red[r * NTC + t]);
            mu[i] = top == -INFINITY ? 0.0f : top;  // nothing visible yet: exp(-inf - 0) = 0, never inf - inf
            alpha[i] = exp(m[i] - mu[i]);
            m[i] = top;
        }
        for (int e = lid; e < BK * DV; e += NT) {
            const int r = e / DV, d = e % DV;
            kvs[r * DVP + d] = r < nk ? LDV((k0 + r) * vst + d) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int i = 0; i < RQ; i++) {
            const int r = tr + NTR * i;
            float sum = 0.0f;
            for (int c = 0; c < CK; c++) {
                const float p = exp(s[i][c] - mu[i]);
                ps[r * BKP + tc + NTC * c] = p;
                sum += p;
            }
            l[i] = l[i] * alpha[i] + sum;  // this work-item's columns only: summed over the row's work-items at the end
            for (int c = 0; c < CV; c++) acc[i][c] *= alpha[i];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        // four keys at a time: the scores' columns past nk hold exp(-inf) = 0 and the V tile's rows past nk zeros
        for (int j = 0; j < nk; j += 4) {
            float4 p4[RQ];
            for (int i = 0; i < RQ; i++) p4[i] = *(__local const float4*)(ps + (tr + NTR * i) * BKP + j);
#define PV_KEY(jj, comp)                                                                                      \
            {                                                                                                 \
                float vv[CV];                                                                                 \
                for (int c = 0; c < CV; c++) vv[c] = tc + NTC * c < DV ? kvs[(j + jj) * DVP + tc + NTC * c] : 0.0f; \
                for (int i = 0; i < RQ; i++)                                                                  \
                    for (int c = 0; c < CV; c++) acc[i][c] = fma(p4[i].comp, vv[c], acc[i][c]);               \
            }
            PV_KEY(0, x) PV_KEY(1, y) PV_KEY(2, z) PV_KEY(3, w)
#undef PV_KEY
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = 0; i < RQ; i++) ps[(tr + NTR * i) * BKP + tc] = l[i];
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = 0; i < RQ; i++) {
        const int r = tr + NTR * i;
        if (r >= nq) continue;
        float total = 0.0f;
        for (int t = 0; t < NTC; t++) total += ps[r * BKP + t];
#if defined(SPLITS)
        __global volatile float* pr = part + ((bh * Tq + q0 + r) * SPLITS + split) * (DV + 2);
        if (tc == 0) {
            pr[0] = m[i];
            pr[1] = total;
        }
        for (int c = 0; c < CV; c++) {
            const int col = tc + NTC * c;
            if (col < DV) pr[2 + col] = acc[i][c];
        }
#else
        const float inv = total > 0.0f ? 1.0f / total : 0.0f;
        for (int c = 0; c < CV; c++) {
            const int col = tc + NTC * c;
            if (col < DV) STY(r * yst + col, acc[i][c] * inv);
        }
#endif
    }
#if defined(SPLITS)
    // the block's last split to finish merges them all: y = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s, M the
    // largest m_s (a row no split saw a key for: 0)
    __local int last;
    mem_fence(CLK_GLOBAL_MEM_FENCE);  // (this work-item's partials out before the block's count)
    barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
    __global volatile int* count = done + bh * get_num_groups(0) / SPLITS + q0 / BQ;
    if (lid == 0) last = atomic_inc(count) == SPLITS - 1;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (!last) return;
    mem_fence(CLK_GLOBAL_MEM_FENCE);
    for (int e = lid; e < nq * DV; e += NT) {
        const int r = e / DV, col = e % DV;
        __global volatile const float* pr = part + (bh * Tq + q0 + r) * SPLITS * (DV + 2);
        float top = -INFINITY;
        for (int t = 0; t < SPLITS; t++) top = fmax(top, pr[t * (DV + 2)]);
        float num = 0.0f, den = 0.0f;
        if (top != -INFINITY)
            for (int t = 0; t < SPLITS; t++) {
                const float w = exp(pr[t * (DV + 2)] - top);  // (a split that saw no key: m = -inf, w = 0)
                den += w * pr[t * (DV + 2) + 1];
                num += w * pr[t * (DV + 2) + 2 + col];
            }
        STY(r * yst + col, den > 0.0f ? num / den : 0.0f);
    }
    if (lid == 0) *count = 0;  // (ready for the next run)
#endif
}
