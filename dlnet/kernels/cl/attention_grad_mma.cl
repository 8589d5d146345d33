// Attention's gradient on NVIDIA tensor cores (AttentionGrad in precision "fp16" (F16: mma.sync m16n8k16 on f16) or
// "tf32" (m16n8k8 on tf32), fp32 accumulation): attention_grad.cl's maths and arguments, FlashAttention-2's backward
// in two kernels with no atomics (mma_tf32.cl, then ptx_lanes.cl, come first: MMA_F16, MMA_TF32, MMA_PAIR,
// TF32_BITS, ex2, pack_half2, shfl_xor, PTX_CP16, PTX_LDSM_X4).
//   attention_grad_mma_q: a work-group of WARPS warps takes 16 WARPS query rows of one (batch, q head), each warp 16
// rows whose q and dy fragments stay in registers; K (and V) come through __local memory BT keys a tile. A first pass
// over the keys makes each row's log-sum-exp (the forward's online softmax), a second its dq:
// p = 2^(z - lse), dp = dy v^T, ds = p (dp - D) with D = rowsum(dy y), dq = scale ds K. Each row's lse and D go to
// stats [B, Hq, Tq, 2] (lse +inf for a row that sees no key).
//   attention_grad_mma_kv: 16 WARPS key rows of one (batch, kv head), whose k and v fragments stay in registers;
// over the query rows of every q head that reads them (grouped-query heads: no atomics), BT a tile through __local
// memory (q and dy by rows and transposed, each row's lse and D): p^T = 2^(z^T - lse), dv += p^T dy, dp^T = v dy^T,
// ds^T = p^T (dp^T - D), dk += scale ds^T q.
// Every product has its A in registers, loaded once from global rows or made from the C fragments of the last product
// (their columns its k), and its B from a tile in __local memory stored as B's rows n, k contiguous (rows padded so
// that a warp's B loads meet distinct banks). F16 keeps tiles in half, tf32 in tf32 bits (rounded as they are stored).
// Each operand is float or half (X_H 0 or 1 per operand tag: Q K V Y G (dy), GQ GK GV (dq, dk, dv)).
// GA (F16, q, k, v and dy in half, their rows 16-byte aligned): the tiles come by 16-byte cp.async into two stages
// of __local memory, tile i + 1 in flight while tile i is used, rows only (16 bytes of padding a row); B fragments by
// ldmatrix, .trans where a product reads a tile transposed (attention_mma.cl's KV_ASYNC). Else the tiles are stored
// by work-items (converted, and transposed where a product needs), and B fragments read from them word by word.
// MMA_EMU (tests on CPUs): mma_emu.cl's lane exchanges through __local memory stand for the PTX ones, and no warp
// skips a tile (every work-item meets every barrier).
#if !defined(D) || !defined(DV) || !defined(WARPS) || !defined(BT) || !defined(MASK) || !defined(MASK_T) || \
    !defined(CAUSAL)
#error "attention_grad_mma.cl needs D, DV, WARPS, BT, MASK, MASK_T and CAUSAL"
#endif
#define NT (32 * WARPS)
#define BR (16 * WARPS)
#define STRIDES3(x) long x##sb, long x##sh, long x##st
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define T_0 float
#define T_1 half
#define LD1_0(p, i) ((p)[i])
#define LD1_1(p, i) vload_half((i), (p))
#define LD2_0(p, i) vload2(0, (p) + (i))
#define LD2_1(p, i) vload_half2(0, (p) + (i))
#define LD4_0(p, i) vload4(0, (p) + (i))
#define LD4_1(p, i) vload_half4(0, (p) + (i))
#define ST1_0(x, p, i) ((p)[i] = (x))
#define ST1_1(x, p, i) vstore_half((x), (i), (p))
#define OPT(X) CAT(T_, X##_H)  // operand X's element type
#define LD1(X, p, i) CAT(LD1_, X##_H)(p, i)
#define LD2(X, p, i) CAT(LD2_, X##_H)(p, i)
#define LD4(X, p, i) CAT(LD4_, X##_H)(p, i)
#define ST1(X, x, p, i) CAT(ST1_, X##_H)(x, p, i)
// a tile row of L elements padded to an odd number of 8-element units: rows g = 0..7 of a B load start 4 (f16:
// 32-bit words) or 8 (tf32: floats, read in pairs) banks apart times an odd number
#define PAD(L) ((L) / 8 % 2 ? (L) : (L) + 8)
#if defined(MMA_EMU)  // (loops left rolled: PoCL compiles each region between barriers on its own)
#define SKIP(cond) 0
#define UNROLL
#else
#define SKIP(cond) (cond)
#define UNROLL _Pragma("unroll")
#endif

