// Tensor-core GEMM core for NVIDIA Hopper GPUs: wgmma.mma_async m64n<TN>k16 on f16 A and B (F16), or m64n<TN>k8 on
// float A and B read as tf32 (TF32), fp32 accumulation in registers. A is k-contiguous ([M][K] rows), B too (B_NK:
// [N][K] rows, a weight stored transposed at load). F16 also takes A m-contiguous (A_ALONG_M: [K][M], a weight
// gradient's activations) and B n-contiguous (no B_NK: [K][N]), wgmma's transposed (MN-major) operands.
// NVIDIA's OpenCL C compiler targets sm_90, where ptxas rejects wgmma, but the driver builds sm_90a PTX given as a
// program binary. So each wgmma instruction sits in a PTX comment marked "// @WG " inside its inline asm (the compiler
// still wires its operands and keeps the accumulators in registers), and the program is built a second time from its
// PTX with the marks taken out and the target sm_90a (compile_worker.sm90a_ptx).
//
// Work-group: WG warpgroups of 128 work-items; warpgroup w owns rows 64 WGM w .. of the TM x TN tile, as WGM
// m64 blocks. Tiles come by 16-byte cp.async into __local memory in wgmma's K-major layout with the 128-byte
// swizzle: TK = 64 halves or 32 floats, so a row of a tile is one 128-byte line, its 16-byte chunk kc stored at chunk
// kc ^ (row % 8), 8-row groups 1024 bytes apart; a k step (k16 f16, k8 tf32) starts 32 bytes further along the lines.
// An MN-major tile is blocks of 64 rows (8192 bytes), each k of the slice one 128-byte line of a block's 64 halves,
// swizzled alike (chunk cm of line k at cm ^ (k % 8)); a k step starts 16 lines (2048 bytes) further.
// STAGES slices: at slice t the stage of slice t + WG_P is refilled, the one slice t + WG_P - STAGES was read from
// (every warpgroup has waited for all but its last WG_WAIT wgmma groups by then). TF32: wgmma drops each float's low 13 bits, so every work-item adds half a tf32 unit to the
// floats of A it copied (mma_tf32.cl's TF32_BITS: rounding to nearest, as the mma.sync cores round), slice t + 1's
// while slice t's wgmma runs; B too unless B_TF32 (a weight rounded so at load); A too unless A_TF32 (stored rounded
// by the kernel that made it: schedule's tf32_y).
// WG_WAIT (the tile's: 0 on 128 x 128, 1 on 128 x 256; 1 unless given): wgmma groups left running at the end of a
// slice; slices are copied WG_P = STAGES - 1 - WG_WAIT ahead.
// SPLITS > 1 (split-K, for grids too small to fill the device): group z = batch index * SPLITS + slice of K, whole
// slices of TK each; raw partial sums go to ws, and gemm_reduce.cl adds them and applies the epilogue.
// The including file gives KERNEL_NAME, LDSM_ARGS, PROLOGUE, PTR_A(m, k), PTR_B(k, n), STORE2(m, n, v0, v1) and
// WGMMA(d, da, db) (emitter.wgmma_macro: d += A B for one k step of a warpgroup's m64 block, by descriptors).
// M, NN, KK are the product's extents; every row of A and B starts 16-byte aligned and KK is a multiple of 8 (f16)
// or 4 (tf32).
#if defined(F16)
#define WG_EB 2
#elif defined(TF32)
#define WG_EB 4
#endif
#if !defined(TM) || !defined(TN) || !defined(WG) || !defined(STAGES) || !defined(WG_EB) || TK * WG_EB != 128 || \
    TM % (64 * WG)
#error "gemm_wgmma.cl needs TM TN WG STAGES, F16 or TF32, rows of 128 bytes (TK) and TM a multiple of 64 WG"
#endif
#if (defined(A_ALONG_M) || !defined(B_NK)) && !defined(F16)
#error "gemm_wgmma.cl: wgmma transposes f16 operands only (A_ALONG_M, B without B_NK)"
#endif
#define WG_CE (16 / WG_EB)
#ifndef SPLITS
#define SPLITS 1
#endif
#if SPLITS > 1
#undef ZID
#define ZID (get_group_id(2) / SPLITS)
#define WG_STORE2(m, n, v0, v1) { \
    ws[((long)get_group_id(2) * M + (m)) * NN + (n)] = (v0); \
    if ((n) + 1 < NN) ws[((long)get_group_id(2) * M + (m)) * NN + (n) + 1] = (v1); }
