// Tests (Options.mma_emulate): the PTX helpers that attention_grad_mma.cl takes from mma_tf32.cl (which comes first:
// its TF32_BITS and MMA_PAIR stay) and ptx_lanes.cl, on any OpenCL device. A warp's lanes exchange registers through __local memory between barriers (MMA_EMU_DECL, in
// the kernel), so every work-item must reach every call; the fragments are PTX's (mma.sync m16n8k16 f16 and m16n8k8
// tf32, whose operands keep their top 19 bits), the arithmetic float.
#define MMA_EMU
#define MMA_EMU_DECL __local uint emu_s[NT * 8];

inline float ex2(float x) {
    return exp2(x);
}

inline uint pack_half2(float lo, float hi) {
    ushort h[2];
    vstore_half_rte(lo, 0, (__private half*)h);
    vstore_half_rte(hi, 1, (__private half*)h);
    return (uint)h[0] | ((uint)h[1] << 16);
}

inline float emu_half(uint w, int hi) {
    const ushort x = (ushort)(w >> (16 * hi));
    return vload_half(0, (__private const half*)&x);
}

inline float emu_shfl(__local uint* s, float v, int lanes) {
    const int lid = get_local_id(0);
    barrier(CLK_LOCAL_MEM_FENCE);
    s[lid] = as_uint(v);
    barrier(CLK_LOCAL_MEM_FENCE);
    return as_float(s[lid ^ lanes]);
}
#define shfl_xor(v, lanes) emu_shfl(emu_s, (v), (lanes))

// d += A B for a warp: each lane's A (a0..a3) and B (b0, b1) registers go through s; lane (g, t) then makes its
// d0, d1 (row g, columns 2t, 2t + 1) and d2, d3 (row g + 8)
inline void emu_mma(__local uint* s, float* d, const uint* a, uint b0, uint b1, int f16) {
    const int lid = get_local_id(0), w = lid / 32 * 32, g = lid % 32 / 4, t = lid % 4;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = 0; i < 4; i++) s[lid * 8 + i] = a[i];
    s[lid * 8 + 4] = b0;
    s[lid * 8 + 5] = b1;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int e = 0; e < 4; e++) {
        const int row = g + 8 * (e / 2), col = 2 * t + (e & 1);
        float acc = d[e];
        if (f16) {  // a0, a1: rows g, g + 8 at k 2t, 2t + 1; a2, a3 at k + 8; b0: k 2t, 2t + 1 of column g; b1: k + 8
            for (int kk = 0; kk < 16; kk++)
                acc += emu_half(s[(w + 4 * (row % 8) + kk % 8 / 2) * 8 + row / 8 + 2 * (kk / 8)], kk & 1) *
                       emu_half(s[(w + 4 * col + kk % 8 / 2) * 8 + 4 + kk / 8], kk & 1);
        } else {  // a0, a1: rows g, g + 8 at k t; a2, a3 at k t + 4; b0: k t of column g; b1: k t + 4
            for (int kk = 0; kk < 8; kk++)
                acc += as_float(s[(w + 4 * (row % 8) + kk % 4) * 8 + row / 8 + 2 * (kk / 4)] & 0xffffe000u) *
                       as_float(s[(w + 4 * col + kk % 4) * 8 + 4 + kk / 4] & 0xffffe000u);
        }
        d[e] = acc;
    }
}
#undef MMA_F16
#undef MMA_TF32
#define MMA_F16(d, a, b0, b1) emu_mma(emu_s, (d), (a), (b0), (b1), 1)
#define MMA_TF32(d, a, b) emu_mma(emu_s, (d), (a), (b)[0], (b)[1], 0)

// cp.async and ldmatrix on the kernel's tile buffer `tiles`, shared addresses being byte offsets into it (GA)
inline void emu_cp16(__local uint* tiles, uint dst, __global const uchar* src, int nbytes) {
    vstore4(nbytes ? vload4(0, (__global const uint*)src) : (uint4)(0u), 0, (__local uint*)((__local uchar*)tiles + dst));
}
#define PTX_CP16(dst, src, nbytes) emu_cp16(tiles, (dst), (__global const uchar*)(src), (nbytes))
#define PTX_COMMIT()
#define PTX_WAIT(n)

// lanes 8i .. 8i + 7 give the row addresses of matrix i; r[i]: its row g, elements 2t, 2t + 1 (trans: its column g,
// rows 2t, 2t + 1)
inline void emu_ldsm(__local uint* s, __local const uint* tiles, uint* r, uint addr, int trans) {
    const int lid = get_local_id(0), w = lid / 32 * 32, g = lid % 32 / 4, t = lid % 4;
    __local const uchar* base = (__local const uchar*)tiles;
    barrier(CLK_LOCAL_MEM_FENCE);
    s[lid] = addr;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int i = 0; i < 4; i++)
        r[i] = trans ? (uint)*(__local const ushort*)(base + s[w + 8 * i + 2 * t] + 2 * g) |
                       (uint)*(__local const ushort*)(base + s[w + 8 * i + 2 * t + 1] + 2 * g) << 16
                     : *(__local const uint*)(base + s[w + 8 * i + g] + 4 * t);
}
#define PTX_LDSM_X4(r, addr) emu_ldsm(emu_s, tiles, (r), (addr), 0)
#define PTX_LDSM_X4_T(r, addr) emu_ldsm(emu_s, tiles, (r), (addr), 1)
