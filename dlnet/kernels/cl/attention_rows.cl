// Rows of the head dim in float8 chunks, for the attention kernels that run a work-item per row (attention_cpu.cl,
// attention_grad.cl): D8 / DV8 chunks of a q / k and a v row, chunk8 (chunk8h: from half) loads with zeros past the
// row's end, hsum8 adds a chunk's lanes. MASK (0, 1 float added, 2 bool) and its element type MASK_T, CAUSAL and
// SOFTCAP come from the host (families/attention.py attention_geometry), as for every attention kernel.
#if !defined(D) || !defined(DV) || !defined(MASK) || !defined(MASK_T) || !defined(CAUSAL) || !defined(SOFTCAP)
#error "attention_rows.cl needs D, DV, MASK, MASK_T, CAUSAL and SOFTCAP"
#endif
#define D8 ((D + 7) / 8)
#define DV8 ((DV + 7) / 8)

typedef float8 __attribute__((aligned(4))) float8u;
// min of two ints without the built-in (PoCL calls it out of line, spilling the live vector registers around it)
#define IMIN(a, b) ((a) < (b) ? (a) : (b))

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

inline float hsum8(float8 a) {
    const float4 b = a.lo + a.hi;
    const float2 c = b.lo + b.hi;
    return c.x + c.y;
}