#if defined(F16)
#if D % 16 || DV % 16 || BT % 16
#error "attention_grad_mma.cl F16: D, DV and BT must be multiples of 16"
#endif
#define KSTEP 16
#define TILE_T ushort
// the A fragment of the k step at column col: rows r0, r1 of operand X at p (ld apart; a row not ok gives zeros)
#define A_LOAD(X, a, p, ld, ok0, ok1, col) { \
    const float2 x00 = (ok0) ? LD2(X, p, r0 * (ld) + (col) + 2 * t) : (float2)(0.0f); \
    const float2 x10 = (ok1) ? LD2(X, p, r1 * (ld) + (col) + 2 * t) : (float2)(0.0f); \
    const float2 x01 = (ok0) ? LD2(X, p, r0 * (ld) + (col) + 2 * t + 8) : (float2)(0.0f); \
    const float2 x11 = (ok1) ? LD2(X, p, r1 * (ld) + (col) + 2 * t + 8) : (float2)(0.0f); \
    a[0] = pack_half2(x00.x, x00.y); a[1] = pack_half2(x10.x, x10.y); \
    a[2] = pack_half2(x01.x, x01.y); a[3] = pack_half2(x11.x, x11.y); }
// the B fragment of the k step at column col, n block at row n of a tile S elements a row
#define B_LOAD(b, tile, S, n, col) { \
    __local const uint* w_ = (__local const uint*)&(tile)[((n) + g) * (S) + (col) + 2 * t]; \
    b[0] = w_[0]; b[1] = w_[4]; }
#define MMA(d, a, b) MMA_F16(d, a, b[0], b[1])
// C fragments x of column blocks 2c, 2c + 1 as the A fragment of k step c
#define C_TO_A(a, x, c) { \
    a[0] = pack_half2(x[2 * (c)][0], x[2 * (c)][1]); a[1] = pack_half2(x[2 * (c)][2], x[2 * (c)][3]); \
    a[2] = pack_half2(x[2 * (c) + 1][0], x[2 * (c) + 1][1]); a[3] = pack_half2(x[2 * (c) + 1][2], x[2 * (c) + 1][3]); }
// four floats into a tile at i (a multiple of 4), along a row or (PUT4T) down a column of rows S apart
#define PUT4(tile, i, f_) \
    (*(__local uint2*)&(tile)[i] = (uint2)(pack_half2((f_).x, (f_).y), pack_half2((f_).z, (f_).w)))
#define PUT4T(tile, i, S, f_) { \
    const uint w0_ = pack_half2((f_).x, (f_).y), w1_ = pack_half2((f_).z, (f_).w); \
    (tile)[i] = (ushort)w0_; (tile)[(i) + (S)] = (ushort)(w0_ >> 16); \
    (tile)[(i) + 2 * (S)] = (ushort)w1_; (tile)[(i) + 3 * (S)] = (ushort)(w1_ >> 16); }
#else
#if D % 8 || DV % 8 || BT % 8
#error "attention_grad_mma.cl: D, DV and BT must be multiples of 8"
#endif
// tf32: lane (g, t)'s columns 2t, 2t + 1 of an 8-wide block are its k = t and t + 4 in A and B alike (attention_mma.cl)
#define KSTEP 8
#define TILE_T uint
#define A_LOAD(X, a, p, ld, ok0, ok1, col) { \
    const float2 x0 = (ok0) ? LD2(X, p, r0 * (ld) + (col) + 2 * t) : (float2)(0.0f); \
    const float2 x1 = (ok1) ? LD2(X, p, r1 * (ld) + (col) + 2 * t) : (float2)(0.0f); \
    a[0] = TF32_BITS(x0.x); a[1] = TF32_BITS(x1.x); a[2] = TF32_BITS(x0.y); a[3] = TF32_BITS(x1.y); }
