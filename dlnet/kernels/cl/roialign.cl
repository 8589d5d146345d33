// RoiAlign (ONNX 10/16): each output bin averages (or takes the max of) grid_h x grid_w bilinear samples of its
// region of x; one work-item per output element. Sampling and edge rules follow the ONNX reference (and
// onnxruntime): samples beyond [-1, size] count as 0, others clamp to the last row/column; "max" takes the
// largest of the four weighted corner terms of each sample, as both do.
#if !defined(ROI_AVG) && !defined(ROI_MAX)
#error "roialign.cl needs ROI_AVG or ROI_MAX"
#endif
__kernel void roialign(__global const float* x, ulong x_off, __global const float* rois, ulong rois_off,
                       __global const long* batch, ulong batch_off, __global float* y, ulong y_off,
                       int C, int H, int W, int OH, int OW, float scale, int sampling_ratio, int half_pixel,
                       long total) {
    const long i = get_global_id(0);
    if (i >= total) return;
    const int pw = i % OW; long t = i / OW;
    const int ph = t % OH; t /= OH;
    const int c = t % C; const long r = t / C;
    rois += rois_off + r * 4;
    x += x_off + (batch[batch_off + r] * C + c) * (long)H * W;
    const float offset = half_pixel ? 0.5f : 0.0f;
    const float x0 = rois[0] * scale - offset, y0 = rois[1] * scale - offset;
    float roi_w = rois[2] * scale - offset - x0, roi_h = rois[3] * scale - offset - y0;
    if (!half_pixel) { roi_w = fmax(roi_w, 1.0f); roi_h = fmax(roi_h, 1.0f); }
    const float bin_h = roi_h / OH, bin_w = roi_w / OW;
    const int grid_h = sampling_ratio > 0 ? sampling_ratio : (int)ceil(roi_h / OH);
    const int grid_w = sampling_ratio > 0 ? sampling_ratio : (int)ceil(roi_w / OW);
    float acc = 0.0f;
    bool first = true;
    for (int iy = 0; iy < grid_h; iy++) {
        float sy = y0 + ph * bin_h + (iy + 0.5f) * bin_h / grid_h;
        for (int ix = 0; ix < grid_w; ix++) {
            float sx = x0 + pw * bin_w + (ix + 0.5f) * bin_w / grid_w;
            float v = 0.0f;
            if (!(sy < -1.0f || sy > H || sx < -1.0f || sx > W)) {
                float yy = fmax(sy, 0.0f), xx = fmax(sx, 0.0f);
                int y_lo = (int)yy, x_lo = (int)xx, y_hi, x_hi;
                if (y_lo >= H - 1) { y_hi = y_lo = H - 1; yy = y_lo; } else { y_hi = y_lo + 1; }
                if (x_lo >= W - 1) { x_hi = x_lo = W - 1; xx = x_lo; } else { x_hi = x_lo + 1; }
                const float ly = yy - y_lo, lx = xx - x_lo, hy = 1.0f - ly, hx = 1.0f - lx;
                const float t1 = hy * hx * x[y_lo * W + x_lo], t2 = hy * lx * x[y_lo * W + x_hi];
                const float t3 = ly * hx * x[y_hi * W + x_lo], t4 = ly * lx * x[y_hi * W + x_hi];
#if defined(ROI_AVG)
                v = t1 + t2 + t3 + t4;
#else
                v = fmax(fmax(t1, t2), fmax(t3, t4));
#endif
            }
#if defined(ROI_AVG)
            acc += v;
#else
            acc = first ? v : fmax(acc, v);
            first = false;
#endif
        }
    }
#if defined(ROI_AVG)
    acc /= max(grid_h * grid_w, 1);
#endif
    y[y_off + i] = acc;
}

// dx += w * v at p, for bins of different rois that share pixels: a compare-and-swap loop on the float's bits (the
// order of the adds varies between runs, as torchvision's atomicAdd does; dx is zero-filled first)
inline void add_float(volatile __global float* p, float v) {
    union { unsigned int u; float f; } old, sum;
    do {
        old.f = *p;
        sum.f = old.f + v;
    } while (atomic_cmpxchg((volatile __global unsigned int*)p, old.u, sum.u) != old.u);
}

