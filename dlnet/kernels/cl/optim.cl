// Optimizer updates, one launch per parameter, arguments bound once. hp: the step's hyper-parameters (a small
// buffer the trainer rewrites each step); norms: each gradient's sum of squares, for clipping by global norm.
inline float clip_scale(__global const float* norms, int count, float max_norm) {
    if (max_norm <= 0.0f) return 1.0f;
    float s = 0.0f;
    for (int k = 0; k < count; k++) s += norms[k];
    const float c = max_norm / (sqrt(s) + 1e-6f);  // torch.nn.utils.clip_grad_norm_
    return c < 1.0f ? c : 1.0f;
}

__kernel void sumsq(__global const float* g, ulong g_off, long n, __global float* norms, int slot) {
    __local float part[256];
    const int lid = get_local_id(0);
    float acc = 0.0f;
    for (long i = lid; i < n; i += 256) { const float v = g[g_off + i]; acc = fma(v, v, acc); }
    part[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = 128; s > 0; s >>= 1) {
        if (lid < s) part[lid] += part[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) norms[slot] = part[0];
}

// hp: lr, momentum, dampening, weight_decay, nesterov, max_norm, first_step
__kernel void sgd(__global float* p, ulong p_off, __global const float* g, ulong g_off, __global float* buf,
                  __global const float* hp, __global const float* norms, int n_norms, long n) {
    const long i = get_global_id(0);
    if (i >= n) return;
    const float scale = clip_scale(norms, n_norms, hp[5]);
    const float lr = hp[0], mom = hp[1], damp = hp[2], wd = hp[3];
    float pi = p[p_off + i];
    float d = g[g_off + i] * scale + wd * pi;
    if (mom != 0.0f) {
        const float b = hp[6] != 0.0f ? d : mom * buf[i] + (1.0f - damp) * d;
        buf[i] = b;
        d = hp[4] != 0.0f ? d + mom * b : b;
    }
    p[p_off + i] = pi - lr * d;
}

// hp: lr, beta1, beta2, eps, weight_decay, 1 - beta1^t, 1 - beta2^t, decoupled (AdamW), max_norm
__kernel void adam(__global float* p, ulong p_off, __global const float* g, ulong g_off, __global float* m,
                   __global float* v, __global const float* hp, __global const float* norms, int n_norms, long n) {
    const long i = get_global_id(0);
    if (i >= n) return;
    const float scale = clip_scale(norms, n_norms, hp[8]);
    const float lr = hp[0], b1 = hp[1], b2 = hp[2], eps = hp[3], wd = hp[4];
    float pi = p[p_off + i];
    float d = g[g_off + i] * scale;
    if (hp[7] != 0.0f) pi *= 1.0f - lr * wd;
    else d += wd * pi;
    const float mi = b1 * m[i] + (1.0f - b1) * d;
    const float vi = b2 * v[i] + (1.0f - b2) * d * d;
    m[i] = mi;
    v[i] = vi;
    const float denom = sqrt(vi) / sqrt(hp[6]) + eps;
    p[p_off + i] = pi - (lr / hp[5]) * mi / denom;
}

__kernel void copy_state(__global float* dst, ulong dst_off, __global const float* src, ulong src_off, long n) {
    const long i = get_global_id(0);
    if (i < n) dst[dst_off + i] = src[src_off + i];
}
