// LRN on CPU devices: y = x / (bias + alpha/size * sum_{window} x^2)^beta, one work-item per 8 pixels of one image
// walking every channel, so each out-of-line built-in call (PoCL) serves 8 outputs and no index is divided per
// element. d^-beta as exp2(-beta * log2(d)): PoCL's pow() took 3x as long (alexnet's two LRNs: 125 ms one work-item
// per output with pow, 21 ms per 8 pixels with pow, 8 ms with exp2/log2).
typedef float8 __attribute__((aligned(4))) float8u;

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void lrn_cpu(__global const float* x, ulong x_off, __global float* y, ulong y_off, int C, int HW, int size,
             float alpha, float beta, float bias) {
    const int p0 = get_global_id(0) * 8, n = get_global_id(1);
    x += x_off + (long)n * C * HW + p0;
    y += y_off + (long)n * C * HW + p0;
    const int before = (size - 1) / 2, after = (size - 1) - (size - 1) / 2;
    const float scale = alpha / size;
    if (p0 + 8 <= HW) {
        for (int c = 0; c < C; c++) {
            const int lo = c - before < 0 ? 0 : c - before, hi = c + after > C - 1 ? C - 1 : c + after;
            float8 s = (float8)(0.0f);
            for (int k = lo; k <= hi; k++) {
                const float8 v = *(__global const float8u*)(x + (long)k * HW);
                s += v * v;
            }
            const float8 r = exp2(-beta * log2((float8)(bias) + scale * s));
            *(__global float8u*)(y + (long)c * HW) = *(__global const float8u*)(x + (long)c * HW) * r;
        }
    } else {
        for (int e = 0; e < HW - p0; e++) {
            for (int c = 0; c < C; c++) {
                const int lo = c - before < 0 ? 0 : c - before, hi = c + after > C - 1 ? C - 1 : c + after;
                float s = 0.0f;
                for (int k = lo; k <= hi; k++) {
                    const float v = x[(long)k * HW + e];
                    s += v * v;
                }
                y[(long)c * HW + e] = x[(long)c * HW + e] * exp2(-beta * log2(bias + scale * s));
            }
        }
    }
}
