// NVIDIA tensor cores from OpenCL C (inline PTX), for the tf32 kernels (gemm_mma.cl, gemv_mma.cl, attention_mma.cl). Fragment layout
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
