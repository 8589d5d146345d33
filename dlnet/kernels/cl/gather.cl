// Gather along one axis of x viewed as [outer, axis_len, inner]; indices may be negative (from the end).
#if !defined(T) || !defined(IT)
#error "gather.cl needs T and IT"
#endif
// precision "fp16" (kernels/half.py): X_HALF / Y_HALF store the table / y in half (T is then float)
#if defined(X_HALF)
#define X_T half
#define LDX(i) vload_half(i, x)
#else
#define X_T T
#define LDX(i) x[i]
#endif
#if defined(Y_HALF)
#define Y_T half
#define STY(i, v) vstore_half(v, i, y)
#else
#define Y_T T
#define STY(i, v) y[i] = (v)
#endif
__kernel void gather(__global Y_T* y, ulong y_off, __global const X_T* x, ulong x_off, __global const IT* idx,
                     ulong idx_off, long n_idx, long axis_len, long inner, long total) {
    const long i = get_global_id(0);
    if (i >= total) return;
    const long in = i % inner; const long t = i / inner;
    const long j = t % n_idx; const long o = t / n_idx;
    long k = idx[idx_off + j];
    if (k < 0) k += axis_len;
    STY(y_off + i, (k >= 0 && k < axis_len) ? LDX(x_off + (o * axis_len + k) * inner + in) : (T)0);
}

// The gradient: dx[o, k, in] = sum over j with idx[j] == k of dy[o, j, in]  (deterministic, no atomics)
__kernel void gather_grad(__global T* dx, ulong dx_off, __global const T* dy, ulong dy_off, __global const IT* idx,
                          ulong idx_off, long n_idx, long axis_len, long inner, long total) {
    const long i = get_global_id(0);
    if (i >= total) return;
    const long in = i % inner; const long t = i / inner;
    const long k = t % axis_len; const long o = t / axis_len;
    T acc = 0;
    for (long j = 0; j < n_idx; j++) {
        long kj = idx[idx_off + j];
        if (kj < 0) kj += axis_len;
        if (kj == k) acc += dy[dy_off + (o * n_idx + j) * inner + in];
    }
    dx[dx_off + i] = acc;
}

// ... where the indices are few beside the table (an embedding's: 4096 token ids into 50257 rows, which gather_grad
// scans 4096 times per element): gather_grad_links writes each index's next occurrence of its value (links[j], -1
// at the last) and whether it is the value's first (links[n_idx + j]); gather_grad_zero zeroes dx; gather_grad_sum,
// one work-item per (o, j, in), sums dy along the chain of a first occurrence in increasing j, gather_grad's order,
// into its value's row. Indices out of range name no row.
#define NORM_INDEX(k) { if ((k) < 0) (k) += axis_len; }
__kernel void gather_grad_links(__global const IT* idx, ulong idx_off, long n_idx, long axis_len,
                                __global int* links) {
    const long j = get_global_id(0);
    if (j >= n_idx) return;
    long k = idx[idx_off + j];
    NORM_INDEX(k)
    int first = 1, next = -1;
    for (long jj = 0; jj < j && first; jj++) {
        long kk = idx[idx_off + jj];
        NORM_INDEX(kk)
        if (kk == k) first = 0;
    }
    for (long jj = j + 1; jj < n_idx && next < 0; jj++) {
        long kk = idx[idx_off + jj];
        NORM_INDEX(kk)
        if (kk == k) next = (int)jj;
    }
    links[j] = next;
    links[n_idx + j] = first;
}

__kernel void gather_grad_zero(__global T* dx, ulong dx_off, long total) {
    const long i = get_global_id(0);
    if (i < total) dx[dx_off + i] = 0;
}

__kernel void gather_grad_sum(__global T* dx, ulong dx_off, __global const T* dy, ulong dy_off,
                              __global const IT* idx, ulong idx_off, long n_idx, long axis_len, long inner,
                              long total, __global const int* links) {
    const long i = get_global_id(0);
    if (i >= total) return;
    const long in = i % inner; const long t = i / inner;
    const long j = t % n_idx; const long o = t / n_idx;
    long k = idx[idx_off + j];
    NORM_INDEX(k)
    if (!links[n_idx + j] || k < 0 || k >= axis_len) return;
    T acc = 0;
    for (long jj = j; jj >= 0; jj = links[jj]) acc += dy[dy_off + (o * n_idx + jj) * inner + in];
    dx[dx_off + (o * axis_len + k) * inner + in] = acc;
}
