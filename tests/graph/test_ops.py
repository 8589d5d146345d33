"""Every op of the engine against onnx.reference, at each op-set whose semantics differ. Fresh random inputs."""
import numpy as np
import pytest
from onnx import helper

from tests.conftest import make_model, reference, rel_l2, run_dlnet

R = np.random.default_rng(0)


def f32(*shape, lo=-1.0, hi=1.0):
    return R.uniform(lo, hi, shape).astype(np.float32)


def case(op, inputs, attrs=None, opset=13, inits=None, n_out=1, name=None, tol=1e-5, input_names=None, oracle=None):
    """oracle: numpy maths to compare with instead of onnx.reference (where the reference deviates from the spec)."""
    return pytest.param(op, inputs, attrs or {}, opset, inits or {}, n_out, tol, input_names, oracle,
                        id=name or f"{op}-{opset}")


def bn_numpy(x, s, b, m, v, eps=1e-3):
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return [(x - m.reshape(shape)) / np.sqrt(v.reshape(shape) + eps) * s.reshape(shape) + b.reshape(shape)]


def lrn_numpy(x, size=3, alpha=1e-2, beta=0.75, bias=2.0):
    sq = np.zeros_like(x, dtype=np.float64)
    for c in range(x.shape[1]):
        lo, hi = max(0, c - (size - 1) // 2), min(x.shape[1], c + -(-(size - 1) // 2) + 1)
        sq[:, c] = (x[:, lo:hi].astype(np.float64) ** 2).sum(axis=1)
    return [x / (bias + alpha / size * sq) ** beta]


def roialign_10_as_16(mode, ratio):
    """Op-set 10 RoiAlign is op-set 16's output_half_pixel mode (onnx.reference applies 16's default, half_pixel,
    at 10; onnxruntime agrees with this oracle)."""
    def oracle(x, rois, batch):
        node = helper.make_node("RoiAlign", ["x", "rois", "batch"], ["y0"], output_height=3, output_width=4,
                                sampling_ratio=ratio, spatial_scale=0.9, mode=mode,
                                coordinate_transformation_mode="output_half_pixel")
        feeds = {"x": x, "rois": rois, "batch": batch}
        return reference(make_model([node], feeds, ["y0"], opset=16), feeds)
    return oracle


def softmax_legacy_numpy(log):
    """Op-sets < 13: flatten to 2-D at axis 1, normalise the whole second dim."""
    def f(x):
        flat = x.reshape(x.shape[0], -1).astype(np.float64)
        e = np.exp(flat - flat.max(axis=1, keepdims=True))
        y = e / e.sum(axis=1, keepdims=True)
        return [(np.log(y) if log else y).reshape(x.shape)]
    return f


# onnx.reference deviates from the spec in three places used below (LRN sums over the wrong axis, Softmax before
# op-set 13 ignores the 2-D flattening, legacy `broadcast`/`axis` is not implemented): numpy oracles there.
CASES = [
    # convolution: groups, dilation, stride, pads (symmetric and asymmetric), 1-D, bias
    case("Conv", {"x": f32(2, 4, 9, 9)}, {"pads": [1, 1, 1, 1]}, inits={"w": f32(6, 4, 3, 3), "b": f32(6)},
         name="conv-3x3-bias", input_names=["x", "w", "b"]),
    case("Conv", {"x": f32(1, 6, 11, 10)}, {"strides": [2, 2], "dilations": [2, 1], "group": 3, "pads": [2, 1, 2, 1]},
         inits={"w": f32(9, 2, 3, 3)}, name="conv-group-dil-stride", input_names=["x", "w"]),
    case("Conv", {"x": f32(1, 8, 7, 7)}, {"group": 8, "pads": [1, 1, 1, 1]}, inits={"w": f32(8, 1, 3, 3)},
         name="conv-depthwise", input_names=["x", "w"]),
    case("Conv", {"x": f32(1, 4, 7, 7)}, {"group": 4, "strides": [2, 2]}, inits={"w": f32(8, 1, 3, 3)},
         name="conv-depthwise-mult2", input_names=["x", "w"]),
    case("Conv", {"x": f32(1, 3, 8, 8)}, {"pads": [0, 1, 2, 0]}, inits={"w": f32(4, 3, 3, 3)},
         name="conv-asymmetric-pads", input_names=["x", "w"]),
    case("Conv", {"x": f32(1, 3, 9, 8)}, {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, inits={"w": f32(4, 3, 3, 3)},
         name="conv-same-upper", input_names=["x", "w"]),
    case("Conv", {"x": f32(1, 3, 8, 8)}, {"auto_pad": "SAME_LOWER", "strides": [2, 2]}, inits={"w": f32(4, 3, 4, 4)},
         name="conv-same-lower", input_names=["x", "w"]),
    case("Conv", {"x": f32(2, 3, 20)}, {"pads": [2, 2], "strides": [3]}, inits={"w": f32(5, 3, 4), "b": f32(5)},
         name="conv-1d", input_names=["x", "w", "b"]),
    case("Conv", {"x": f32(2, 16, 5, 5)}, {}, inits={"w": f32(32, 16, 1, 1)}, name="conv-1x1",
         input_names=["x", "w"]),
    # matrix products
    case("Gemm", {"a": f32(5, 7)}, {"transB": 1, "alpha": 0.5, "beta": 2.0}, inits={"b": f32(3, 7), "c": f32(3)},
         name="gemm-transB-bias", input_names=["a", "b", "c"]),
    case("Gemm", {"a": f32(7, 5)}, {"transA": 1}, inits={"b": f32(7, 4), "c": f32(5, 4)}, name="gemm-transA",
         input_names=["a", "b", "c"]),
    case("Gemm", {"a": f32(4, 6), "b": f32(6, 3)}, {}, opset=11, name="gemm-11-no-bias-input"),  # (C optional from 11)
    case("MatMul", {"a": f32(2, 3, 4, 5), "b": f32(3, 5, 6)}, name="matmul-batch-broadcast"),
    case("MatMul", {"a": f32(5), "b": f32(2, 5, 3)}, name="matmul-1d-left"),
    case("MatMul", {"a": f32(4, 5), "b": f32(5)}, name="matmul-1d-right"),
    # normalisation
    case("BatchNormalization", {"x": f32(2, 3, 4, 5)}, {"epsilon": 1e-3},
         inits={"s": f32(3), "b": f32(3), "m": f32(3), "v": f32(3, lo=0.5, hi=2)},
         name="batchnorm-9", opset=9, input_names=["x", "s", "b", "m", "v"], oracle=bn_numpy),
    # (onnx.reference's BatchNormalization_9 deviates from the spec formula by ~20%: the numpy oracle is the spec)
    case("BatchNormalization", {"x": f32(2, 3, 4)}, {},
         inits={"s": f32(3), "b": f32(3), "m": f32(3), "v": f32(3, lo=0.5, hi=2)},
         name="batchnorm-15-3d", opset=15, input_names=["x", "s", "b", "m", "v"]),
    case("BatchNormalization", {"x": f32(2, 3, 4, 5), "s": f32(3), "b": f32(3), "m": f32(3),
                                "v": f32(3, lo=0.5, hi=2)}, name="batchnorm-15-stats-at-run-time", opset=15),
    case("BatchNormalization", {"x": f32(4, 3, 5), "s": f32(3), "b": f32(3), "m": f32(3),
                                "v": f32(3, lo=0.5, hi=2)}, {"training_mode": 1, "momentum": 0.8}, n_out=3,
         name="batchnorm-15-training-mode", opset=15),
    case("LRN", {"x": f32(2, 7, 4, 4)}, {"size": 3, "alpha": 1e-2, "beta": 0.75, "bias": 2.0}, oracle=lrn_numpy),
    # regions of interest: boxes partly outside the image, batch indices out of order
    *[case("RoiAlign", {"x": f32(2, 3, 9, 11), "rois": np.array([[0.5, 1, 6, 7.5], [-2, 3, 4, 12], [2, 2, 2.5, 2.2],
                                                                 [7, 0, 13, 5]], np.float32),
                        "batch": np.array([1, 0, 1, 1], np.int64)},
           {"output_height": 3, "output_width": 4, "sampling_ratio": ratio, "spatial_scale": 0.9, "mode": mode},
           opset=opset, name=f"roialign-{opset}-{mode}-ratio{ratio}",
           oracle=roialign_10_as_16(mode, ratio) if opset == 10 else None)
      for opset in (10, 16) for mode in ("avg", "max") for ratio in (0, 2)],
    # activations
    case("Relu", {"x": f32(3, 4)}), case("LeakyRelu", {"x": f32(3, 4)}, {"alpha": 0.2}),
    case("Sigmoid", {"x": f32(3, 4)}), case("Tanh", {"x": f32(3, 4)}),
    case("Clip", {"x": f32(3, 4)}, {"min": -0.3, "max": 0.4}, opset=9, name="clip-9-attrs"),
    case("Clip", {"x": f32(3, 4)}, opset=11, inits={"lo": np.float32(-0.2), "hi": np.float32(0.5)},
         name="clip-11-inputs", input_names=["x", "lo", "hi"]),
    case("Clip", {"x": f32(3, 4)}, opset=13, inits={"hi": np.float32(0.5)}, name="clip-13-max-only",
         input_names=["x", "", "hi"]),
    case("HardSigmoid", {"x": f32(3, 4, lo=-5, hi=5)}, {"alpha": 0.3, "beta": 0.4}),
    case("Elu", {"x": f32(3, 4)}, {"alpha": 0.7}), case("Softplus", {"x": f32(3, 4, lo=-30, hi=30)}),
    # pooling
    case("MaxPool", {"x": f32(2, 3, 9, 9)}, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
         name="maxpool-pads"),
    case("MaxPool", {"x": f32(1, 2, 8, 8)}, {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, opset=11,
         name="maxpool-ceil"),
    case("MaxPool", {"x": f32(1, 2, 7, 7)}, {"kernel_shape": [2, 2], "dilations": [2, 2]}, opset=11,
         name="maxpool-dilation"),
    case("MaxPool", {"x": f32(1, 2, 8, 8)}, {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
         name="maxpool-same-upper"),
    case("MaxPool", {"x": f32(1, 2, 8, 8)}, {"kernel_shape": [2, 2], "pads": [0, 0, 1, 1], "strides": [2, 2]},
         name="maxpool-asymmetric"),
    case("MaxPool", {"x": f32(2, 3, 9, 8)}, {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1]},
         opset=12, n_out=2, name="maxpool-indices"),
    case("MaxPool", {"x": f32(2, 3, 7, 9)}, {"kernel_shape": [2, 3], "dilations": [2, 1], "storage_order": 1},
         opset=12, n_out=2, name="maxpool-indices-column-major"),
    case("MaxPool", {"x": f32(2, 3, 11)}, {"kernel_shape": [3], "strides": [2], "ceil_mode": 1}, opset=12, n_out=2,
         name="maxpool-indices-1d-ceil"),
    case("AveragePool", {"x": f32(2, 3, 9, 9)}, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
         name="avgpool-exclude-pad"),
    case("AveragePool", {"x": f32(2, 3, 9, 9)}, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
                                                 "count_include_pad": 1}, name="avgpool-include-pad"),
    case("AveragePool", {"x": f32(1, 2, 8, 8)}, {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
         opset=11, name="avgpool-ceil"),
    case("AveragePool", {"x": f32(1, 2, 8, 8)}, {"kernel_shape": [3, 3], "pads": [0, 1, 2, 0]},
         name="avgpool-asymmetric-exclude"),
    case("AveragePool", {"x": f32(1, 2, 8, 8)}, {"kernel_shape": [3, 3], "pads": [0, 1, 2, 0],
                                                 "count_include_pad": 1}, name="avgpool-asymmetric-include"),
    case("AveragePool", {"x": f32(1, 2, 7, 8)}, {"kernel_shape": [3, 2], "strides": [2, 2],
                                                 "auto_pad": "SAME_LOWER"}, name="avgpool-same-lower"),
    case("AveragePool", {"x": f32(2, 3, 12)}, {"kernel_shape": [3], "strides": [2]}, name="avgpool-1d"),
    case("GlobalAveragePool", {"x": f32(2, 5, 4, 3)}), case("GlobalMaxPool", {"x": f32(2, 5, 4, 3)}),
    # softmax: op-set < 13 flattens to 2-D at axis, 13 normalises one axis
    case("Softmax", {"x": f32(2, 3, 4)}, {"axis": 1}, opset=11, name="softmax-11-flatten",
         oracle=softmax_legacy_numpy(False)),
    case("Softmax", {"x": f32(2, 3, 4)}, {"axis": 1}, opset=13, name="softmax-13-axis"),
    case("LogSoftmax", {"x": f32(2, 3, 4)}, {"axis": 1}, opset=9, name="logsoftmax-9-flatten",
         oracle=softmax_legacy_numpy(True)),
    case("LogSoftmax", {"x": f32(2, 3, 4)}, {}, opset=13, name="logsoftmax-13-default"),
    # data movement
    case("Concat", {"a": f32(2, 3, 4), "b": f32(2, 1, 4), "c": f32(2, 2, 4)}, {"axis": 1}),
    case("Concat", {"a": f32(2, 3), "b": f32(2, 2)}, {"axis": -1}, name="concat-negative-axis"),
    case("Reshape", {"x": f32(2, 3, 4)}, inits={"s": np.array([0, -1], np.int64)}, input_names=["x", "s"]),
    case("Flatten", {"x": f32(2, 3, 4, 5)}, {"axis": 2}),
    case("Transpose", {"x": f32(2, 3, 4, 5)}, {"perm": [0, 3, 1, 2]}),
    case("Transpose", {"x": f32(2, 3, 4)}, name="transpose-default"),
    case("Squeeze", {"x": f32(2, 1, 4, 1)}, {"axes": [1]}, opset=11, name="squeeze-11-attr"),
    case("Squeeze", {"x": f32(2, 1, 4, 1)}, opset=13, inits={"a": np.array([-1], np.int64)},
         name="squeeze-13-input", input_names=["x", "a"]),
    case("Unsqueeze", {"x": f32(2, 4)}, {"axes": [0, 3]}, opset=11, name="unsqueeze-11-attr"),
    case("Unsqueeze", {"x": f32(2, 4)}, opset=13, inits={"a": np.array([1, -1], np.int64)},
         name="unsqueeze-13-input", input_names=["x", "a"]),
    case("Dropout", {"x": f32(3, 4)}, {"ratio": 0.5}, opset=9, name="dropout-9"),
    case("Dropout", {"x": f32(3, 4)}, opset=13, name="dropout-13"),
    case("Identity", {"x": f32(3, 4)}),
    case("Pad", {"x": f32(1, 2, 3, 4)}, {"pads": [0, 0, 1, 2, 0, 0, 2, 1], "value": 1.5}, opset=9, name="pad-2-attrs"),
    case("Pad", {"x": f32(1, 2, 3, 4)}, {"mode": "reflect"}, opset=11,
         inits={"p": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64)}, name="pad-11-reflect", input_names=["x", "p"]),
    case("Pad", {"x": f32(1, 2, 3, 4)}, {"mode": "edge"}, opset=13,
         inits={"p": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64)}, name="pad-13-edge", input_names=["x", "p"]),
    case("Slice", {"x": f32(5, 6, 7)}, {"starts": [1, -4], "ends": [4, 100], "axes": [0, 2]}, opset=9,
         name="slice-9-attrs"),
    case("Slice", {"x": f32(5, 6, 7)}, opset=13,
         inits={"s": np.array([4, 1], np.int64), "e": np.array([0, 6], np.int64), "a": np.array([0, 1], np.int64),
                "t": np.array([-1, 2], np.int64)}, name="slice-13-negative-step", input_names=["x", "s", "e", "a", "t"]),
    case("Split", {"x": f32(2, 6)}, {"axis": 1, "split": [2, 4]}, opset=11, n_out=2, name="split-11-attr"),
    case("Split", {"x": f32(2, 6)}, {"axis": 1}, opset=13, inits={"s": np.array([1, 5], np.int64)}, n_out=2,
         name="split-13-input", input_names=["x", "s"]),
    case("Expand", {"x": f32(3, 1)}, inits={"s": np.array([2, 3, 4], np.int64)}, input_names=["x", "s"]),
    case("Tile", {"x": f32(2, 3)}, inits={"r": np.array([2, 3], np.int64)}, input_names=["x", "r"]),
    case("Gather", {"x": f32(5, 4), "i": np.array([[0, 4], [-1, 2]], np.int64)}, {"axis": 0}, name="gather-0"),
    case("Gather", {"x": f32(3, 5, 2), "i": np.array([1, 3, 3], np.int64)}, {"axis": 1}, name="gather-1"),
    case("Constant", {}, {"value": helper.make_tensor("v", 1, [2, 2], [1.0, 2.0, 3.0, 4.0])}),
    case("ConstantOfShape", {}, {"value": helper.make_tensor("v", 1, [1], [2.5])},
         inits={"s": np.array([2, 3], np.int64)}, input_names=["s"]),
    case("Shape", {"x": f32(2, 3, 4)}),
    case("Cast", {"x": f32(3, 4, lo=-5, hi=5)}, {"to": 7}, name="cast-float-to-int64"),
    # linear algebra
    case("Det", {"x": f32(3, 5, 5)}, opset=11, tol=1e-5), case("Det", {"x": f32(2, 2)}, opset=11, name="det-2x2"),
    case("Det", {"x": np.array([[1, 2, 3], [2, 4, 6], [0, 1, 1]], np.float32)}, opset=11, name="det-singular",
         oracle=lambda x: [np.float32(0)]),
    # elementwise maths with broadcasting
    *[case(op, {"a": f32(2, 3, 4, lo=0.5, hi=2), "b": f32(3, 1, lo=0.5, hi=2)}) for op in
      ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min")],
    case("Add", {"a": f32(2, 3, 4, 5), "b": f32(3)}, {"broadcast": 1, "axis": 1}, opset=6, name="add-6-legacy-axis",
         oracle=lambda a, b: [a + b.reshape(1, 3, 1, 1)]),
    case("Sum", {"a": f32(2, 3), "b": f32(3), "c": f32(2, 1)}), case("Max", {"a": f32(2, 3), "b": f32(3), "c": f32(2, 1)},
                                                                     name="max-variadic"),
    case("Min", {"a": f32(2, 3), "b": f32(3), "c": f32(2, 1)}, name="min-variadic"),
    *[case(op, {"x": f32(3, 4, lo=0.1, hi=3)}) for op in ("Sqrt", "Exp", "Log", "Abs", "Neg", "Reciprocal")],
    case("Abs", {"x": f32(3, 4)}, name="abs-negative"), case("Neg", {"x": f32(3, 4)}, name="neg-signed"),
]


@pytest.mark.parametrize("op,inputs,attrs,opset,inits,n_out,tol,input_names,oracle", CASES)
def test_op_matches_reference(ctx, op, inputs, attrs, opset, inits, n_out, tol, input_names, oracle):
    names = input_names or list(inputs) + list(inits)
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, names, outs, **attrs)
    model = make_model([node], inputs, outs, inits, opset=opset)
    want = oracle(*inputs.values(), *inits.values()) if oracle else reference(model, inputs)
    got = run_dlnet(model, inputs, ctx)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape, f"{op}: shape {g.shape} != {w.shape}"
        if w.dtype.kind in "iub":
            np.testing.assert_array_equal(g, w)
        else:
            assert rel_l2(g, w) <= tol, f"{op}: rel L2 {rel_l2(g, w):.2e}"
