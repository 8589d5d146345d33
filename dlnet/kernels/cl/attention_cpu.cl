// Attention on CPUs (PoCL): y = softmax(cap(q k^T * scale) + mask [+ causal]) v, the online softmax of attention.cl
// without its work-groups and barriers (PoCL runs a work-group's work-items as loops between barriers, with each
// private array spilled per work-item: 5x slower than the unfused products at T = 512). One work-item (local size 1)
// per RQ query rows of one batch * head: their q rows and output accumulators in float8 registers along the head
// dim, keys streamed from global memory (the cache holds a head's K and V) BK at a time; each key's score a float8
// dot product and one horizontal sum per row. No built-ins inside the loops (PoCL calls fma, fmax, exp and vload8
// out of line: 12 heads of 128 x 64, 7.6 -> 1.5 ms): multiply-adds that the compiler contracts, ternaries, cpu_math.cl's
// dl_exp_neg, unaligned float8 loads through a pointer.
//   Layouts (element strides of b, h and t), mask, CAUSAL and SOFTCAP as in attention.cl. Needs cpu_math.cl before it.
#if !defined(D) || !defined(DV) || !defined(RQ) || !defined(BK)
#error "attention_cpu.cl needs D, DV, RQ and BK"
#endif
#ifndef MASK
#define MASK 0
#endif
#ifndef CAUSAL
#define CAUSAL 0
#endif
#ifndef SOFTCAP
#define SOFTCAP 0
#endif
#define D8 ((D + 7) / 8)
#define DV8 ((DV + 7) / 8)
#if MASK == 2
#define MASK_T uchar
#else
#define MASK_T float
#endif

typedef float8 __attribute__((aligned(4))) float8u;

// chunk c of a row of n floats, zeros past its end
inline float8 chunk8(__global const float* row, int c, int n) {
    if ((c + 1) * 8 <= n) return *(__global const float8u*)(row + 8 * c);
    union { float8 v; float s[8]; } t;
    for (int i = 0; i < 8; i++) t.s[i] = c * 8 + i < n ? row[c * 8 + i] : 0.0f;
    return t.v;
}

// the same from a row of half (precision "fp16": Q_HALF, K_HALF, V_HALF)
inline float8 chunk8h(__global const half* row, int c, int n) {
    if ((c + 1) * 8 <= n) return vload_half8(c, row);
    union { float8 v; float s[8]; } t;
    for (int i = 0; i < 8; i++) t.s[i] = c * 8 + i < n ? vload_half(c * 8 + i, row) : 0.0f;
    return t.v;
}
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
#define STY(i, x) vstore_half(x, i, y)
#else
#define Y_T float
#define STY8(p, x) *(__global float8u*)(p) = (x)
#define STY(i, x) y[i] = (x)
#endif

inline float hsum8(float8 a) {
    const float4 b = a.lo + a.hi;
    const float2 c = b.lo + b.hi;
    return c.x + c.y;
}

__kernel void attention_cpu(__global const Q_T* q, ulong q_off, __global const K_T* k, ulong k_off,
                            __global const V_T* v, ulong v_off, __global const MASK_T* mask, ulong mask_off,
                            __global Y_T* y, ulong y_off, int Tq, int Tk, int Hq, int Hk, float scale,
                            float softcap, int causal_offset, long msb, long msh, long msq, long msk, long qsb, long qsh, long qst, long ksb, long ksh,
               long kst, long vsb, long vsh, long vst, long ysb, long ysh, long yst) {
    const int q0 = get_global_id(0) * RQ;
    const long bh = get_global_id(1);
    if (q0 >= Tq) return;
    const int nq = min(RQ, Tq - q0);
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
    const int kv_end = min(Tk, q0 + nq + causal_offset);
#else
    const int kv_end = Tk;
#endif
    for (int j0 = 0; j0 < kv_end; j0 += BK) {
        const int nk = min(BK, kv_end - j0);
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
        for (int c = 0; c < DV8; c++) {
            const float8 o = acc[r][c] * inv;
            if ((c + 1) * 8 <= DV) {
                STY8(y + r * yst + 8 * c, o);
            } else {
                union { float8 v; float s[8]; } t;
                t.v = o;
                for (int i = 0; c * 8 + i < DV; i++) STY(r * yst + c * 8 + i, t.s[i]);
            }
        }
    }
}
