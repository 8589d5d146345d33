// NVIDIA tensor cores from OpenCL C (inline PTX), for the tensor-core kernels (gemm_mma.cl, gemv_mma.cl,
// attention_mma.cl, gemm_ldsm.cl, gemm_wgmma.cl). Fragment layout
// of mma.sync m16n8k8 (PTX ISA), with g = lane / 4 and t = lane % 4: a0..a3 = A[g][t], A[g+8][t], A[g][t+4],
// A[g+8][t+4]; b0, b1 = B[t][g], B[t+4][g]; c0..c3 = C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1].
// Inputs reach the tensor cores as fp32 bits, so half a tf32 unit is added to each (TF32_BITS): the mma drops the
// low 13 bits, which then rounds to nearest. (Truncation alone biases the error, which grows with depth: resnet50
// 1.9e-2 against 5e-4.)
#define TF32_BITS(x) (as_uint(x) + 0x1000u)
// TF32X3 (precision "fp32" on the tensor cores, Options.fp32_tf32x3): each float operand x as hi + lo, hi = x rounded
// to tf32 (its low 13 bits cleared) and lo = x - hi (exact in fp32, which the mma truncates to tf32: 2^-21 of x at
// most, of either sign); a product a b is then a_lo b_hi + a_hi b_lo + a_hi b_hi (only a_lo b_lo, about 2^-22 of
// a b, is dropped), three mma for one, in fp32 accumulators: fp32's accuracy, not tf32's. TF32_SPLIT(r, lo) splits
// the fp32 bits r in place into hi and lo; an infinite x gives lo NaN (inf - inf), so such an operand gives NaN where
// fp32 gives +-inf. TF32_IN(x): the bits a core keeps of operand x until its mma (rounded, or whole for TF32_SPLIT).
// The tensor cores add an mma's products and C aligned to the largest and truncated: with the running sum as C,
// every later product lost bits (H200, 4096^3 against float64: 2.9e-5, cuBLAS's fp32 8.1e-7). So the three mma of one
// k step (or two) go into a sum started at zero (MMA_TF32_Z), which TF32X3_ADD then adds to the accumulators in fp32.
#if defined(TF32X3)
#define TF32_SPLIT(r, lo) { const float x_ = as_float(r); (r) = (as_uint(x_) + 0x1000u) & 0xffffe000u; \
                            (lo) = as_uint(x_ - as_float(r)); }
#define TF32_IN(x) as_uint(x)
#define MMA_TF32X3(t, ahi, alo, bhi, blo, first) { \
    if (first) MMA_TF32_Z(t, alo, bhi); else MMA_TF32(t, alo, bhi); \
    MMA_TF32(t, ahi, blo); MMA_TF32(t, ahi, bhi); }
#define TF32X3_ADD(acc, t) { acc[0] += t[0]; acc[1] += t[1]; acc[2] += t[2]; acc[3] += t[3]; }
// a warp's fragments of one k step split in place: a[MI][4] and b[NI][2] become the hi halves, alo / blo the lo ones
#define TF32_SPLIT_FRAGS(a, b, alo, blo) \
    _Pragma("unroll") for (int i = 0; i < MI; i++) \
        _Pragma("unroll") for (int q = 0; q < 4; q++) TF32_SPLIT(a[i][q], alo[i][q]) \
    _Pragma("unroll") for (int j = 0; j < NI; j++) { TF32_SPLIT(b[j][0], blo[j][0]) TF32_SPLIT(b[j][1], blo[j][1]) }
#else
#define TF32_IN(x) TF32_BITS(x)
#endif

#define MMA_TF32(d, a, b) \
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 " \
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};" \
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]) \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), \
                   "f"(d[0]), "f"(d[1]), "f"(d[2]), "f"(d[3]))
// ... with C = 0
#define MMA_TF32_Z(d, a, b) \
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 " \
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};" \
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]) \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(0.0f))
// f16 m16n8k16 (attention_mma.cl's F16 form): a0..a3 = A[g][2t..], A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..] and
// b0, b1 = B[2t..][g], B[2t+8..][g], each register two halves adjacent along k; c as above
#define MMA_F16(d, a, b0, b1) \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 " \
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};" \
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]) \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), \
                   "f"(d[0]), "f"(d[1]), "f"(d[2]), "f"(d[3]))
// d0 += a b and d1 += a b' (f16) for the two column blocks whose B fragments one ldmatrix (LDSM: ptx_lanes.cl's
// PTX_LDSM_X4 or PTX_LDSM_X4_T) brings from shared address addr
#define MMA_PAIR(LDSM, addr, a, d0, d1) { \
    uint b_[4]; \
    LDSM(b_, addr); \
    MMA_F16(d0, a, b_[0], b_[1]); \
    MMA_F16(d1, a, b_[2], b_[3]); }

// The TM x TN tile of a work-group of the tensor-core GEMM cores (gemm_ldsm.cl, gemm_wgmma.cl): its first row m0 and
// column n0. GROUP_M: work-groups in runs of GROUP_M along m (a column of tiles shares B's panel in L2 while it is hot)
#if defined(GROUP_M)
#define TILE_ORIGIN(m0, n0) \
    const int gn_ = get_num_groups(0), gm_ = get_num_groups(1), pid_ = get_group_id(1) * gn_ + get_group_id(0); \
    const int first_ = pid_ / (GROUP_M * gn_) * GROUP_M, rows_ = min(gm_ - first_, GROUP_M); \
    const int m0 = (first_ + pid_ % (GROUP_M * gn_) % rows_) * TM, n0 = pid_ % (GROUP_M * gn_) / rows_ * TN;
#else
#define TILE_ORIGIN(m0, n0) const int m0 = get_group_id(1) * TM, n0 = get_group_id(0) * TN;
#endif
