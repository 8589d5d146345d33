// Attention on NVIDIA tensor cores (precision="tf32"): attention.cl's maths, arguments and operand layouts, with
// both products (S = q k^T and O = P v) as inline PTX mma.sync m16n8k8 on tf32 and fp32 accumulation (mma_tf32.cl
// comes first: MMA_TF32, TF32_BITS; then ptx_lanes.cl: pack_half2, shfl_xor). FlashAttention-2's shape: a
// work-group of WARPS warps takes BQ = 16 WARPS query
// rows of one (batch, head), each warp 16 rows whose q fragments stay in registers for the whole pass; K and V come
// through __local memory BK keys at a time (V stored transposed); the online softmax runs on the score fragments
// themselves, a row's maximum and sum reduced over the 4 lanes that hold it (shfl.sync).
// The order of k inside an mma is free as long as A and B agree. Both products take it so that lane (g, t)'s pair of
// adjacent columns 2t, 2t + 1 of an 8-wide block are its k = t and t + 4: q and K are read as float2 (d = 2t, 2t + 1),
// and the score fragment c0..c3 of S (keys 2t, 2t + 1 of rows g, g + 8) is already P's A fragment for O = P v, whose
// B fragment is then V^T's float2 at keys 2t, 2t + 1. Rows of the tiles are padded to 8 mod 32 floats: the float2
// reads of a half-warp (rows g < 4, columns 2t) hit 32 distinct banks.
//   F16 (precision="fp16": q, k and v stored in half): mma.sync m16n8k16 on f16 with fp32 accumulation. Its A and B
//   registers hold two halves adjacent along k, and its k steps of 16 are two 8-wide blocks: so the natural order
//   serves (FlashAttention-2's): S's fragments of key blocks 2J and 2J + 1, packed to half pairs, are P's A fragment
//   for keys 16J..16J + 15, and V^T's 32-bit words give B. Y_HALF: y stored in half too (Y_PAIRS: two halves a
//   32-bit store, y's offset and strides even).
// KV_ASYNC (k's and v's offsets and strides on 16 bytes; F16: DV a multiple of 16): K and V come by 16-byte cp.async
// (ptx_lanes.cl) into two stages of __local memory, tile i + 1 in flight while tile i is used, both row-major (no
// transposing copy). F16: rows padded by 16 bytes, S's B fragments K's rows by ldmatrix, O's V's by ldmatrix.trans;
// tf32: K's rows as above (KS), V's padded to 4 mod 16 floats, b0, b1 of O = P v two floats of rows 2t, 2t + 1 at
// column g (32 distinct banks).
// The softmax works in base 2 (scores times log2 e, ex2.approx). A tile needs no per-score test where every key is
// there and, causal, visible to the warp's every row (no MASK, no SOFTCAP): its scores are only scaled; a warp skips
// a causal tile none of its rows sees.
#if !defined(D) || !defined(DV) || !defined(WARPS) || !defined(BK) || !defined(MASK) || !defined(MASK_T) || \
    !defined(CAUSAL) || !defined(SOFTCAP)