#else
#define WG_STORE2 STORE2
#endif
#define WG_THREADS (128 * WG)
#define WGM (TM / (64 * WG))
#define WG_A_BYTES (TM * 128)
#define WG_STAGE_BYTES ((TM + TN) * 128)
#define WG_TILE_OFF(r, kc) ((r) * 128 + (((kc) ^ ((r) & 7)) << 4))

// a 128-byte-swizzled operand at shared address `addr`: start >> 4, the leading and stride byte offsets >> 4: K-major
// (lbo unused, 1) 1024 bytes between groups of 8 rows; MN-major 8192 bytes between 64-row blocks and 1024 between
// groups of 8 k lines
inline ulong wg_desc(uint addr, uint lbo, uint sbo) {
    return (ulong)((addr & 0x3FFFF) >> 4) | ((ulong)lbo << 16) | ((ulong)sbo << 32) | (1ul << 62);
}
#define WG_MN_LBO (8192 >> 4)
#define WG_MN_SBO (1024 >> 4)
#if defined(A_ALONG_M)  // the descriptor of k step s of m64 block b of the A tile at `st`
#define WG_DESC_A(st, b, s) wg_desc((st) + (b) * 8192 + (s) * 2048, WG_MN_LBO, WG_MN_SBO)
#else
#define WG_DESC_A(st, b, s) wg_desc((st) + (b) * 8192 + (s) * 32, 1, 1024 >> 4)
#endif
#if defined(B_NK)
#define WG_DESC_B(st, s) wg_desc((st) + (s) * 32, 1, 1024 >> 4)
#else
#define WG_DESC_B(st, s) wg_desc((st) + (s) * 2048, WG_MN_LBO, WG_MN_SBO)
#endif

// A slice's copies. Work-item tid copies chunks tid, tid + WG_THREADS, ... of each tile: in a K-major tile chunk c is
// chunk c % 8 of row c / 8 (a row's 8 from consecutive work-items), in an MN-major one (F16) chunk c % (ROWS / 8) of
// k line c / (ROWS / 8) at (cm / 8) * 8192 + kr * 128 + ((cm % 8) ^ (kr % 8)) * 16. Either way a work-item's chunks
// are a fixed global step and a fixed shared step apart and keep their swizzle, so where the slice lies inside the
// product (WG_FAST_COPY) each is one add from its first, set once before the K loop (WG_SETUP: first address at k 0, its
// shared offset, the steps, elements per k); at the edges (WG_ISSUE_ROWS / _MN) each chunk is clamped and
// zero-filled where it leaves the product.
#if WG_THREADS / 8 % 8 || WG_THREADS / (TM / 8) % 8 || WG_THREADS / (TN / 8) % 8
#error "gemm_wgmma.cl: a work-item's chunks must keep their swizzle (WG_THREADS / 8, / (TM / 8), / (TN / 8))"
#endif
#define WG_SETUP_ROWS(X, ROWS, PTR, r0) \
    const __global X##_T* X##_g = PTR((r0) + tid / 8, tid % 8 * WG_CE); \
    const long X##_step = PTR(WG_THREADS / 8, 0) - PTR(0, 0), X##_k1 = PTR(0, 1) - PTR(0, 0); \
    const uint X##_s = WG_TILE_OFF(tid / 8, tid % 8), X##_ss = WG_THREADS / 8 * 128;
#define WG_SETUP_MN(X, ROWS, PTR, r0) \
    const int X##_c = tid % (ROWS / 8), X##_l = tid / (ROWS / 8); \
    const __global X##_T* X##_g = PTR((r0) + X##_c * 8, X##_l); \
    const long X##_step = PTR(0, WG_THREADS / (ROWS / 8)) - PTR(0, 0), X##_k1 = PTR(0, 1) - PTR(0, 0); \
    const uint X##_s = X##_c / 8 * 8192 + X##_l * 128 + (((X##_c % 8) ^ (X##_l % 8)) << 4), \
        X##_ss = WG_THREADS / (ROWS / 8) * 128;
