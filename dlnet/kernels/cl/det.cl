// Determinant of each N x N matrix (ONNX Det): Gaussian elimination with partial pivoting in private memory, one
// work-item per matrix (the matrices ONNX models take determinants of are small; N is capped where it is chosen).
#ifndef N
#error "det.cl needs N (the matrix size)"
#endif
__kernel void det(__global const float* x, ulong x_off, __global float* y, ulong y_off, long count) {
    const long m = get_global_id(0);
    if (m >= count) return;
    x += x_off + m * N * N;
    float a[N * N];
    for (int i = 0; i < N * N; i++) a[i] = x[i];
    float d = 1.0f;
    for (int c = 0; c < N; c++) {
        int p = c;
        for (int r = c + 1; r < N; r++)
            if (fabs(a[r * N + c]) > fabs(a[p * N + c])) p = r;
        if (a[p * N + c] == 0.0f) { d = 0.0f; break; }
        if (p != c) {
            for (int k = c; k < N; k++) { const float t = a[c * N + k]; a[c * N + k] = a[p * N + k]; a[p * N + k] = t; }
            d = -d;
        }
        d *= a[c * N + c];
        for (int r = c + 1; r < N; r++) {
            const float f = a[r * N + c] / a[c * N + c];
            for (int k = c + 1; k < N; k++) a[r * N + k] -= f * a[c * N + k];
        }
    }
    y[y_off + m] = d;
}