#error "attention_mma.cl needs D, DV, WARPS, BK, MASK, MASK_T, CAUSAL and SOFTCAP"
#endif
#if defined(F16)
#if D % 16 || DV % 8 || BK % 16
#error "attention_mma.cl F16: D and BK must be multiples of 16, DV of 8"
#endif
#define ET ushort  // q, k, v elements (half bits)
#define ET4 ushort4
#define KS (D + (72 - D % 64) % 64)  // rows of 32-bit words 4 mod 32 apart
#define VS (BK + (72 - BK % 64) % 64)
#else
#if D % 8 || DV % 8 || BK % 8
#error "attention_mma.cl: D, DV and BK must be multiples of 8"
#endif
#define ET float
#define ET4 float4
#define KS (D + (40 - D % 32) % 32)
#define VS (BK + (40 - BK % 32) % 32)
#endif
#if defined(KV_ASYNC)
#if defined(F16)
#if DV % 16
#error "attention_mma.cl KV_ASYNC F16: DV must be a multiple of 16"
#endif
#define KSB (2 * D + 16)  // bytes a row of K's and V's stages: ldmatrix's 8 rows of 16 bytes in distinct banks
#define VSB (2 * DV + 16)
#else
#define KSB (4 * KS)
#define VSB (4 * (DV + 4))
#endif
#define EC (16 / (int)sizeof(ET))  // elements a copy
#define STAGE_B (BK * (KSB + VSB))
// tile k0's BK rows of K and of V into stage st (zeros past Tk)
#define KV_ISSUE(st, k0) { \
    const uint ks_ = sbase + (st) * STAGE_B, vs_ = ks_ + BK * KSB; \
    for (int e = lid; e < BK * D / EC; e += NT) { \
        const int r = e / (D / EC), c = e % (D / EC) * EC; \
        PTX_CP16(ks_ + r * KSB + c * (int)sizeof(ET), k + min((k0) + r, Tk - 1) * kst + c, (k0) + r < Tk ? 16 : 0); } \
    for (int e = lid; e < BK * DV / EC; e += NT) { \
        const int r = e / (DV / EC), c = e % (DV / EC) * EC; \
        PTX_CP16(vs_ + r * VSB + c * (int)sizeof(ET), v + min((k0) + r, Tk - 1) * vst + c, (k0) + r < Tk ? 16 : 0); } }
// tf32: lane (g, t)'s float pairs of K (S's B) and of V (O's B), from a stage at kp / vp or the single tiles
#define K_PAIR(j, c) (*(__local const float2*)(kp + (8 * (j) + g) * KSB + 4 * (8 * (c) + 2 * t)))
#define V_PAIR(n, j) ((float2)(*(__local const float*)(vp + (8 * (j) + 2 * t) * VSB + 4 * (8 * (n) + g)), \
                               *(__local const float*)(vp + (8 * (j) + 2 * t + 1) * VSB + 4 * (8 * (n) + g))))
#else
#define K_PAIR(j, c) (*(__local const float2*)&ks[(8 * (j) + g) * KS + 8 * (c) + 2 * t])
#define V_PAIR(n, j) (*(__local const float2*)&vt[(8 * (n) + g) * VS + 8 * (j) + 2 * t])
#endif
#if defined(Y_PAIRS) && !defined(Y_HALF)
#error "attention_mma.cl: Y_PAIRS stores halves"
#endif
#if defined(Y_HALF)
#define YT half
#define Y_STORE(val, i) vstore_half((val), (i), y)
#else
#define YT float
#define Y_STORE(val, i) (y[i] = TF32Y(val))
#endif
#define BQ (16 * WARPS)
#define NT (32 * WARPS)
#if defined(MMA_EMU)  // (tests: every warp reaches every emulated lane exchange, so none skips a tile; loops left
#define SKIP(cond) 0     // rolled, as PoCL compiles each region between barriers on its own)
#define UNROLL
#else
#define SKIP(cond) (cond)
#define UNROLL _Pragma("unroll")
#endif

inline uint half_pair(__global const ushort* p) {  // two adjacent halves of global memory, any 2-byte alignment
    const ushort2 x = vload2(0, p);
    return (uint)x.s0 | ((uint)x.s1 << 16);
}

