// Optimizer updates over every trained parameter in one launch. The parameters live in the weight arena, their
// gradients in the activation arena and the optimizer's state in one arena per slot (exp_avg, ...), so a table of
// chunks addresses them all: row r = (parameter offset, gradient offset, state offset, elements), at most a few
// thousand elements of one tensor, and work-group r updates row r. hp: the step's hyper-parameters (a small buffer
// the trainer rewrites each step); scale: the factor clip_scale wrote (read only when hp[max_norm] > 0 or
// hp[LOSS_SCALE_AT] > 0) and the flag of a step to skip.
#ifndef LOCAL
#error "optim.cl needs -DLOCAL (work-group size, a power of two)"
#endif
#ifndef LOSS_SCALE_AT
#error "optim.cl needs -DLOSS_SCALE_AT (the index of the loss scale in hp; 0 there: no loss scaling)"
#endif
// fp16 training's dynamic loss scale (dlnet/optim/scaler.py): the gradients are hp[LOSS_SCALE_AT] times too large
#define LOSS_SCALED (hp[LOSS_SCALE_AT] > 0.0f)
// a step whose gradients hold an inf or NaN (clip_scale found it) updates nothing (GradScaler skips optimizer.step)
#define SKIP_STEP (LOSS_SCALED && scale[1] != 0.0f)

#define ROW (table + 4 * (long)get_group_id(0))

