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
#if defined(B_SAFE)
// B_SAFE: the including file's loads read 0 outside the matrix (rows past KK of its window table, columns past NN
// with a poisoned window corner), so its fetches need no bounds test: under one, a load through a table compiled
// to a branch around it (NVIDIA: each window load waited for its table entry, one after another); unconditional,
// all of a tile's loads are in flight at once. Split-K slices end on multiples of TK, so only the last tile of the
// last slice runs past KK. (Plain loads stay conditional: those compile to predicated loads.)
#define B_GUARD(ok, v) (float)(v)
#else
#define B_GUARD(ok, v) ((ok) ? (float)(v) : 0.0f)
#endif
#if defined(B_KROW) && defined(B_ALONG_K)
// B contiguous along k: every work-item fetches B elements of one row k = k0 + tid % TK (NTHREADS is a multiple of
// TK); the including file's B_KROW(k) works out once per tile what LOAD_BK(n) needs about row k (for a weight
// gradient: the image and window corner of pixel k), and LOAD_BK(n) reads column n of that row.
#define B_SETUP
#define FETCH_B(k0) { \
    const int bk_ = (k0) + tid % TK; B_KROW(bk_) \
    for (int l = 0; l < LB; l++) { \
        const int n = n0 + (tid + l * NTHREADS) / TK; \
        rb[l] = B_GUARD(n < NN && bk_ < kend, LOAD_BK(n)); } }
#elif defined(B_COLUMN) && !defined(B_ALONG_K)
// Every work-item fetches B elements of one column n = n0 + tid % TN (the cores' NTHREADS are multiples of TN):
// the including file's B_COLUMN(n) works out once, before the K loop, what LOAD_BC(k) needs about column n (for a
// convolution: the image and the input window), and LOAD_BC(k) reads row k of that column.
#define B_SETUP const int bn_ = n0 + tid % TN; B_COLUMN(bn_)
#define FETCH_B(k0) \
    for (int l = 0; l < LB; l++) { \
        const int k = (k0) + tid / TN + l * (NTHREADS / TN); \
        rb[l] = B_GUARD(bn_ < NN && k < kend, LOAD_BC(k)); }
#else
#define B_SETUP
#define FETCH_B(k0) \
    for (int l = 0; l < LB; l++) { \
        const int e = tid + l * NTHREADS, n = n0 + B_NN(e), k = (k0) + B_KK(e); \
        rb[l] = (n < NN && k < kend) ? (float)(LOAD_B(k, n)) : 0.0f; }
#endif
#if defined(A_KROW) && !defined(A_ALONG_M)
// A contiguous along k: the same per-row scheme as B_KROW, with A_KROW(k) and LOAD_AK(m)
#define FETCH_A(k0) { \
    const int ak_ = (k0) + tid % TK; A_KROW(ak_) \
    for (int l = 0; l < LA; l++) { \
        const int m = m0 + (tid + l * NTHREADS) / TK; \
        ra[l] = (m < M && ak_ < kend) ? (float)(LOAD_AK(m)) : 0.0f; } }
#else
#define FETCH_A(k0) \
    for (int l = 0; l < LA; l++) { \
        const int e = tid + l * NTHREADS, m = m0 + A_MM(e), k = (k0) + A_KK(e); \
        ra[l] = (m < M && k < kend) ? (float)(LOAD_A(m, k)) : 0.0f; }
#endif
#define FETCH(k0) FETCH_A(k0) FETCH_B(k0)