#define B_LOAD(b, tile, S, n, col) { \
    const uint2 w_ = *(__local const uint2*)&(tile)[((n) + g) * (S) + (col) + 2 * t]; \
    b[0] = w_.x; b[1] = w_.y; }
#define MMA(d, a, b) MMA_TF32(d, a, b)
#define C_TO_A(a, x, c) { \
    a[0] = TF32_BITS(x[c][0]); a[1] = TF32_BITS(x[c][2]); a[2] = TF32_BITS(x[c][1]); a[3] = TF32_BITS(x[c][3]); }
#define PUT4(tile, i, f_) \
    (*(__local uint4*)&(tile)[i] = (uint4)(TF32_BITS((f_).x), TF32_BITS((f_).y), TF32_BITS((f_).z), TF32_BITS((f_).w)))
#define PUT4T(tile, i, S, f_) { \
    (tile)[i] = TF32_BITS((f_).x); (tile)[(i) + (S)] = TF32_BITS((f_).y); \
    (tile)[(i) + 2 * (S)] = TF32_BITS((f_).z); (tile)[(i) + 3 * (S)] = TF32_BITS((f_).w); }
#endif

#if defined(GA)
#if !defined(F16)
#error "attention_grad_mma.cl: GA needs F16"
#endif
#define SKB (2 * D + 16)  // bytes a row of the q or k tiles, and of the dy or v tiles
#define SVB (2 * DV + 16)
#define GA_STAGE (BT * (SKB + SVB))
// BT rows of L halves at p (ld apart; zeros from row n on, n > 0) by cp.async into the tile at shared address dst
#define GA_ROWS(dst, p, ld, L, S, n) \
    for (int e = lid; e < BT * ((L) / 8); e += NT) { \
        const int r_ = e / ((L) / 8), c_ = e % ((L) / 8) * 8; \
        PTX_CP16((dst) + r_ * (S) + 2 * c_, (p) + min(r_, (n) - 1) * (ld) + c_, r_ < (n) ? 16 : 0); }
// lane's ldmatrix row: B's rows n, k contiguous (b0, b1 of two n blocks), or the tile's rows k read transposed
#define ROW_LANE(S) ((lane % 8 + lane / 16 * 8) * (S) + lane / 8 % 2 * 16)
#define COL_LANE(S) ((lane % 8 + lane / 8 % 2 * 8) * (S) + lane / 16 * 16)
#define PRODUCT_R(x, a, tile, S, NB, KD) \
    UNROLL for (int j = 0; j < (NB); j += 2) \
        UNROLL for (int c = 0; c < (KD) / 16; c++) \
            MMA_PAIR(PTX_LDSM_X4, (tile) + ROW_LANE(S) + 8 * j * (S) + 32 * c, a[c], x[j], x[j + 1]);
#define PRODUCT_CT(x, y, tile, S, tt, ST, NB, KD) \
    UNROLL for (int c = 0; c < (KD) / 16; c++) { \
        uint a_[4]; \
        C_TO_A(a_, y, c); \
        UNROLL for (int n = 0; n < (NB); n += 2) \
            MMA_PAIR(PTX_LDSM_X4_T, (tile) + COL_LANE(S) + 16 * c * (S) + 16 * n, a_, x[n], x[n + 1]); }
#endif

// R rows of L elements of operand X (rows at p, ld apart; zeros from row n on) into a tile: rows S apart (TILE_IN),
// or transposed, element (r, c) at c S + r (TILE_IN_T; consecutive work-items take consecutive rows)
#define TILE_IN(X, tile, S, p, ld, R, L, n) \
    for (int e = lid; e < (R) * ((L) / 4); e += NT) { \
        const int r_ = e / ((L) / 4), c_ = e % ((L) / 4) * 4; \
        const float4 x_ = r_ < (n) ? LD4(X, p, r_ * (ld) + c_) : (float4)(0.0f); \
        PUT4(tile, r_ * (S) + c_, x_); }
#define TILE_IN_T(X, tile, S, p, ld, R, L, n) \
    for (int e = lid; e < (R) * ((L) / 4); e += NT) { \
        const int r_ = e % (R), c_ = e / (R) * 4; \
        const float4 x_ = r_ < (n) ? LD4(X, p, r_ * (ld) + c_) : (float4)(0.0f); \
        PUT4T(tile, c_ * (S) + r_, S, x_); }
