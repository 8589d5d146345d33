/* The machine's fp32 FMA peak: independent FMA chains (enough to cover the FMA latency on every port) in AVX2
 * (8 floats) and AVX-512 (16 floats) registers, on 1 thread and on every thread given, best of 25 runs (the least
 * disturbed on a shared machine).
 *
 *     gcc -O3 -funroll-all-loops -mavx2 -mfma -mavx512f -fopenmp bench/probes/fma_peak.c -o /tmp/fma_peak && /tmp/fma_peak [threads]
 *
 * Prints GFLOP/s (2 flops per FMA lane). Zen 4 runs AVX-512 in two 256-bit halves, so its two widths should agree. */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#define CHAINS 12
#define ITERS 8000000L

static double now(void) { return omp_get_wtime(); }

__attribute__((noinline)) static float run256(long iters) {
    __m256 acc[CHAINS];
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < CHAINS; i++) acc[i] = _mm256_set1_ps((float)i);
    for (long n = 0; n < iters; n++)
        for (int i = 0; i < CHAINS; i++) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
    float s = 0.0f;
    for (int i = 0; i < CHAINS; i++) s += _mm256_cvtss_f32(acc[i]);
    return s;
}

__attribute__((noinline)) static float run512(long iters) {
    __m512 acc[CHAINS];
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_set1_ps((float)i);
    for (long n = 0; n < iters; n++)
        for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    float s = 0.0f;
    for (int i = 0; i < CHAINS; i++) s += _mm512_cvtss_f32(acc[i]);
    return s;
}

static double best(int threads, int width) {
    double top = 0.0;
    for (int rep = 0; rep < 25; rep++) {
        float sink = 0.0f;
        double t = now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
        sink += width == 8 ? run256(ITERS / 4) : run512(ITERS / 4);
        t = now() - t;
        double gf = 2.0 * width * CHAINS * (ITERS / 4) * threads / t * 1e-9;
        if (gf > top) top = gf;
        if (sink == 12345.0f) printf(" ");
    }
    return top;
}

int main(int argc, char** argv) {
    int threads = argc > 1 ? atoi(argv[1]) : omp_get_max_threads();
    printf("fp32 FMA peak, best of 25 (GFLOP/s)\n");
    printf("AVX2    1 thread  %7.1f   %d threads %7.1f\n", best(1, 8), threads, best(threads, 8));
    printf("AVX-512 1 thread  %7.1f   %d threads %7.1f\n", best(1, 16), threads, best(threads, 16));
    return 0;
}
