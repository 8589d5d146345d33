// A pooling or depthwise layer's geometry compiled in (kernels/emitter.py compiled_geometry): GEOMETRY, at the top of
// a kernel taking the int arguments H, W, OH, OW, KH, KW, SH, SW, PH, PW, DH and DW, replaces them by the macros HC ..
// DWC, so that divisions and remainders by strides and widths become shifts and multiplications and tap loops unroll.
// An H200 ran mobilenet_v2's 112 x 112 stride-2 depthwise dx (1536 planes, 19 M work-items, four such divisions a
// tap) in 0.555 ms with the run-time values; alexnet's max-pool gradients took 0.21 ms against 0.12.
#define GEOMETRY H = HC; W = WC; OH = OHC; OW = OWC; KH = KHC; KW = KWC; SH = SHC; SW = SWC; PH = PHC; PW = PWC; \
    DH = DHC; DW = DWC;
