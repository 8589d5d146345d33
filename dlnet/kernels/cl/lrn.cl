// Local response normalisation across channels (ONNX LRN): y = x / (bias + alpha/size * sum_{window} x^2)^beta.
__kernel void lrn(__global const float* x, ulong x_off, __global float* y, ulong y_off,
                  int C, long HW, int size, float alpha, float beta, float bias, long total) {
    const long i = get_global_id(0);
    if (i >= total) return;
    const long pix = i % HW; const long t = i / HW;
    const int c = t % C; const long n = t / C;
    x += x_off + n * C * HW + pix;
    const int lo = max(0, c - (size - 1) / 2), hi = min(C - 1, c + (size - 1) - (size - 1) / 2);
    float s = 0.0f;
    for (int k = lo; k <= hi; k++) { const float v = x[k * HW]; s += v * v; }
    y[y_off + i] = x[c * HW] / pow(bias + alpha / size * s, beta);
}
