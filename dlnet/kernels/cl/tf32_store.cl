// Y_TF32 (schedule.tf32_producers: y is read by tf32 products alone, which then take it as it is): the kernel after
// this stores y rounded to the nearest tf32 (mma_tf32.cl's TF32_BITS, the low 13 bits then cleared), once, rather
// than every tile of those products rounding it again. TF32Y(v) of a float, TF32Y8(v) of a float8; else the identity.
#if defined(Y_TF32)
#define TF32Y(v) as_float((as_uint(v) + 0x1000u) & 0xFFFFE000u)
#define TF32Y8(v) as_float8((as_uint8(v) + 0x1000u) & 0xFFFFE000u)
#else
#define TF32Y(v) (v)
#define TF32Y8(v) (v)
#endif