#define ZERO(x, NB) \
    UNROLL for (int j = 0; j < (NB); j++) x[j][0] = x[j][1] = x[j][2] = x[j][3] = 0.0f;
// x[j] += A B for the NB n blocks of a tile (B's rows n at S apart), KD deep: A in registers (a[KD / KSTEP][4]), or
// (PRODUCT_CT) made from C fragments y whose KD columns are its k, B the rows k of a tile (GA: read transposed by
// ldmatrix) or the rows n of its transposed copy tt (ST apart)
#if !defined(GA)
#define PRODUCT_R(x, a, tile, S, NB, KD) \
    UNROLL for (int j = 0; j < (NB); j++) \
        UNROLL for (int c = 0; c < (KD) / KSTEP; c++) { \
            uint b_[2]; \
            B_LOAD(b_, tile, S, 8 * j, KSTEP * c); \
            MMA(x[j], a[c], b_); }
#define PRODUCT_CT(x, y, tile, S, tt, ST, NB, KD) \
    UNROLL for (int c = 0; c < (KD) / KSTEP; c++) { \
        uint a_[4]; \
        C_TO_A(a_, y, c); \
        UNROLL for (int j = 0; j < (NB); j++) { \
            uint b_[2]; \
            B_LOAD(b_, tt, ST, 8 * j, KSTEP * c); \
            MMA(x[j], a_, b_); } }
#endif
// a score x of query i and key j (absolute; the mask m at its (batch, head)) as z in base 2, -inf where not seen
// or not ok (a row or key past the operands: no mask read)
#if MASK == 1
#define MASKED(z, m, i, j) ((z) + (m)[(i) * msq + (j) * msk])
#elif MASK == 2
#define MASKED(z, m, i, j) ((m)[(i) * msq + (j) * msk] ? (z) : -INFINITY)
#else
#define MASKED(z, m, i, j) (z)
#endif
#if CAUSAL
#define SEEN(i, j) ((j) <= (i) + causal_offset)
#else
#define SEEN(i, j) 1
#endif
#define Z(x, m, i, j, ok) ((ok) && SEEN(i, j) ? MASKED((x) * scale, m, i, j) * M_LOG2E_F : -INFINITY)
#define QS PAD(D)
#define VS PAD(DV)
#define TS PAD(BT)
// a kernel's __local tiles (and the emulation's lane exchange), and this work-item's lane (g, t) of its warp
#if !defined(MMA_EMU)
#define MMA_EMU_DECL
#endif
#define KERNEL_START \
    TILES_DECL \
    MMA_EMU_DECL \
    const int lid = get_local_id(0), lane = lid % 32, g = lane / 4, t = lane % 4;
// each kernel's tiles: ta the rows of k (dq) or q (dk dv), tb those of v or dy; stage `it` of them (GA), or the one
// tile of each, with their transposed copies tat, tbt (rows S_A, S_B and TS apart)
#if defined(GA)
#if defined(MMA_EMU)
#define SHARED_ADDR(p) 0u
#else
#define SHARED_ADDR(p) ((uint)(ulong)(p))
#endif
#define TILES_DECL \
    __local uint tiles[2 * GA_STAGE / 4] __attribute__((aligned(16))); \
    const uint sb = SHARED_ADDR(tiles);
#define T_A(it) (sb + (it) % 2 * GA_STAGE)
#define T_B(it) (sb + (it) % 2 * GA_STAGE + BT * SKB)
#define S_A SKB
#define S_B SVB
#else
#define TILES_DECL \
    __local TILE_T ta[BT * QS] __attribute__((aligned(16))); \
    __local TILE_T tb[BT * VS] __attribute__((aligned(16))); \
    __local TILE_T tat[D * TS] __attribute__((aligned(16))); \
    __local TILE_T tbt[DV * TS] __attribute__((aligned(16)));
