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
// The epilogue: STORE_PRE(m, n) is what the store of row m adds from memory (C, a bias, a residual: EPI_T values),
// STORE_WITH(m, n, v, e) the store given it (and STORE_PRE_IN_COLUMN, STORE_WITH_IN_COLUMN so per column). The cores
// load those of a block of rows (gemm_mma.cl's EPI_ROWS, gemm_core.cl's WM or WN) before storing any: y may be the buffer they read, so a load the compiler
// finds after a store waits for it, a round trip to memory a row (tf32 wide_resnet50_2's 1x1 convolutions with a
// residual, one work-group of 4 warps a unit: 16 TFLOP/s).
#ifndef EPI_T
#define EPI_T float
#endif
#ifndef STORE_PRE
#define STORE_PRE(m, n) ((EPI_T)(0.0f))
#define STORE_WITH(m, n, v, e) STORE(m, n, v)
#endif
#if defined(STORE_COLUMN) && !defined(STORE_PRE_IN_COLUMN)
#define STORE_PRE_IN_COLUMN(m) ((EPI_T)(0.0f))
#define STORE_WITH_IN_COLUMN(m, v, e) STORE_IN_COLUMN(m, v)
#endif
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
#elif defined(B_COLUMN) && !defined(B_ALONG_K) && defined(BC_STEP)
// The same, where the including file's rows of one slice of TK are one window position, BC_STEP elements apart
// (a convolution's depth taken tap by tap): the slice's first row through BC_AT (its address and whether it lies
// inside the image), then the others at multiples of BC_STEP from it
// (BC_T, BC_LOAD: the element type and load of those addresses, the including file's where it stores B in half)
#ifndef BC_T
#define BC_T float
#define BC_LOAD(p, i) (p)[i]
#endif
#define B_SETUP const int bn_ = n0 + tid % TN; B_COLUMN(bn_)
#define FETCH_B(k0) { \
    __global const BC_T* p_; bool ok_; BC_AT((k0) + tid / TN, p_, ok_) \
    ok_ = ok_ && bn_ < NN && (k0) < kend; \
    for (int l = 0; l < LB; l++) \
        rb[l] = ok_ ? BC_LOAD(p_, (IDX)l * (NTHREADS / TN) * BC_STEP) : 0.0f; }
#elif defined(B_COLUMN) && defined(B_CVEC) && defined(STAGES)
#define B_SETUP const int bn_ = n0 + tid % (TN / 4) * 4; B_COLUMN(bn_)
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
#if defined(STAGES)
// Address form of the same fetches, for the tensor-core core (gemm_mma.cl): each element is copied by cp.async
// straight into __local memory (AS_AT, BS_AT), with no registers held. The including file gives the address of an
// element (PTR_A(m, k), PTR_B(k, n); per row or column PTR_AK(m), PTR_BC(k), or BK_AT(n, p, ok) / BC_AT(k, p, ok)
// where an element may lie in the padding). A copy whose `ok` is false writes zeros and reads nothing (cp.async's
// src-size 0). A_VEC: A contiguous along k, rows and base 16-byte aligned; A_MVEC: A contiguous along m (a weight
// gradient's activations), likewise, into gemm_mma.cl's k-major A tile; B_VEC: B contiguous along n, likewise;
// B_KVEC: B contiguous along k (a weight read [N, K] as stored), likewise, into gemm_mma.cl's n-major B tile: those
// copy 4 floats at once, the tail of a row zero-filled.
#if defined(MMA_EMULATED)
// (tests, rules.core_tiles on a device without PTX: each copy done at once, its tail zero-filled as cp.async's is)
#define CP_ASYNC4(dst, src, ok) (*(dst) = (ok) ? *(src) : 0.0f)
#define CP_ASYNC16(dst, src, nbytes) { \
    __local float* d_ = (dst); __global const float* s_ = (src); const int n_ = (nbytes) / 4; \
    for (int i_ = 0; i_ < 4; i_++) d_[i_] = i_ < n_ ? s_[i_] : 0.0f; }
#define CP_COMMIT()
#define CP_WAIT(n)
#else
#define CP_ASYNC4(dst, src, ok) \
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" \
                 :: "r"((uint)(ulong)(dst)), "l"(src), "r"((ok) ? 4 : 0) : "memory")
// (16-byte copies through L1, .ca: the tf32 core's GEMM ran 122-150 TFLOP/s at n = 2048-8192 against 104-125 with
// .cg, which bypasses it; vgg16 and resnet50 at batch 16 7% faster)
#define CP_ASYNC16(dst, src, nbytes) \
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" \
                 :: "r"((uint)(ulong)(dst)), "l"(src), "r"(nbytes) : "memory")
#define CP_COMMIT() asm volatile("cp.async.commit_group;" ::: "memory")
#define CP_STR_(x) #x
#define CP_STR(x) CP_STR_(x)
#define CP_WAIT(n) asm volatile("cp.async.wait_group " CP_STR(n) ";" ::: "memory")
#endif
#define CP_BYTES(left) (clamp((left), 0, 4) * 4)  // of 4 floats, those before the end
#if defined(B_SAFE)
#define B_OK(ok) true
#else
#define B_OK(ok) (ok)
#endif
#ifndef BK_AT
#define BK_AT(n, p, ok) { p = PTR_BK(n); ok = true; }
#endif
#ifndef BC_AT
#define BC_AT(k, p, ok) { p = PTR_BC(k); ok = true; }
#endif
#if defined(B_VEC)
#define ISSUE_B(buf, k0) \
    for (int l = 0; l < TK * TN / 4 / NTHREADS; l++) { \
        const int c = tid + l * NTHREADS, kk = c / (TN / 4), nn = c % (TN / 4) * 4, k = (k0) + kk, n = n0 + nn; \
        CP_ASYNC16(&BS_AT(buf, kk, nn), PTR_B(k, n), k < kend ? CP_BYTES(NN - n) : 0); }