// RoiAlign's gradient: one work-item per output bin, its samples found as in roialign; avg spreads dy / samples
// over each sample's four corners by their bilinear weights, max gives dy * weight to the corner of the largest
// term (the first of equal ones; none where that is an outside sample).
__kernel void roialign_grad(__global const float* dy, ulong dy_off, __global const float* x, ulong x_off,
                            __global const float* rois, ulong rois_off, __global const long* batch, ulong batch_off,
                            __global float* dx, ulong dx_off, int C, int H, int W, int OH, int OW, float scale,
                            int sampling_ratio, int half_pixel, long total) {
    const long i = get_global_id(0);
    if (i >= total) return;
    const int pw = i % OW; long t = i / OW;
    const int ph = t % OH; t /= OH;
    const int c = t % C; const long r = t / C;
    const float g = dy[dy_off + i];
    rois += rois_off + r * 4;
    const long plane = (batch[batch_off + r] * C + c) * (long)H * W;
    x += x_off + plane;
    dx += dx_off + plane;
    const float offset = half_pixel ? 0.5f : 0.0f;
    const float x0 = rois[0] * scale - offset, y0 = rois[1] * scale - offset;
    float roi_w = rois[2] * scale - offset - x0, roi_h = rois[3] * scale - offset - y0;
    if (!half_pixel) { roi_w = fmax(roi_w, 1.0f); roi_h = fmax(roi_h, 1.0f); }
    const float bin_h = roi_h / OH, bin_w = roi_w / OW;
    const int grid_h = sampling_ratio > 0 ? sampling_ratio : (int)ceil(roi_h / OH);
    const int grid_w = sampling_ratio > 0 ? sampling_ratio : (int)ceil(roi_w / OW);
    const float share = g / max(grid_h * grid_w, 1);
    float best = 0.0f, best_w = 0.0f;
    long best_at = -1;
    bool first = true;
    for (int iy = 0; iy < grid_h; iy++) {
        float sy = y0 + ph * bin_h + (iy + 0.5f) * bin_h / grid_h;
        for (int ix = 0; ix < grid_w; ix++) {
            float sx = x0 + pw * bin_w + (ix + 0.5f) * bin_w / grid_w;
            float v = 0.0f, v_w = 0.0f;
            long v_at = -1;
            if (!(sy < -1.0f || sy > H || sx < -1.0f || sx > W)) {
                float yy = fmax(sy, 0.0f), xx = fmax(sx, 0.0f);
                int y_lo = (int)yy, x_lo = (int)xx, y_hi, x_hi;
                if (y_lo >= H - 1) { y_hi = y_lo = H - 1; yy = y_lo; } else { y_hi = y_lo + 1; }
                if (x_lo >= W - 1) { x_hi = x_lo = W - 1; xx = x_lo; } else { x_hi = x_lo + 1; }
                const float ly = yy - y_lo, lx = xx - x_lo, hy = 1.0f - ly, hx = 1.0f - lx;
                const long at[4] = {y_lo * W + x_lo, y_lo * W + x_hi, y_hi * W + x_lo, y_hi * W + x_hi};
                const float w[4] = {hy * hx, hy * lx, ly * hx, ly * lx};
#if defined(ROI_AVG)
                for (int k = 0; k < 4; k++) add_float(dx + at[k], share * w[k]);
#else
                for (int k = 0; k < 4; k++) {
                    const float term = w[k] * x[at[k]];
                    if (k == 0 || term > v) { v = term; v_w = w[k]; v_at = at[k]; }
                }
#endif
            }
            if (first || v > best) { best = v; best_w = v_w; best_at = v_at; }
            first = false;
        }
    }
#if defined(ROI_MAX)
    if (best_at >= 0) add_float(dx + best_at, g * best_w);
#endif
}