inline float local_sum(__local float* part, float acc) {
    const int lid = get_local_id(0);
    part[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = LOCAL / 2; s > 0; s >>= 1) {
        if (lid < s) part[lid] += part[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return part[0];
}

// partial[base + r] = sum of squares of row r's gradient chunk
__kernel __attribute__((reqd_work_group_size(LOCAL, 1, 1)))
void sumsq(__global const float* g, __global const long* table, __global float* partial, int base) {
    __local float part[LOCAL];
    __global const long* row = ROW;
    const long g_off = row[1];
    const int n = (int)row[3];
    float acc = 0.0f;
    for (int i = get_local_id(0); i < n; i += LOCAL) { const float v = g[g_off + i]; acc = fma(v, v, acc); }
    const float s = local_sum(part, acc);
    if (get_local_id(0) == 0) partial[base + get_group_id(0)] = s;
}

// scale[0] = the factor the update multiplies each gradient by: min(1, max_norm / (||g|| + 1e-6)) where clipping
// (torch.nn.utils.clip_grad_norm_), times 1 / the loss scale where the loss is scaled (GradScaler.unscale_, then the
// clipping of the unscaled gradient); scale[1] = 1 where the loss is scaled and a gradient is inf or NaN (the sum of
// squares is then not finite: it overflows only for gradients no step survives anyway); one work-group
__kernel __attribute__((reqd_work_group_size(LOCAL, 1, 1)))
void clip_scale(__global const float* partial, int count, __global const float* hp, int max_norm_at,
                __global float* scale) {
    __local float part[LOCAL];
    float acc = 0.0f;
    for (int i = get_local_id(0); i < count; i += LOCAL) acc += partial[i];
    const float s = local_sum(part, acc);
    if (get_local_id(0) == 0) {
        const float unscale = LOSS_SCALED ? 1.0f / hp[LOSS_SCALE_AT] : 1.0f;
        const float c = hp[max_norm_at] / (sqrt(s) * unscale + 1e-6f);
        scale[0] = (hp[max_norm_at] > 0.0f && c < 1.0f ? c : 1.0f) * unscale;
        scale[1] = LOSS_SCALED && !isfinite(s) ? 1.0f : 0.0f;
    }
}

// The updates walk a row's elements one per work-item in turn, or with VEC8 (CPUs: Options.optim_vectors) eight
// consecutive ones a work-item as one float8 (the row's last few one by one): PoCL then runs whole vector lanes. 2
// cores (EPYC, PoCL), Adam over 15.5M parameters: 68 -> 20 ms, the same values bit for bit (bench/probes/optim_cpu.py).
#define LD1(ptr, i) (ptr)[i]
#define ST1(val, ptr, i) ((ptr)[i] = (val))
#define LD8(ptr, i) vload8(0, (ptr) + (i))
#define ST8(val, ptr, i) vstore8((val), 0, (ptr) + (i))
#if defined(VEC8)
#define FOR_ELEMENTS(AT) \
    for (int i = 8 * (int)get_local_id(0); i < n; i += 8 * LOCAL) { \
        if (i + 8 <= n) AT(float8, LD8, ST8, i) \
        else for (int j = i; j < n; j++) AT(float, LD1, ST1, j) }
#else
#define FOR_ELEMENTS(AT) for (int i = get_local_id(0); i < n; i += LOCAL) AT(float, LD1, ST1, i)
#endif

// hp: lr, momentum, dampening, weight_decay, nesterov, max_norm, first_step; buf: the momentum arena (unused
// without momentum)
#define SGD_AT(T, LD, ST, i) { \
    const T pi = LD(p, i); \
    T d = LD(g, i) * c + wd * pi; \
    if (mom != 0.0f) { \
        const T b = hp[6] != 0.0f ? d : mom * LD(buf, i) + (1.0f - damp) * d; \
        ST(b, buf, i); \
        d = hp[4] != 0.0f ? d + mom * b : b; \
    } \
    ST(pi - lr * d, p, i); }
__kernel __attribute__((reqd_work_group_size(LOCAL, 1, 1)))
void sgd(__global float* p, __global const float* g, __global float* buf, __global const float* hp,
         __global const float* scale, __global const long* table) {
    __global const long* row = ROW;
    const int n = (int)row[3];
    if (SKIP_STEP) return;
    p += row[0]; g += row[1]; buf += row[2];
    const float c = hp[5] > 0.0f || LOSS_SCALED ? scale[0] : 1.0f;
    const float lr = hp[0], mom = hp[1], damp = hp[2], wd = hp[3];
    FOR_ELEMENTS(SGD_AT)
}

// hp: lr, beta1, beta2, eps, weight_decay, 1 - beta1^t, 1 - beta2^t, decoupled (AdamW), max_norm
#define ADAM_AT(T, LD, ST, i) { \
    T pi = LD(p, i); \
    T d = LD(g, i) * c; \
    if (decoupled) pi *= 1.0f - lr * wd; \
    else d += wd * pi; \
    const T mi = b1 * LD(m, i) + (1.0f - b1) * d; \
    const T vi = b2 * LD(v, i) + (1.0f - b2) * d * d; \
    ST(mi, m, i); \
    ST(vi, v, i); \
    ST(pi - step * mi / (sqrt(vi) / root2 + eps), p, i); }
__kernel __attribute__((reqd_work_group_size(LOCAL, 1, 1)))
void adam(__global float* p, __global const float* g, __global float* m, __global float* v,
          __global const float* hp, __global const float* scale, __global const long* table) {
    __global const long* row = ROW;
    const int n = (int)row[3];
    if (SKIP_STEP) return;
    p += row[0]; g += row[1]; m += row[2]; v += row[2];
    const float c = hp[8] > 0.0f || LOSS_SCALED ? scale[0] : 1.0f;
    const float lr = hp[0], b1 = hp[1], b2 = hp[2], eps = hp[3], wd = hp[4];
    const float step = lr / hp[5], root2 = sqrt(hp[6]);
    const int decoupled = hp[7] != 0.0f;
    FOR_ELEMENTS(ADAM_AT)
}

// row = (destination offset, source offset, unused, elements): BatchNormalization's running statistics
__kernel __attribute__((reqd_work_group_size(LOCAL, 1, 1)))
void copy_state(__global float* dst, __global const float* src, __global const long* table) {
    __global const long* row = ROW;
    const long dst_off = row[0], src_off = row[1];
    const int n = (int)row[3];
    for (int i = get_local_id(0); i < n; i += LOCAL) dst[dst_off + i] = src[src_off + i];
}