#elif defined(B_CVEC)
// B's columns in runs of 4 contiguous ones, 16-byte aligned, that lie wholly inside or wholly past NN (a 1x1
// convolution whose images hold whole groups of 4 pixels): each work-item copies 4 columns of one row at once, its
// first column's B_COLUMN(n) worked out once (B_SETUP above)
#define ISSUE_B(buf, k0) \
    for (int l = 0; l < TK * TN / 4 / NTHREADS; l++) { \
        const int kk = tid / (TN / 4) + l * (NTHREADS / (TN / 4)), k = (k0) + kk; \
        CP_ASYNC16(&BS_AT(buf, kk, bn_ - n0), PTR_BC(k), k < kend && bn_ < NN ? 16 : 0); }
#elif defined(B_KVEC)
#define ISSUE_B(buf, k0) \
    for (int l = 0; l < TK * TN / 4 / NTHREADS; l++) { \
        const int c = tid + l * NTHREADS, nn = c / (TK / 4), kk = c % (TK / 4) * 4, k = (k0) + kk, n = n0 + nn; \
        CP_ASYNC16(&BS_AT(buf, kk, nn), PTR_B(k, n), n < NN ? CP_BYTES(kend - k) : 0); }
#elif defined(B_KROW) && defined(B_ALONG_K)
#define ISSUE_B(buf, k0) { \
    const int bk_ = (k0) + tid % TK; B_KROW(bk_) \
    for (int l = 0; l < LB; l++) { \
        const int e = tid + l * NTHREADS, n = n0 + e / TK; \
        __global const float* p_; bool ok_; BK_AT(n, p_, ok_) \
        CP_ASYNC4(&BS_AT(buf, B_KK(e), B_NN(e)), p_, ok_ && B_OK(n < NN && bk_ < kend)); } }
#elif defined(B_COLUMN) && !defined(B_ALONG_K) && defined(BC_STEP)
#define ISSUE_B(buf, k0) { \
    __global const float* p_; bool ok_; BC_AT((k0) + tid / TN, p_, ok_) \
    ok_ = ok_ && B_OK(bn_ < NN); \
    for (int l = 0; l < LB; l++) { \
        const int e = tid + l * NTHREADS; \
        CP_ASYNC4(&BS_AT(buf, B_KK(e), B_NN(e)), p_ + (IDX)l * (NTHREADS / TN) * BC_STEP, ok_); } }
#elif defined(B_COLUMN) && !defined(B_ALONG_K)
#define ISSUE_B(buf, k0) \
    for (int l = 0; l < LB; l++) { \
        const int e = tid + l * NTHREADS, k = (k0) + B_KK(e); \
        __global const float* p_; bool ok_; BC_AT(k, p_, ok_) \
        CP_ASYNC4(&BS_AT(buf, B_KK(e), B_NN(e)), p_, ok_ && B_OK(bn_ < NN && k < kend)); }
#else
#define ISSUE_B(buf, k0) \
    for (int l = 0; l < LB; l++) { \
        const int e = tid + l * NTHREADS, n = n0 + B_NN(e), k = (k0) + B_KK(e); \
        CP_ASYNC4(&BS_AT(buf, B_KK(e), B_NN(e)), PTR_B(k, n), n < NN && k < kend); }
#endif
#if defined(A_VEC)
#define ISSUE_A(buf, k0) \
    for (int l = 0; l < TK * TM / 4 / NTHREADS; l++) { \
        const int c = tid + l * NTHREADS, mm = c / (TK / 4), kk = c % (TK / 4) * 4, m = m0 + mm, k = (k0) + kk; \
        CP_ASYNC16(&AS_AT(buf, mm, kk), PTR_A(m, k), m < M ? CP_BYTES(kend - k) : 0); }
#elif defined(A_MVEC)
#define ISSUE_A(buf, k0) \
    for (int l = 0; l < TK * TM / 4 / NTHREADS; l++) { \
        const int c = tid + l * NTHREADS, kk = c / (TM / 4), mm = c % (TM / 4) * 4, k = (k0) + kk, m = m0 + mm; \
        CP_ASYNC16(&AS_AT(buf, mm, kk), PTR_A(m, k), k < kend ? CP_BYTES(M - m) : 0); }
#elif defined(A_KROW) && !defined(A_ALONG_M)
#define ISSUE_A(buf, k0) { \
    const int ak_ = (k0) + tid % TK; A_KROW(ak_) \
    for (int l = 0; l < LA; l++) { \
        const int e = tid + l * NTHREADS, m = m0 + e / TK; \
        CP_ASYNC4(&AS_AT(buf, A_MM(e), A_KK(e)), PTR_AK(m), m < M && ak_ < kend); } }
#else
#define ISSUE_A(buf, k0) \
    for (int l = 0; l < LA; l++) { \
        const int e = tid + l * NTHREADS, m = m0 + A_MM(e), k = (k0) + A_KK(e); \
        CP_ASYNC4(&AS_AT(buf, A_MM(e), A_KK(e)), PTR_A(m, k), m < M && k < kend); }
#endif
#define ISSUE(buf, k0) ISSUE_A(buf, k0) ISSUE_B(buf, k0)
#endif
