// Shared by the GPU GEMM cores (gemm_core.cl, gemm_mma.cl), which the including file follows with: split-K slicing,
// and which element of the A (TK x TM) and B (TK x TN) tiles each of the NTHREADS work-items fetches from global
// memory. A_ALONG_M / B_ALONG_K: A is contiguous along m, B along k (so neighbouring work-items read neighbours).
#if !defined(LOAD_A) || !defined(LOAD_B) || !defined(STORE) || !defined(PROLOGUE)
#error "the GEMM cores need LOAD_A LOAD_B STORE PROLOGUE"
#endif
#ifndef SPLITS
#define SPLITS 1
#endif
// Split-K (for grids too small to fill the device): group z = batch index * SPLITS + slice of K; each slice writes
// raw partial sums to ws, and KERNEL_NAME_reduce (gemm_reduce.cl) adds them and applies the epilogue.
#define ZID (get_group_id(2) / SPLITS)
#define K_SLICE \
    const int kslice = get_group_id(2) % SPLITS; \
    const int kchunk = (KK + SPLITS * TK - 1) / (SPLITS * TK) * TK; \
    const int kbeg = kslice * kchunk, kend = min(KK, kbeg + kchunk);
#define LA (TK * TM / NTHREADS)
#define LB (TK * TN / NTHREADS)
#ifdef A_ALONG_M
#define A_KK(e) ((e) / TM)
#define A_MM(e) ((e) % TM)
#else
#define A_KK(e) ((e) % TK)
#define A_MM(e) ((e) / TK)
#endif
#ifdef B_ALONG_K
#define B_KK(e) ((e) % TK)
#define B_NN(e) ((e) / TK)
#else
#define B_KK(e) ((e) / TN)
#define B_NN(e) ((e) % TN)
#endif
#define FETCH(k0) \
    for (int l = 0; l < LA; l++) { \
        const int e = tid + l * NTHREADS, m = m0 + A_MM(e), k = (k0) + A_KK(e); \
        ra[l] = (m < M && k < kend) ? (float)(LOAD_A(m, k)) : 0.0f; } \
    for (int l = 0; l < LB; l++) { \
        const int e = tid + l * NTHREADS, n = n0 + B_NN(e), k = (k0) + B_KK(e); \
        rb[l] = (n < NN && k < kend) ? (float)(LOAD_B(k, n)) : 0.0f; }
