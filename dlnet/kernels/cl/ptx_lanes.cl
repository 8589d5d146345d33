// NVIDIA (inline PTX) helpers across a warp's lanes, for half pairs in registers and for copies into __local memory,
// for kernels that run on NVIDIA devices only (attention_mma.cl, add_layernorm.cl's add_layernorm_warp, gemm_ldsm.cl,
// gemm_wgmma.cl and gemm.cl's half stores from them): the driver has no cl_khr_fp16 built-ins.
#define PTX_STR_(x) #x
#define PTX_STR(x) PTX_STR_(x)
// 16 bytes from global src to shared address dst (a __local pointer as (uint)(ulong)) by cp.async around L1 (.cg);
// the bytes past nbytes are zeros (nbytes 0: nothing is read). Each thread commits groups of its copies and waits
// until at most n of its groups are in flight; a barrier then shows them to the work-group.
#define PTX_CP16(dst, src, nbytes) \
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(nbytes) : "memory")
#define PTX_COMMIT() asm volatile("cp.async.commit_group;" ::: "memory")
#define PTX_WAIT(n) asm volatile("cp.async.wait_group " PTX_STR(n) ";" ::: "memory")
// four 8 x 8 matrices of 16-bit elements from shared memory, lanes 8i .. 8i + 7 giving the row addresses (16 bytes
// each) of matrix i: r[i] holds its row lane / 4, elements 2 (lane % 4) and + 1 (.trans: column lane / 4, rows
// 2 (lane % 4) and + 1): an mma.sync operand fragment
#define PTX_LDSM_X4(r, addr) \
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];" \
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr))
#define PTX_LDSM_X4_T(r, addr) \
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];" \
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr))
// 2^x by ex2.approx.ftz (2 ulp; -inf gives 0)
inline float ex2(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

// two floats as a register of two halves (lo in the low 16 bits), rounded to nearest
inline uint pack_half2(float lo, float hi) {
    uint r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// ... and back: the halves of a register as floats (lo, hi)
inline float2 unpack_half2(uint x) {
    float lo, hi;
    asm("{ .reg .b16 l16, h16; mov.b32 {l16, h16}, %2; cvt.f32.f16 %0, l16; cvt.f32.f16 %1, h16; }"
        : "=f"(lo), "=f"(hi) : "r"(x));
    return (float2)(lo, hi);
}

// 8 halves at a 16-byte aligned p as floats, by one 16-byte load; and 8 floats stored so
inline float8 ld_half8(__global const half* p) {
    const uint4 w = *(__global const uint4*)p;
    return (float8)(unpack_half2(w.x), unpack_half2(w.y), unpack_half2(w.z), unpack_half2(w.w));
}

inline void st_half8(float8 v, __global half* p) {
    *(__global uint4*)p = (uint4)(pack_half2(v.s0, v.s1), pack_half2(v.s2, v.s3), pack_half2(v.s4, v.s5),
                                  pack_half2(v.s6, v.s7));
}

inline float shfl_xor(float v, int lanes) {
    float r;
    asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=f"(r) : "f"(v), "r"(lanes));
    return r;
}

// the sum of v over the warp's 32 lanes, in every lane
inline float warp_sum(float v) {
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += shfl_xor(v, o);
    return v;
}