#define T_A(it) ta
#define T_B(it) tb
#define S_A QS
#define S_B VS
#endif
// tile `it`'s rows of X (A: L = D, B: L = DV) at p (ld apart; zeros from row n on): by cp.async into its stage (GA), or
// stored, with its transposed copy where TR
#if defined(GA)
#define FILL_A(X, it, p, ld, n, TR) GA_ROWS(T_A(it), p, ld, D, SKB, n)
#define FILL_B(X, it, p, ld, n, TR) GA_ROWS(T_B(it), p, ld, DV, SVB, n)
#else
#define FILL_A(X, it, p, ld, n, TR) { \
    TILE_IN(X, ta, QS, p, ld, BT, D, n) \
    if (TR) TILE_IN_T(X, tat, TS, p, ld, BT, D, n) }
#define FILL_B(X, it, p, ld, n, TR) { \
    TILE_IN(X, tb, VS, p, ld, BT, DV, n) \
    if (TR) TILE_IN_T(X, tbt, TS, p, ld, BT, DV, n) }
#endif
// the head of each loop over tiles: (GA) tile it + 1's copies issued (NEXT, where there is one), tile it's waited for;
// else tile it stored now (NOW)
#if defined(GA)
#define TILE_TURN(more, NEXT, NOW) { \
    if (more) { NEXT } \
    PTX_COMMIT(); \
    PTX_WAIT(1); }
#define TILE_FIRST(some, NOW) { \
    if (some) { NOW } \
    PTX_COMMIT(); }
#else
#define TILE_TURN(more, NEXT, NOW) NOW
#define TILE_FIRST(some, NOW)
#endif