__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void attention_mma(__global const ET* q, ulong q_off, __global const ET* k, ulong k_off,
                   __global const ET* v, ulong v_off, __global const MASK_T* mask, ulong mask_off,
                   __global YT* y, ulong y_off, int Tq, int Tk, int Hq, int Hk, float scale, float softcap,
                   int causal_offset, long msb, long msh, long msq, long msk, long qsb, long qsh, long qst, long ksb,
                   long ksh, long kst, long vsb, long vsh, long vst, long ysb, long ysh, long yst) {
#if defined(MMA_EMU)
    MMA_EMU_DECL  // (tests: mma_emu.cl, whose cp.async and ldmatrix take shared addresses as offsets into `tiles`)
#endif
#if defined(KV_ASYNC)
    __local uint tiles[2 * STAGE_B / 4] __attribute__((aligned(16)));
#if defined(MMA_EMU)
    const uint sbase = 0;
#else
    const uint sbase = (uint)(ulong)tiles;
#endif
#else
    __local ET ks[BK * KS] __attribute__((aligned(16)));
    __local ET vt[DV * VS] __attribute__((aligned(16)));
#endif
    const int lid = get_local_id(0), lane = lid % 32, g = lane / 4, t = lane % 4;
    const int q0 = get_group_id(0) * BQ;
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
    const int w0 = (lid / 32) * 16, r0 = w0 + g, r1 = r0 + 8;  // the warp's first row, this lane's two rows
#if defined(F16)
    uint qa[D / 16][4];
    UNROLL
    for (int c = 0; c < D / 16; c++) {
        __global const ushort* p0 = q + r0 * qst + 16 * c + 2 * t;
        __global const ushort* p1 = q + r1 * qst + 16 * c + 2 * t;
        qa[c][0] = r0 < nq ? half_pair(p0) : 0u; qa[c][1] = r1 < nq ? half_pair(p1) : 0u;
        qa[c][2] = r0 < nq ? half_pair(p0 + 8) : 0u; qa[c][3] = r1 < nq ? half_pair(p1 + 8) : 0u;
    }
#else
    uint qa[D / 8][4];
    UNROLL
    for (int c = 0; c < D / 8; c++) {
        const float2 x0 = r0 < nq ? vload2(0, q + r0 * qst + 8 * c + 2 * t) : (float2)(0.0f);
        const float2 x1 = r1 < nq ? vload2(0, q + r1 * qst + 8 * c + 2 * t) : (float2)(0.0f);
        qa[c][0] = TF32_BITS(x0.x); qa[c][1] = TF32_BITS(x1.x); qa[c][2] = TF32_BITS(x0.y); qa[c][3] = TF32_BITS(x1.y);
    }
#endif
    float o[DV / 8][4];
    UNROLL
    for (int n = 0; n < DV / 8; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;  // (in base 2)
    const float scale2 = scale * M_LOG2E_F;
#if CAUSAL
    const int kv_end = min(Tk, q0 + nq + causal_offset);  // past the last key the block's last row sees
    const int warp_end = min(q0 + w0 + 16 + causal_offset, kv_end);  // ... and this warp's
#else
    const int kv_end = Tk, warp_end = Tk;
#endif
#if defined(KV_ASYNC)
    // lane's ldmatrix row in a stage: K's key lane % 8 + 8 (lane / 16) at d offset 16 bytes ((lane / 8) % 2) (b0, b1
    // of two key blocks); V's key lane % 8 + 8 ((lane / 8) % 2) at dv offset 16 bytes (lane / 16) (b0, b1 of two
    // column blocks)
    const uint k_lane = (lane % 8 + (lane / 16) * 8) * KSB + ((lane / 8) % 2) * 16;
    const uint v_lane = (lane % 8 + ((lane / 8) % 2) * 8) * VSB + (lane / 16) * 16;
    if (kv_end > 0) KV_ISSUE(0, 0)
    PTX_COMMIT();
#endif
    for (int k0 = 0, it = 0; k0 < kv_end; k0 += BK, it++) {
        const int nk = min(BK, Tk - k0);
        barrier(CLK_LOCAL_MEM_FENCE);  // every warp is done with the last tile
#if defined(KV_ASYNC)
        if (k0 + BK < kv_end) KV_ISSUE((it + 1) % 2, k0 + BK)
        PTX_COMMIT();
        PTX_WAIT(1);  // this tile's copies have landed
        barrier(CLK_LOCAL_MEM_FENCE);
        const uint ks_ = sbase + (it % 2) * STAGE_B + k_lane, vs_ = sbase + (it % 2) * STAGE_B + BK * KSB + v_lane;
        __local const uchar* kp = (__local const uchar*)tiles + (it % 2) * STAGE_B;
        __local const uchar* vp = kp + BK * KSB;
#else
        for (int e = lid; e < BK * D / 4; e += NT) {
            const int r = e / (D / 4), d = e % (D / 4) * 4;
            vstore4(r < nk ? vload4(0, k + (k0 + r) * kst + d) : (ET4)(0), 0, ks + r * KS + d);
        }
        for (int e = lid; e < BK * DV / 4; e += NT) {  // (zeros past nk: P is 0 there, and 0 * garbage may be NaN)
            const int r = e / (DV / 4), d = e % (DV / 4) * 4;
            const ET4 x = r < nk ? vload4(0, v + (k0 + r) * vst + d) : (ET4)(0);
            vt[d * VS + r] = x.x; vt[(d + 1) * VS + r] = x.y; vt[(d + 2) * VS + r] = x.z; vt[(d + 3) * VS + r] = x.w;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#endif
        if (SKIP(w0 >= nq || k0 >= warp_end)) continue;  // (no row of this warp is stored, or sees these keys)
        float s[BK / 8][4];
#if defined(KV_ASYNC) && defined(F16)
        UNROLL
        for (int j = 0; j < BK / 8; j += 2) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
            s[j + 1][0] = s[j + 1][1] = s[j + 1][2] = s[j + 1][3] = 0.0f;
            UNROLL
            for (int c = 0; c < D / 16; c++)
                MMA_PAIR(PTX_LDSM_X4, ks_ + 8 * j * KSB + 32 * c, qa[c], s[j], s[j + 1]);
        }
#else
        UNROLL
        for (int j = 0; j < BK / 8; j++) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#if defined(F16)
            UNROLL
            for (int c = 0; c < D / 16; c++) {
                __local const uint* kw = (__local const uint*)&ks[(8 * j + g) * KS + 16 * c + 2 * t];
                MMA_F16(s[j], qa[c], kw[0], kw[4]);
            }
#else
            UNROLL
            for (int c = 0; c < D / 8; c++) {
                const float2 kb = K_PAIR(j, c);
                const uint bb[2] = {TF32_BITS(kb.x), TF32_BITS(kb.y)};
                MMA_TF32(s[j], qa[c], bb);
            }
#endif
        }
#endif
        float top0 = m0, top1 = m1;
        if (!MASK && !SOFTCAP && nk == BK && (!CAUSAL || k0 + BK <= q0 + w0 + 1 + causal_offset)) {
            UNROLL
            for (int j = 0; j < BK / 8; j++) {  // (every key there and seen by every row)
                s[j][0] *= scale2; s[j][1] *= scale2; s[j][2] *= scale2; s[j][3] *= scale2;
                top0 = fmax(top0, fmax(s[j][0], s[j][1])); top1 = fmax(top1, fmax(s[j][2], s[j][3]));
            }
        } else {
            UNROLL
            for (int j = 0; j < BK / 8; j++)
                UNROLL
                for (int e = 0; e < 4; e++) {
                    const int r = e < 2 ? r0 : r1, key = 8 * j + 2 * t + (e & 1);
                    float z = -INFINITY;
                    if (r < nq && key < nk) {
                        z = s[j][e] * scale;
#if SOFTCAP
                        z = softcap * tanh(z / softcap);
#endif
#if MASK == 1
                        z += mask[r * msq + (k0 + key) * msk];
#elif MASK == 2
                        if (!mask[r * msq + (k0 + key) * msk]) z = -INFINITY;
#endif
#if CAUSAL
                        if (k0 + key > q0 + r + causal_offset) z = -INFINITY;
#endif
                        z *= M_LOG2E_F;
                    }
                    s[j][e] = z;
                    if (e < 2) top0 = fmax(top0, z); else top1 = fmax(top1, z);
                }
        }
        top0 = fmax(top0, shfl_xor(top0, 1)); top0 = fmax(top0, shfl_xor(top0, 2));
        top1 = fmax(top1, shfl_xor(top1, 1)); top1 = fmax(top1, shfl_xor(top1, 2));
        const float mu0 = top0 == -INFINITY ? 0.0f : top0, mu1 = top1 == -INFINITY ? 0.0f : top1;  // (never inf - inf)
        const float alpha0 = ex2(m0 - mu0), alpha1 = ex2(m1 - mu1);
        m0 = top0; m1 = top1;
        float sum0 = 0.0f, sum1 = 0.0f;
#if defined(F16)
        uint pa[BK / 16][4];
        UNROLL
        for (int j = 0; j < BK / 8; j++) {
            const float p0 = ex2(s[j][0] - mu0), p1 = ex2(s[j][1] - mu0);
            const float p2 = ex2(s[j][2] - mu1), p3 = ex2(s[j][3] - mu1);
            sum0 += p0 + p1; sum1 += p2 + p3;
            pa[j / 2][2 * (j % 2)] = pack_half2(p0, p1); pa[j / 2][2 * (j % 2) + 1] = pack_half2(p2, p3);
        }
#else
        uint pa[BK / 8][4];
        UNROLL
        for (int j = 0; j < BK / 8; j++) {
            const float p0 = ex2(s[j][0] - mu0), p1 = ex2(s[j][1] - mu0);
            const float p2 = ex2(s[j][2] - mu1), p3 = ex2(s[j][3] - mu1);
            sum0 += p0 + p1; sum1 += p2 + p3;
            pa[j][0] = TF32_BITS(p0); pa[j][1] = TF32_BITS(p2); pa[j][2] = TF32_BITS(p1); pa[j][3] = TF32_BITS(p3);
        }
#endif
        l0 = l0 * alpha0 + sum0;  // this lane's columns only: summed over the row's 4 lanes at the end
        l1 = l1 * alpha1 + sum1;
#if defined(KV_ASYNC) && defined(F16)
        UNROLL
        for (int n = 0; n < DV / 8; n += 2) {
            o[n][0] *= alpha0; o[n][1] *= alpha0; o[n][2] *= alpha1; o[n][3] *= alpha1;
            o[n + 1][0] *= alpha0; o[n + 1][1] *= alpha0; o[n + 1][2] *= alpha1; o[n + 1][3] *= alpha1;
            UNROLL
            for (int j = 0; j < BK / 16; j++)
                MMA_PAIR(PTX_LDSM_X4_T, vs_ + 16 * j * VSB + 16 * n, pa[j], o[n], o[n + 1]);
        }
#else
        UNROLL
        for (int n = 0; n < DV / 8; n++) {
            o[n][0] *= alpha0; o[n][1] *= alpha0; o[n][2] *= alpha1; o[n][3] *= alpha1;
#if defined(F16)
            UNROLL
            for (int j = 0; j < BK / 16; j++) {
                __local const uint* vw = (__local const uint*)&vt[(8 * n + g) * VS + 16 * j + 2 * t];
                MMA_F16(o[n], pa[j], vw[0], vw[4]);
            }
#else
            UNROLL
            for (int j = 0; j < BK / 8; j++) {
                const float2 vb = V_PAIR(n, j);
                const uint bb[2] = {TF32_BITS(vb.x), TF32_BITS(vb.y)};
                MMA_TF32(o[n], pa[j], bb);
            }
#endif
        }
#endif
    }
    l0 += shfl_xor(l0, 1); l0 += shfl_xor(l0, 2);
    l1 += shfl_xor(l1, 1); l1 += shfl_xor(l1, 2);
    const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;  // (no visible key: 0)
    UNROLL
    for (int n = 0; n < DV / 8; n++) {
#if defined(Y_PAIRS)
        if (r0 < nq) *(__global uint*)(y + r0 * yst + 8 * n + 2 * t) = pack_half2(o[n][0] * inv0, o[n][1] * inv0);
        if (r1 < nq) *(__global uint*)(y + r1 * yst + 8 * n + 2 * t) = pack_half2(o[n][2] * inv1, o[n][3] * inv1);
#else
        if (r0 < nq) { Y_STORE(o[n][0] * inv0, r0 * yst + 8 * n + 2 * t); Y_STORE(o[n][1] * inv0, r0 * yst + 8 * n + 2 * t + 1); }
        if (r1 < nq) { Y_STORE(o[n][2] * inv1, r1 * yst + 8 * n + 2 * t); Y_STORE(o[n][3] * inv1, r1 * yst + 8 * n + 2 * t + 1); }
#endif
    }
}
