// Dropout with a counter-based hash: the mask is a pure function of (seed, salt, index), so the backward pass
// recomputes it instead of storing it. seed is a one-element buffer the trainer rewrites every step.
inline float dropout_uniform(uint seed, uint salt, ulong i) {
    uint h = seed * 0x9E3779B9u ^ salt * 0x85EBCA6Bu ^ (uint)i ^ (uint)(i >> 32) * 0xC2B2AE35u;
    h ^= h >> 16; h *= 0x7FEB352Du; h ^= h >> 15; h *= 0x846CA68Bu; h ^= h >> 16;
    h += (uint)i * 0x27D4EB2Fu;
    h ^= h >> 16; h *= 0x7FEB352Du; h ^= h >> 15; h *= 0x846CA68Bu; h ^= h >> 16;
    return (h >> 8) * (1.0f / 16777216.0f);
}

__kernel void dropout(__global const float* x, ulong x_off, __global const uint* seed, ulong seed_off,
                      __global float* y, ulong y_off, uint salt, float ratio, long total) {
    const long i = get_global_id(0);
    if (i >= total) return;
    const bool keep = dropout_uniform(seed[seed_off], salt, i) >= ratio;
    y[y_off + i] = keep ? x[x_off + i] / (1.0f - ratio) : 0.0f;
}