__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void attention_grad_mma_q(__global const OPT(Q)* q, ulong q_off, __global const OPT(K)* k, ulong k_off,
                          __global const OPT(V)* v, ulong v_off, __global const OPT(Y)* y, ulong y_off,
                          __global const OPT(G)* dy, ulong dy_off, __global const MASK_T* mask, ulong mask_off,
                          __global OPT(GQ)* dq, ulong dq_off, __global float* stats, ulong stats_off, int Tq, int Tk,
                          int Hq, int Hk, float scale, int causal_offset, long msb, long msh, long msq, long msk,
                          STRIDES3(q), STRIDES3(k), STRIDES3(v), STRIDES3(y), STRIDES3(dy), STRIDES3(dq)) {
    KERNEL_START
    const int i0 = get_group_id(0) * BR;
    const long bh = get_group_id(1), b = bh / Hq;
    const int h = bh % Hq;
    const long kvh = h / (Hq / Hk);
    const int nq = min(BR, Tq - i0);
    q += q_off + b * qsb + h * qsh + i0 * qst;
    y += y_off + b * ysb + h * ysh + i0 * yst;
    dy += dy_off + b * dysb + h * dysh + i0 * dyst;
    dq += dq_off + b * dqsb + h * dqsh + i0 * dqst;
    k += k_off + b * ksb + kvh * ksh;
    v += v_off + b * vsb + kvh * vsh;
    mask += mask_off + b * msb + h * msh;
    stats += stats_off + 2 * (bh * Tq + i0);
    const int w0 = lid / 32 * 16, r0 = w0 + g, r1 = r0 + 8;  // the warp's first row, this lane's two
    const bool ok0 = r0 < nq, ok1 = r1 < nq;
    uint qa[D / KSTEP][4], ga[DV / KSTEP][4];
    UNROLL for (int c = 0; c < D / KSTEP; c++) A_LOAD(Q, qa[c], q, qst, ok0, ok1, KSTEP * c)
    UNROLL for (int c = 0; c < DV / KSTEP; c++) A_LOAD(G, ga[c], dy, dyst, ok0, ok1, KSTEP * c)
    float d0 = 0.0f, d1 = 0.0f;  // rowsum(dy y): columns t, t + 4, ... here, then over the row's 4 lanes
    for (int c = t; c < DV; c += 4) {
        if (ok0) d0 += LD1(G, dy, r0 * dyst + c) * LD1(Y, y, r0 * yst + c);
        if (ok1) d1 += LD1(G, dy, r1 * dyst + c) * LD1(Y, y, r1 * yst + c);
    }
    d0 += shfl_xor(d0, 1); d0 += shfl_xor(d0, 2);
    d1 += shfl_xor(d1, 1); d1 += shfl_xor(d1, 2);
#if CAUSAL
    const int kv_end = min(Tk, i0 + nq + causal_offset);  // past the last key the block's last row sees
    const int warp_end = min(i0 + w0 + 16 + causal_offset, kv_end);  // ... and this warp's
#else
    const int kv_end = Tk, warp_end = Tk;
#endif
    const float scale2 = scale * M_LOG2E_F;
    float s[BT / 8][4];
    // pass 1: each row's maximum and sum of 2^z (base 2), online
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    TILE_FIRST(kv_end > 0, FILL_A(K, 0, k, kst, min(BT, Tk), 0))
    for (int k0 = 0, it = 0; k0 < kv_end; k0 += BT, it++) {
        const int nk = min(BT, Tk - k0);
        barrier(CLK_LOCAL_MEM_FENCE);
        TILE_TURN(k0 + BT < kv_end, FILL_A(K, it + 1, k + (k0 + BT) * kst, kst, min(BT, Tk - k0 - BT), 0),
                  FILL_A(K, it, k + k0 * kst, kst, nk, 0))
        barrier(CLK_LOCAL_MEM_FENCE);
        if (SKIP(w0 >= nq || k0 >= warp_end)) continue;
        ZERO(s, BT / 8)
        PRODUCT_R(s, qa, T_A(it), S_A, BT / 8, D)
        const bool full = !MASK && nk == BT && (!CAUSAL || k0 + BT <= i0 + w0 + 1 + causal_offset);
        float top0 = m0, top1 = m1;
        UNROLL for (int j = 0; j < BT / 8; j++)
            UNROLL for (int e = 0; e < 4; e++) {
                const int key = k0 + 8 * j + 2 * t + (e & 1), i = i0 + (e < 2 ? r0 : r1);
                s[j][e] = full ? s[j][e] * scale2 : Z(s[j][e], mask, i, key, key < Tk && i < Tq);
                if (e < 2) top0 = fmax(top0, s[j][e]); else top1 = fmax(top1, s[j][e]);
            }
        top0 = fmax(top0, shfl_xor(top0, 1)); top0 = fmax(top0, shfl_xor(top0, 2));
        top1 = fmax(top1, shfl_xor(top1, 1)); top1 = fmax(top1, shfl_xor(top1, 2));
        const float mu0 = top0 == -INFINITY ? 0.0f : top0, mu1 = top1 == -INFINITY ? 0.0f : top1;
        l0 *= ex2(m0 - mu0); l1 *= ex2(m1 - mu1);
        UNROLL for (int j = 0; j < BT / 8; j++) {
            l0 += ex2(s[j][0] - mu0) + ex2(s[j][1] - mu0);
            l1 += ex2(s[j][2] - mu1) + ex2(s[j][3] - mu1);
        }
        m0 = top0; m1 = top1;
    }
    l0 += shfl_xor(l0, 1); l0 += shfl_xor(l0, 2);
    l1 += shfl_xor(l1, 1); l1 += shfl_xor(l1, 2);
    const float lse0 = l0 > 0.0f ? m0 + log2(l0) : INFINITY, lse1 = l1 > 0.0f ? m1 + log2(l1) : INFINITY;
    if (t == 0 && ok0) { stats[2 * r0] = lse0 * M_LN2_F; stats[2 * r0 + 1] = d0; }
    if (t == 0 && ok1) { stats[2 * r1] = lse1 * M_LN2_F; stats[2 * r1 + 1] = d1; }
    // pass 2: dq
    float acc[D / 8][4], dp[BT / 8][4];
    ZERO(acc, D / 8)
    barrier(CLK_LOCAL_MEM_FENCE);  // (every warp done with pass 1's tiles)
    TILE_FIRST(kv_end > 0, FILL_A(K, 0, k, kst, min(BT, Tk), 1) FILL_B(V, 0, v, vst, min(BT, Tk), 0))
    for (int k0 = 0, it = 0; k0 < kv_end; k0 += BT, it++) {
        const int nk = min(BT, Tk - k0);
        barrier(CLK_LOCAL_MEM_FENCE);
        TILE_TURN(k0 + BT < kv_end,
                  FILL_A(K, it + 1, k + (k0 + BT) * kst, kst, min(BT, Tk - k0 - BT), 1)
                  FILL_B(V, it + 1, v + (k0 + BT) * vst, vst, min(BT, Tk - k0 - BT), 0),
                  FILL_A(K, it, k + k0 * kst, kst, nk, 1) FILL_B(V, it, v + k0 * vst, vst, nk, 0))
        barrier(CLK_LOCAL_MEM_FENCE);
        if (SKIP(w0 >= nq || k0 >= warp_end)) continue;
        ZERO(s, BT / 8)
        PRODUCT_R(s, qa, T_A(it), S_A, BT / 8, D)
        ZERO(dp, BT / 8)
        PRODUCT_R(dp, ga, T_B(it), S_B, BT / 8, DV)
        const bool full = !MASK && nk == BT && (!CAUSAL || k0 + BT <= i0 + w0 + 1 + causal_offset);
        UNROLL for (int j = 0; j < BT / 8; j++)
            UNROLL for (int e = 0; e < 4; e++) {
                const int key = k0 + 8 * j + 2 * t + (e & 1), i = i0 + (e < 2 ? r0 : r1);
                const float z = full ? s[j][e] * scale2 : Z(s[j][e], mask, i, key, key < Tk && i < Tq);
                dp[j][e] = ex2(z - (e < 2 ? lse0 : lse1)) * (dp[j][e] - (e < 2 ? d0 : d1));  // ds
            }
        PRODUCT_CT(acc, dp, T_A(it), S_A, tat, TS, D / 8, BT)
    }
    UNROLL for (int n = 0; n < D / 8; n++) {
        const int c = 8 * n + 2 * t;
        if (ok0) { ST1(GQ, acc[n][0] * scale, dq, r0 * dqst + c); ST1(GQ, acc[n][1] * scale, dq, r0 * dqst + c + 1); }
        if (ok1) { ST1(GQ, acc[n][2] * scale, dq, r1 * dqst + c); ST1(GQ, acc[n][3] * scale, dq, r1 * dqst + c + 1); }
    }
}

