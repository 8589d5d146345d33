// NVIDIA (inline PTX) helpers across a warp's lanes and for half pairs in registers, for kernels that run on NVIDIA
// devices only (attention_mma.cl, add_layernorm.cl's add_layernorm_warp, gemm.cl's half stores from gemm_ldsm.cl and
// gemm_wgmma.cl): the driver has no cl_khr_fp16 built-ins.

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
