// Inline float maths for CPU devices. PoCL calls its built-in exp, erf and tanh out of line, one element at a time
// (1 x 128 x 3072 floats: bias + exact GELU 10.7 ms, bias + tanh 6.2 ms, bias + Relu 0.05 ms), which also stops the
// vectoriser; these are plain multiply-adds and one division it vectorises. Ternaries, not fmin/fmax (built-ins
// too): a NaN fails every comparison, so it passes through each clamp to the result.
#ifndef DL_CPU_MATH
#define DL_CPU_MATH

// e^xc for xc in [log(FLT_MIN), log(FLT_MAX)] (the callers clamp): 2^n e^r, n = round(xc log2 e), r = xc - n ln 2 in
// two parts (Cephes' expf: within 2 ulp), 2^n as 2^(n/2) 2^(n - n/2), each normal for n in [-126, 128]
inline float dl_exp_clamped(float xc) {
    const float t = xc * 1.44269504088896341f + 0.5f;
    const int n = (int)t - (t < (float)(int)t);  // floor(t + 0.5) without the built-in
    const float fn = (float)n;
    float r = xc - fn * 0.693359375f;
    r = r + fn * 2.12194440e-4f;
    const float r2 = r * r;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r2 + r + 1.0f;
    const int h = n >> 1;
    return p * as_float((h + 127) << 23) * as_float((n - h + 127) << 23);
}

// e^x for x <= 0 (softmax's shifted scores): below -87.3 (results under float's normal range) 0, and -inf gives 0
inline float dl_exp_neg(float x) {
    const float e = dl_exp_clamped(x < -87.3f ? -87.3f : x);
    return x < -87.3f ? 0.0f : e;
}

// e^x for any x: above log(FLT_MAX) +inf, below log(FLT_MIN) 0, a NaN passes. A GELU's gradient (exp(-x^2 / 2) among
// erf's terms) called the built-in out of line: ViT's 394 x 3072 on 2 cores 14.4 ms a launch.
inline float dl_exp(float x) {
    const float e = dl_exp_clamped(x < -87.3365479f ? -87.3365479f : (x > 88.7228394f ? 88.7228394f : x));
    return x < -87.3365479f ? 0.0f : (x > 88.7228394f ? INFINITY : e);
}

// erf x: a rational approximation on [-4, 4] (odd over even polynomial, Eigen's and XLA's float erf: within 4.3e-7
// of math.erf on [-10, 10]); +-1 beyond.
inline float dl_erf(float x) {
    const float xc = x > 4.0f ? 4.0f : (x < -4.0f ? -4.0f : x);
    const float x2 = xc * xc;
    float p = -2.72614225801306e-10f;
    p = p * x2 + 2.77068142495902e-08f;
    p = p * x2 - 2.10102402082508e-06f;
    p = p * x2 - 5.69250639462346e-05f;
    p = p * x2 - 7.34990630326855e-04f;
    p = p * x2 - 2.95459980854025e-03f;
    p = p * x2 - 1.60960333262415e-02f;
    float q = -1.45660718464996e-05f;
    q = q * x2 - 2.13374055278905e-04f;
    q = q * x2 - 1.68282697438203e-03f;
    q = q * x2 - 7.37332916720468e-03f;
    q = q * x2 - 1.42647390514189e-02f;
    return xc * p / q;
}

// tanh x: a rational approximation on [-7.9, 7.9] (Eigen's float tanh: within 4e-7 of numpy's); +-1 beyond.
inline float dl_tanh(float x) {
    const float xc = x > 7.90531110763549805f ? 7.90531110763549805f : (x < -7.90531110763549805f ?
                                                                         -7.90531110763549805f : x);
    const float x2 = xc * xc;
    float p = -2.76076847742355e-16f;
    p = p * x2 + 2.00018790482477e-13f;
    p = p * x2 - 8.60467152213735e-11f;
    p = p * x2 + 5.12229709037114e-08f;
    p = p * x2 + 1.48572235717979e-05f;
    p = p * x2 + 6.37261928875436e-04f;
    p = p * x2 + 4.89352455891786e-03f;
    float q = 1.19825839466702e-06f;
    q = q * x2 + 1.18534705686654e-04f;
    q = q * x2 + 2.26843463243900e-03f;
    q = q * x2 + 4.89352518554385e-03f;
    return xc * p / q;
}
#endif