__kernel __attribute__((reqd_work_group_size(NT, 1, 1)))
void attention_grad_mma_kv(__global const OPT(Q)* q, ulong q_off, __global const OPT(K)* k, ulong k_off,
                           __global const OPT(V)* v, ulong v_off, __global const OPT(G)* dy, ulong dy_off,
                           __global const MASK_T* mask, ulong mask_off, __global const float* stats, ulong stats_off,
                           __global OPT(GK)* dk, ulong dk_off, __global OPT(GV)* dv, ulong dv_off, int Tq, int Tk,
                           int Hq, int Hk, float scale, int causal_offset, long msb, long msh, long msq, long msk,
                           STRIDES3(q), STRIDES3(k), STRIDES3(v), STRIDES3(dy), STRIDES3(dk), STRIDES3(dv)) {
    KERNEL_START
    __local float lses[BT], ds_[BT];  // the tile's rows' lse (base 2) and D
    const int j0 = get_group_id(0) * BR;
    const long bh = get_group_id(1), b = bh / Hk;
    const int hk = bh % Hk, group = Hq / Hk;
    const int nk = min(BR, Tk - j0);
    k += k_off + b * ksb + hk * ksh + j0 * kst;
    v += v_off + b * vsb + hk * vsh + j0 * vst;
    dk += dk_off + b * dksb + hk * dksh + j0 * dkst;
    dv += dv_off + b * dvsb + hk * dvsh + j0 * dvst;
    const int w0 = lid / 32 * 16, r0 = w0 + g, r1 = r0 + 8;  // the warp's first key, this lane's two
    const bool ok0 = r0 < nk, ok1 = r1 < nk;
    uint ka[D / KSTEP][4], va[DV / KSTEP][4];
    UNROLL for (int c = 0; c < D / KSTEP; c++) A_LOAD(K, ka[c], k, kst, ok0, ok1, KSTEP * c)
    UNROLL for (int c = 0; c < DV / KSTEP; c++) A_LOAD(V, va[c], v, vst, ok0, ok1, KSTEP * c)
    float dka[D / 8][4], dva[DV / 8][4], s[BT / 8][4], dp[BT / 8][4];
    ZERO(dka, D / 8)
    ZERO(dva, DV / 8)
    const float scale2 = scale * M_LOG2E_F;
    const int i_first = CAUSAL && j0 - causal_offset > 0 ? j0 - causal_offset : 0;  // the first row to see key j0
    // the tiles of query rows: `per` a q head of the group, head after head
    const int per = Tq > i_first ? (Tq - i_first + BT - 1) / BT : 0, count = group * per;
#define Q_AT(it) (q + q_off + b * qsb + (hk * group + (it) / per) * qsh + (i_first + (it) % per * BT) * qst)
#define G_AT(it) (dy + dy_off + b * dysb + (hk * group + (it) / per) * dysh + (i_first + (it) % per * BT) * dyst)
#define ROWS_AT(it) min(BT, Tq - i_first - (it) % per * BT)
    TILE_FIRST(count > 0, FILL_A(Q, 0, Q_AT(0), qst, ROWS_AT(0), 1) FILL_B(G, 0, G_AT(0), dyst, ROWS_AT(0), 1))
    for (int it = 0; it < count; it++) {
        const int h = hk * group + it / per, i0 = i_first + it % per * BT, nq = min(BT, Tq - i0);
        __global const float* st = stats + stats_off + 2 * ((b * Hq + h) * (long)Tq + i0);
        __global const MASK_T* mh = mask + mask_off + b * msb + h * msh;
        barrier(CLK_LOCAL_MEM_FENCE);
        TILE_TURN(it + 1 < count,
                  FILL_A(Q, it + 1, Q_AT(it + 1), qst, ROWS_AT(it + 1), 1)
                  FILL_B(G, it + 1, G_AT(it + 1), dyst, ROWS_AT(it + 1), 1),
                  FILL_A(Q, it, Q_AT(it), qst, nq, 1) FILL_B(G, it, G_AT(it), dyst, nq, 1))
        for (int e = lid; e < BT; e += NT) {
            lses[e] = e < nq ? st[2 * e] * M_LOG2E_F : INFINITY;  // (a row past Tq: p 0)
            ds_[e] = e < nq ? st[2 * e + 1] : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        if (SKIP(w0 >= nk || (CAUSAL && j0 + w0 > i0 + nq - 1 + causal_offset))) continue;
        ZERO(s, BT / 8)
        PRODUCT_R(s, ka, T_A(it), S_A, BT / 8, D)  // z^T: rows keys, columns queries
        // every key of the warp seen by every row of the tile (rows past Tq have lse +inf)
        const bool full = !MASK && (!CAUSAL || j0 + w0 + 15 <= i0 + causal_offset);
        UNROLL for (int j = 0; j < BT / 8; j++)
            UNROLL for (int e = 0; e < 4; e++) {
                const int col = 8 * j + 2 * t + (e & 1), key = j0 + (e < 2 ? r0 : r1);
                const float z = full ? s[j][e] * scale2 : Z(s[j][e], mh, i0 + col, key, col < nq && key < Tk);
                s[j][e] = ex2(z - lses[col]);  // p^T
            }
        ZERO(dp, BT / 8)
        PRODUCT_R(dp, va, T_B(it), S_B, BT / 8, DV)  // dp^T
        PRODUCT_CT(dva, s, T_B(it), S_B, tbt, TS, DV / 8, BT)
        UNROLL for (int j = 0; j < BT / 8; j++)
            UNROLL for (int e = 0; e < 4; e++)
                dp[j][e] = s[j][e] * (dp[j][e] - ds_[8 * j + 2 * t + (e & 1)]);  // ds^T
        PRODUCT_CT(dka, dp, T_A(it), S_A, tat, TS, D / 8, BT)
    }
    UNROLL for (int n = 0; n < D / 8; n++) {
        const int c = 8 * n + 2 * t;
        if (ok0) { ST1(GK, dka[n][0] * scale, dk, r0 * dkst + c); ST1(GK, dka[n][1] * scale, dk, r0 * dkst + c + 1); }
        if (ok1) { ST1(GK, dka[n][2] * scale, dk, r1 * dkst + c); ST1(GK, dka[n][3] * scale, dk, r1 * dkst + c + 1); }
    }
    UNROLL for (int n = 0; n < DV / 8; n++) {
        const int c = 8 * n + 2 * t;
        if (ok0) { ST1(GV, dva[n][0], dv, r0 * dvst + c); ST1(GV, dva[n][1], dv, r0 * dvst + c + 1); }
        if (ok1) { ST1(GV, dva[n][2], dv, r1 * dvst + c); ST1(GV, dva[n][3], dv, r1 * dvst + c + 1); }
    }
}
