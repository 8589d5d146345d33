"""RoiAlign's sampling on the host (its numpy form and its gradient's) and RoiAlignGrad.

The rules are roialign.cl's (the ONNX reference's and onnxruntime's): each output bin takes grid_h x grid_w
bilinear samples of its region; a sample beyond [-1, size] counts as 0, others clamp to the last row / column;
"avg" averages the samples, "max" takes the largest of the four weighted corner terms of each sample.
"""
import math

import numpy as np

from .base import REQUIRED, Op, register

ROI_ATTRS = {"mode": REQUIRED, "output_height": REQUIRED, "output_width": REQUIRED, "spatial_scale": REQUIRED,
             "sampling_ratio": REQUIRED, "half_pixel": REQUIRED}


def _axis_samples(start, extent, bins, grid, size):
    """Per bin, per sample along one axis: (valid, low index, high index, low weight, high weight)."""
    out = []
    for p in range(bins):
        row = []
        for i in range(grid):
            s = np.float32(start + p * (extent / bins) + (i + 0.5) * (extent / bins) / grid)
            if s < -1.0 or s > size:
                row.append((False, 0, 0, 0.0, 0.0))
                continue
            s = max(float(s), 0.0)
            lo = int(s)
            if lo >= size - 1:
                lo = hi = size - 1
                s = float(lo)
            else:
                hi = lo + 1
            frac = s - lo
            row.append((True, lo, hi, 1.0 - frac, frac))
        out.append(row)
    return out


def roi_samples(roi, shape, attrs):
    """For one roi over planes [H, W]: per output bin (ph, pw), the list of samples, each None (outside: 0) or
    its four (flat index, weight) corner terms in roialign.cl's order."""
    H, W = shape
    a = attrs
    offset = 0.5 if a["half_pixel"] else 0.0
    scale = np.float32(a["spatial_scale"])
    x0, y0 = np.float32(roi[0]) * scale - offset, np.float32(roi[1]) * scale - offset
    roi_w, roi_h = np.float32(roi[2]) * scale - offset - x0, np.float32(roi[3]) * scale - offset - y0
    if not a["half_pixel"]:
        roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
    oh, ow, ratio = a["output_height"], a["output_width"], a["sampling_ratio"]
    grid_h = ratio if ratio > 0 else math.ceil(roi_h / oh)
    grid_w = ratio if ratio > 0 else math.ceil(roi_w / ow)
    rows = _axis_samples(y0, roi_h, oh, grid_h, H)
    cols = _axis_samples(x0, roi_w, ow, grid_w, W)
    bins = {}
    for ph in range(oh):
        for pw in range(ow):
            samples = []
            for vy, ylo, yhi, hy, ly in rows[ph]:
                for vx, xlo, xhi, hx, lx in cols[pw]:
                    samples.append([(ylo * W + xlo, hy * hx), (ylo * W + xhi, hy * lx), (yhi * W + xlo, ly * hx),
                                    (yhi * W + xhi, ly * lx)] if vy and vx else None)
            bins[ph, pw] = samples
    return bins


def _max_term(samples, plane):
    """(value, flat index, weight) of the largest weighted corner term over the samples (an outside sample is 0,
    with no index); the first of equal ones."""
    best = None
    for terms in samples:
        cand = (0.0, None, 0.0) if terms is None else max(((w * plane[i], i, w) for i, w in terms),
                                                          key=lambda t: t[0])
        if best is None or cand[0] > best[0]:
            best = cand
    return best


def roialign_numpy(node, x, rois, batch):
    a = node.attrs
    N, C, H, W = x.shape
    y = np.zeros((len(rois), C, a["output_height"], a["output_width"]), np.float64)
    for r, roi in enumerate(rois):
        planes = x[int(batch[r])].reshape(C, H * W).astype(np.float64)
        for (ph, pw), samples in roi_samples(roi, (H, W), a).items():
            for c in range(C):
                if a["mode"] == "avg":
                    total = sum(w * planes[c, i] for terms in samples if terms for i, w in terms)
                    y[r, c, ph, pw] = total / max(len(samples), 1)
                else:
                    y[r, c, ph, pw] = _max_term(samples, planes[c])[0]
    return [y.astype(x.dtype)]


@register
class RoiAlignGrad(Op):
    """dx = zeros(x.shape); each output bin's dy spread over the corners of its samples by their bilinear weights
    (avg: / samples; max: all to the largest term's corner, read from x)  (inputs dy, x, rois, batch; RoiAlign's
    attrs)"""
    name = "RoiAlignGrad"
    dtypes = ("float32",)
    attrs = ROI_ATTRS

    def infer(self, node):
        return [(node.inputs[1].dtype, node.inputs[1].shape)]

    def numpy(self, node, dy, x, rois, batch):
        a = node.attrs
        N, C, H, W = x.shape
        planes = x.reshape(N, C, H * W).astype(np.float64)
        dx = np.zeros((N, C, H * W), np.float64)
        for r, roi in enumerate(rois):
            n = int(batch[r])
            for (ph, pw), samples in roi_samples(roi, (H, W), a).items():
                for c in range(C):
                    g = float(dy[r, c, ph, pw])
                    if a["mode"] == "avg":
                        for i, w in [t for terms in samples if terms for t in terms]:
                            dx[n, c, i] += g * w / max(len(samples), 1)
                        continue
                    _, i, w = _max_term(samples, planes[n, c])
                    if i is not None:
                        dx[n, c, i] += g * w
        return [dx.reshape(x.shape).astype(x.dtype)]

    def lower(self, node, lw):
        lw.roialign_grad(node)
