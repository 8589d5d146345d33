// NVIDIA tensor cores from OpenCL C (inline PTX), for the tensor-core kernels (gemm_mma.cl, gemv_mma.cl,
// attention_mma.cl, gemm_ldsm.cl, gemm_wgmma.cl). Fragment layout
// of mma.sync m16n8k8 (PTX ISA), with g = lane / 4 and t = lane % 4: a0..a3 = A[g][t], A[g+8][t], A[g][t+4],
// A[g+8][t+4]; b0, b1 = B[t][g], B[t+4][g]; c0..c3 = C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1].
// Inputs reach the tensor cores as fp32 bits, so half a tf32 unit is added to each (TF32_BITS): the mma drops the
// low 13 bits, which then rounds to nearest. (Truncation alone biases the error, which grows with depth: resnet50
// 1.9e-2 against 5e-4.)
#define TF32_BITS(x) (as_uint(x) + 0x1000u)

#define MMA_TF32(d, a, b) \
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 " \
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};" \
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]) \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), \
                   "f"(d[0]), "f"(d[1]), "f"(d[2]), "f"(d[3]))
// f16 m16n8k16 (attention_mma.cl's F16 form): a0..a3 = A[g][2t..], A[g+8][2t..], A[g][2t+8..], A[g+8][2t+8..] and
// b0, b1 = B[2t..][g], B[2t+8..][g], each register two halves adjacent along k; c as above
#define MMA_F16(d, a, b0, b1) \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 " \
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%11,%12,%13};" \
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]) \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), \
                   "f"(d[0]), "f"(d[1]), "f"(d[2]), "f"(d[3]))

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