#define WG_FAST_COPY(X, ROWS, dst) { \
    const __global X##_T* g_ = X##_g + k0 * X##_k1; \
    _Pragma("unroll") for (int i = 0; i < ROWS * 8 / WG_THREADS; i++) \
        PTX_CP16((dst) + X##_s + i * X##_ss, g_ + i * X##_step, 16); }
#define WG_ISSUE_ROWS(ROWS, dst, PTR, r0, R) \
    for (int c = tid; c < ROWS * 8; c += WG_THREADS) { \
        const int r = c / 8, kc = c % 8, row = (r0) + r, k = k0 + kc * WG_CE; \
        PTX_CP16((dst) + WG_TILE_OFF(r, kc), PTR(min(row, (R) - 1), min(k, KK - WG_CE)), \
                (row < (R) && k < KK) ? min(16, WG_EB * (KK - k)) : 0); }
#define WG_ISSUE_MN(ROWS, dst, PTR, r0, R) \
    for (int c = tid; c < ROWS * 8; c += WG_THREADS) { \
        const int kr = c / (ROWS / 8), cm = c % (ROWS / 8), row = (r0) + cm * 8, k = k0 + kr; \
        const bool in_ = row < (R) && k < KK; \
        PTX_CP16((dst) + cm / 8 * 8192 + kr * 128 + (((cm % 8) ^ (kr % 8)) << 4), PTR(in_ ? row : 0, in_ ? k : 0), \
                in_ ? min(16, 2 * ((R) - row)) : 0); }
#if defined(A_ALONG_M)
#define WG_ISSUE_A WG_ISSUE_MN
#define WG_SETUP_A WG_SETUP_MN
#else
#define WG_ISSUE_A WG_ISSUE_ROWS
#define WG_SETUP_A WG_SETUP_ROWS
#endif
#if defined(B_NK)
#define WG_ISSUE_B WG_ISSUE_ROWS
#define WG_SETUP_B WG_SETUP_ROWS
#else
#define WG_ISSUE_B WG_ISSUE_MN
#define WG_SETUP_B WG_SETUP_MN
#endif
#ifndef WG_WAIT
#define WG_WAIT 1
#endif
#define WG_P (STAGES - 1 - WG_WAIT)
#if defined(TF32) && !(defined(A_TF32) && defined(B_TF32))
#define WG_ROUNDS
// half a tf32 unit onto every float of the stage at byte offset `so` that this work-item copied (its copies landed)
#define WG_ROUND_ROWS(ROWS, so) \
    for (int c = tid; c < ROWS * 8; c += WG_THREADS) { \
        __local uint4* p_ = (__local uint4*)((__local char*)smem + (so) + WG_TILE_OFF(c / 8, c % 8)); \
        *p_ += (uint4)(0x1000u); }
#if defined(B_TF32)
#define WG_ROUND(so) WG_ROUND_ROWS(TM, so)
#elif defined(A_TF32)
#define WG_ROUND(so) WG_ROUND_ROWS(TN, (so) + WG_A_BYTES)
#else
#define WG_ROUND(so) { WG_ROUND_ROWS(TM, so) WG_ROUND_ROWS(TN, (so) + WG_A_BYTES) }
#endif
#endif
#define WG_PTR_A(m, k) PTR_A(m, k)
#define WG_PTR_B(n, k) PTR_B(k, n)
#define WG_ISSUE(st, k0_) { \
    const int k0 = (k0_); \
    if (m0 + TM <= M && n0 + TN <= NN && k0 + TK <= KK) { \
        WG_FAST_COPY(A, TM, st) \
        WG_FAST_COPY(B, TN, (st) + WG_A_BYTES) \
    } else { \
        WG_ISSUE_A(TM, st, WG_PTR_A, m0, M) \
        WG_ISSUE_B(TN, (st) + WG_A_BYTES, WG_PTR_B, n0, NN) \
    } }

__kernel __attribute__((reqd_work_group_size(WG_THREADS, 1, 1)))
void KERNEL_NAME(LDSM_ARGS) {
    PROLOGUE
    __local uint smem[STAGES * WG_STAGE_BYTES / 4] __attribute__((aligned(1024)));
    const uint sbase = (uint)(ulong)smem;
    const int tid = get_local_id(0), wg = tid / 128;
    TILE_ORIGIN(m0, n0)
    WG_SETUP_A(A, TM, WG_PTR_A, m0)
    WG_SETUP_B(B, TN, WG_PTR_B, n0)
    float acc[WGM][TN / 2];
    #pragma unroll
    for (int i = 0; i < WGM; i++)
        #pragma unroll
        for (int j = 0; j < TN / 2; j++)
            acc[i][j] = 0.0f;
    ws += ws_off;
    const int kchunk = (KK + SPLITS * TK - 1) / (SPLITS * TK) * TK, kbeg = get_group_id(2) % SPLITS * kchunk;
    const int ntiles = max(0, (min(KK, kbeg + kchunk) - kbeg + TK - 1) / TK);
    for (int s = 0; s < WG_P; s++) {
        if (s < ntiles) WG_ISSUE(sbase + s * WG_STAGE_BYTES, kbeg + s * TK)
        PTX_COMMIT();
    }
#if defined(WG_ROUNDS)
    PTX_WAIT(WG_P - 1);
    WG_ROUND(0)
#endif
    for (int tt = 0; tt < ntiles; tt++) {
        // slice tt has landed (one group committed a slice, empty or not; TF32: and was rounded); the copies are made
        // visible to the async proxy wgmma reads through, then to every warpgroup
#if !defined(WG_ROUNDS)
        PTX_WAIT(WG_P - 1);
#endif
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        barrier(CLK_LOCAL_MEM_FENCE);
        const int tn = tt + WG_P;
        if (tn < ntiles) WG_ISSUE(sbase + (tn % STAGES) * WG_STAGE_BYTES, kbeg + tn * TK)
        PTX_COMMIT();
        const uint st = sbase + (tt % STAGES) * WG_STAGE_BYTES;
        asm volatile("// @WG wgmma.fence.sync.aligned;" ::: "memory");
        #pragma unroll
        for (int s = 0; s < 4; s++) {
            const ulong db = WG_DESC_B(st + WG_A_BYTES, s);
            #pragma unroll
            for (int i = 0; i < WGM; i++) {
                const ulong da = WG_DESC_A(st, wg * WGM + i, s);
                WGMMA(acc[i], da, db);
            }
        }
        asm volatile("// @WG wgmma.commit_group.sync.aligned;" ::: "memory");
#if defined(WG_ROUNDS)
        if (tt + 1 < ntiles) {  // (slice tt + 1 landed, rounded while slice tt's products run)
            PTX_WAIT(WG_P - 1);
            WG_ROUND((tt + 1) % STAGES * WG_STAGE_BYTES)
        }
#endif
        asm volatile("// @WG wgmma.wait_group.sync.aligned " PTX_STR(WG_WAIT) ";" ::: "memory");
    }
    asm volatile("// @WG wgmma.wait_group.sync.aligned 0;" ::: "memory");
    PTX_WAIT(0);
    // D fragments (m64nN, f32): warp q of a warpgroup holds rows 16 q + g (+ 8); n8 block j columns 8 j + 2 t (+ 1)
    const int q = tid % 128 / 32, g = tid % 32 / 4, t = tid % 4;
#if defined(Y_ROWS8) && SPLITS == 1
    // The tile goes out through __local memory (the stages, free now): each work-item writes its fragments there as
    // float2s, then each writes rows' runs of 8 columns, one 16-byte store (half) or two (float) each (gemm.cl's
    // STORE8), a warp's stores covering whole lines, where the fragments' own stores are 4 or 8 bytes in each of 8
    // rows. Staged rows are WG_YS floats apart: a half-warp's float2 writes (rows g .. g + 3) and a quarter-warp's
    // float4 reads meet distinct banks.
#define WG_YS (TN + 8)
#if TM * WG_YS * 4 > STAGES * WG_STAGE_BYTES
#error "gemm_wgmma.cl: the staged tile does not fit the stages"
#endif
    __local float* ys = (__local float*)smem;
    barrier(CLK_LOCAL_MEM_FENCE);  // (every warpgroup's wgmma done reading the stages)
    #pragma unroll
    for (int i = 0; i < WGM; i++) {
        const int r = (wg * WGM + i) * 64 + q * 16 + g;
        #pragma unroll
        for (int j = 0; j < TN / 8; j++) {
            *(__local float2*)(ys + r * WG_YS + j * 8 + 2 * t) = (float2)(acc[i][4 * j], acc[i][4 * j + 1]);
            *(__local float2*)(ys + (r + 8) * WG_YS + j * 8 + 2 * t) = (float2)(acc[i][4 * j + 2], acc[i][4 * j + 3]);
        }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    #pragma unroll 4
    for (int e = tid; e < TM * TN / 8; e += WG_THREADS) {
        const int r = e / (TN / 8), cb = e % (TN / 8) * 8, m = m0 + r, n = n0 + cb;
        if (m < M && n < NN) {
            __local const float4* p = (__local const float4*)(ys + r * WG_YS + cb);
            STORE8(m, n, ((float8)(p[0], p[1])));
        }
    }
#else
    #pragma unroll
    for (int i = 0; i < WGM; i++) {
        const int m = m0 + (wg * WGM + i) * 64 + q * 16 + g;
        #pragma unroll
        for (int j = 0; j < TN / 8; j++) {
            const int n = n0 + j * 8 + 2 * t;
            if (n < NN) {
                if (m < M) WG_STORE2(m, n, acc[i][4 * j], acc[i][4 * j + 1]);
                if (m + 8 < M) WG_STORE2(m + 8, n, acc[i][4 * j + 2], acc[i][4 * j + 3]);
            }
        }
    }
#endif
}
