"""Every differentiable IR op has a gradient rule, and every rule is right.

- The registry: an op without a rule must be in NOT_DIFFERENTIATED (with its reason); every rule has a case here or
  in test_autodiff.py's CASES, every Reduce mode and ScatterElements reduction too.
- Each case of CASES, `loss = sum(op(x...) * w)`, against float64 central differences of the op's numpy form
  (test_autodiff.py's machinery): once on the device in float32 (the backward graph as the trainer plans it), once
  on the host in float64 (the backward graph evaluated node by node through the ops' numpy forms: the rule's maths
  alone, to 1e-6).
- Kinks (Relu at 0, ties of Max, ...) against torch autograd at exactly the kink.
- One SGD step of small torch models using these ops (exported at op-set 13 and 17): torch's loss and torch's drop
  in loss. Trainer(params=, frozen=) choose which initializers train.
"""
import copy

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import dlnet
from dlnet.errors import InputError
from dlnet.graph.autodiff import gradients
from dlnet.graph.ir import Builder, Graph
from dlnet.graph.ops import OPS, Op
from dlnet.graph.ops.reduce import REDUCE_NP
from dlnet.graph.passes import run_passes
from dlnet.graph.passes.fold import fold_constants, remove_dead
from dlnet.graph.passes.fuse import fuse_pointwise
from dlnet.net import Plan

from ..conftest import context, reference, rel_l2
from . import test_autodiff
from .test_autodiff import TOL, away, central_differences, device_gradients, distinct, host_forward, normal, positive

HOST_TOL = 1e-6  # float64 maths against float64 central differences (eps 1e-6)

# IR ops without a gradient rule, and why none is needed. Any other op must have one.
NOT_DIFFERENTIATED = {
    # integer or boolean outputs: no float path runs through them
    "ArgReduce": "int64 indices",
    "Equal": "bool", "Less": "bool", "LessOrEqual": "bool", "Greater": "bool", "GreaterOrEqual": "bool",
    "And": "bool", "Or": "bool", "Xor": "bool", "Not": "bool", "IsNaN": "bool", "IsInf": "bool",
    "BitShift": "integers only",
    "BitwiseAnd": "integers only", "BitwiseOr": "integers only", "BitwiseXor": "integers only",
    "BitwiseNot": "integers only",
    # piecewise constant: gradient 0 wherever it exists (PyTorch's zeros). They declare differentiable = False, so
    # autodiff follows no path through them (test_piecewise_constant_ops_pass_no_gradient)
    "Floor": "piecewise constant", "Ceil": "piecewise constant", "Round": "piecewise constant",
    "Sign": "piecewise constant",
    # inference-only fusions (graph/passes/transformer.py): the training pipeline never makes them
    "AddLayerNorm": "inference only", "ColumnView": "inference only", "LayerNormAxis": "inference only",
    # backward-only ops that the rules build; dlnet takes no second derivatives
    "ConvGradX": "backward of Conv", "ConvGradW": "backward of Conv", "PoolGrad": "backward of the pools",
    "BatchNormTrainGrad": "backward of BatchNormTrain", "SliceGrad": "backward of Slice",
    "GatherGrad": "backward of Gather", "GatherElementsGrad": "backward of GatherElements",
    "RoiAlignGrad": "backward of RoiAlign", "GridSampleGrad": "backward of GridSample",
    "AttentionGrad": "backward of Attention",
    # made by passes that run after autodiff
    "Fused": "a chain of pointwise nodes, fused after the backward graph exists",
    "TransposeView": "a Transpose read in place by products, made after the backward graph exists",
    # host ops run between device graphs, and a training graph is one device graph
    "NonZero": "host op, int64", "Unique": "host op", "NonMaxSuppression": "host op, int64",
    "StringNormalizer": "host op, strings", "StringConcat": "host op, strings", "StringSplit": "host op, strings",
    "RegexFullMatch": "host op, strings in, bool out",
}
# differentiable ops still without a rule: each is a known gap, named in the error autodiff raises
MISSING = {}


def uniform(lo, hi, *shape):
    return ("uniform", (lo, hi), shape)


def avoid(points, lo, hi, *shape):
    """uniform in [lo, hi] but at least 0.1 from each kink in `points`"""
    return ("avoid", (tuple(points), lo, hi), shape)


def const(array):
    """a constant input (indices, a condition, an integer exponent): no gradient asked"""
    return ("const", np.asarray(array), None)


def with_zeros(*shape):
    """normal, with exact zeros at flat positions 0, 3 and 4: rows with two zeros and with one (a [3, 4] input: two
    in row 0, one in row 1; [2, 3]: one in row 0, two in row 1)"""
    return ("zeros", None, shape)


def draw(spec, rng):
    if len(spec) == 2:  # test_autodiff.py's (kind, shape)
        return test_autodiff.sample(spec, rng)
    kind, arg, shape = spec
    if kind == "const":
        return arg.copy()
    if kind == "uniform":
        return rng.uniform(arg[0], arg[1], shape)
    if kind == "avoid":
        points, lo, hi = arg
        x = rng.uniform(lo, hi, shape)
        for _ in range(100):
            near = np.zeros(shape, bool)
            for p in points:
                near |= np.abs(x - p) < 0.1
            if not near.any():
                return x
            x = np.where(near, rng.uniform(lo, hi, shape), x)
        raise ValueError(f"cannot draw {spec} away from its kinks")
    if kind == "zeros":
        x = rng.standard_normal(shape)
        x.reshape(-1)[[0, 3, 4]] = 0.0
        return x
    raise ValueError(kind)


# id, op, input specs, attrs
CASES = [
    # activations (inputs away from their kinks; the kinks themselves: test_kinks_follow_torch)
    ("LeakyRelu", "LeakyRelu", [away(2, 3, 4)], {"alpha": 0.1}),
    ("HardSigmoid", "HardSigmoid", [avoid([-2.5, 2.5], -4, 4, 2, 3, 4)], {"alpha": 0.2, "beta": 0.5}),
    ("HardSigmoid-torch", "HardSigmoid", [avoid([-3, 3], -5, 5, 2, 3, 4)], {"alpha": 1 / 6, "beta": 0.5}),
    ("HardSwish", "HardSwish", [avoid([-3, 3], -5, 5, 3, 4, 4)], {}),
    ("Elu", "Elu", [away(2, 3, 4)], {"alpha": 0.7}),
    ("Selu", "Selu", [away(2, 3, 4)], {}),
    ("Celu", "Celu", [away(2, 3, 4)], {"alpha": 1.5}),
    ("ThresholdedRelu", "ThresholdedRelu", [avoid([1.0], -2, 3, 2, 3, 4)], {"alpha": 1.0}),
    ("Softsign", "Softsign", [normal(2, 3, 4)], {}),
    ("Shrink-soft", "Shrink", [avoid([-0.5, 0.5], -2, 2, 2, 3, 4)], {"lambd": 0.5, "bias": 0.5}),
    ("Shrink-hard", "Shrink", [avoid([-0.3, 0.3], -2, 2, 2, 3, 4)], {"lambd": 0.3, "bias": 0.0}),
    ("Erf", "Erf", [normal(2, 3, 4)], {}),
    ("GeluTanh", "GeluTanh", [uniform(-4, 4, 2, 3, 4)], {}),
    ("Mish", "Mish", [uniform(-5, 5, 2, 3, 4)], {}),
    ("Swish", "Swish", [uniform(-5, 5, 2, 3, 4)], {"alpha": 1.0}),
    ("Swish-alpha", "Swish", [normal(2, 3, 4)], {"alpha": 0.4}),
    # trigonometric
    ("Sin", "Sin", [normal(2, 3, 4)], {}),
    ("Cos", "Cos", [normal(2, 3, 4)], {}),
    ("Tan", "Tan", [uniform(-1.2, 1.2, 2, 3, 4)], {}),
    ("Asin", "Asin", [uniform(-0.9, 0.9, 2, 3, 4)], {}),
    ("Acos", "Acos", [uniform(-0.9, 0.9, 2, 3, 4)], {}),
    ("Atan", "Atan", [normal(2, 3, 4)], {}),
    ("Sinh", "Sinh", [normal(2, 3, 4)], {}),
    ("Cosh", "Cosh", [normal(2, 3, 4)], {}),
    ("Asinh", "Asinh", [normal(2, 3, 4)], {}),
    ("Acosh", "Acosh", [uniform(1.2, 3.0, 2, 3, 4)], {}),
    ("Atanh", "Atanh", [uniform(-0.8, 0.8, 2, 3, 4)], {}),
    # binary, with broadcasting
    ("Pow", "Pow", [positive(2, 3, 4), normal(2, 3, 4)], {}),
    ("Pow-broadcast", "Pow", [positive(2, 3, 4), normal(4)], {}),
    ("Pow-int-exponent", "Pow", [normal(2, 3, 4), const(np.int64(3))], {}),
    ("Max", "Max", [normal(2, 3, 4), normal(2, 3, 4)], {}),
    ("Max-broadcast", "Max", [normal(2, 3, 4), normal(3, 1)], {}),
    ("Min-broadcast", "Min", [normal(3, 1), normal(2, 3, 4)], {}),
    ("Mod-fmod", "Mod", [uniform(-3, 3, 2, 3, 4), positive(4)], {"fmod": 1}),
    ("Mod-floor", "Mod", [uniform(-3, 3, 2, 3, 4), away(3, 1)], {"fmod": 0}),
    ("PRelu", "PRelu", [away(2, 3, 4, 4), normal(3, 1, 1)], {}),
    ("Where", "Where", [const(np.arange(24).reshape(2, 3, 4) % 3 == 0), normal(2, 3, 4), normal(4)], {}),
    # reductions: every mode
    ("Reduce-max", "Reduce", [distinct(2, 3, 4)], {"mode": "max", "axes": (1,), "keepdims": 1}),
    ("Reduce-min", "Reduce", [distinct(2, 3, 4)], {"mode": "min", "axes": (0, 2), "keepdims": 0}),
    ("Reduce-prod", "Reduce", [uniform(0.5, 1.5, 2, 3, 4)], {"mode": "prod", "axes": (2,), "keepdims": 0}),
    ("Reduce-prod-zeros", "Reduce", [with_zeros(3, 4)], {"mode": "prod", "axes": (1,), "keepdims": 1}),
    ("Reduce-l1", "Reduce", [away(2, 3, 4)], {"mode": "l1", "axes": (1, 2), "keepdims": 0}),
    ("Reduce-l2", "Reduce", [normal(2, 3, 4)], {"mode": "l2", "axes": (0,), "keepdims": 1}),
    ("Reduce-sumsquare", "Reduce", [normal(2, 3, 4)], {"mode": "sumsquare", "axes": (2,), "keepdims": 1}),
    ("Reduce-logsum", "Reduce", [positive(2, 3, 4)], {"mode": "logsum", "axes": (1,), "keepdims": 0}),
    ("Reduce-logsumexp", "Reduce", [normal(2, 3, 4)], {"mode": "logsumexp", "axes": (0, 1, 2), "keepdims": 0}),
    # normalisation and linear algebra
    ("LRN-3", "LRN", [normal(2, 5, 3, 3)], {"size": 3, "alpha": 0.3, "beta": 0.75, "bias": 1.0}),
    ("LRN-4-even", "LRN", [normal(2, 6, 2, 3)], {"size": 4, "alpha": 0.5, "beta": 0.6, "bias": 2.0}),
    ("LRN-5-3d", "LRN", [normal(2, 7, 4)], {"size": 5, "alpha": 1e-2, "beta": 0.75, "bias": 1.0}),
    ("BatchNormalization", "BatchNormalization", [normal(2, 3, 4, 4), normal(3), normal(3), normal(3),
                                                  positive(3)], {"epsilon": 1e-5}),
    ("BatchNormalization-2d", "BatchNormalization", [normal(5, 3), normal(3), normal(3), normal(3), positive(3)],
     {"epsilon": 1e-3}),
    ("LayerNormStats", "LayerNormStats", [normal(2, 3, 6), positive(6), normal(6)], {"epsilon": 1e-5}),
    ("RMSNorm", "RMSNorm", [normal(2, 3, 7), positive(7)], {"epsilon": 1e-5}),
    ("RMSNorm-eps", "RMSNorm", [uniform(-0.3, 0.3, 4, 5), normal(5)], {"epsilon": 0.05}),
    ("Det", "Det", [normal(3, 3)], {}),
    ("Det-batched", "Det", [normal(2, 4, 4)], {}),
    ("Det-1x1", "Det", [normal(3, 1, 1)], {}),
    # attention (the fused op's rule is its decomposition): grouped-query heads, causal offsets (rows that see no
    # key: 0), a float mask (its gradient too) and a bool one, softcap
    ("Attention", "Attention", [normal(2, 2, 5, 4), normal(2, 2, 6, 4), normal(2, 2, 6, 3)], {"scale": 0.5}),
    ("Attention-gqa-causal", "Attention", [normal(1, 4, 4, 4), normal(1, 2, 6, 4), normal(1, 2, 6, 4)],
     {"scale": 0.6, "causal": 1, "causal_offset": 2}),
    ("Attention-float-mask", "Attention", [normal(2, 2, 5, 4), normal(2, 2, 5, 4), normal(2, 2, 5, 4),
                                           normal(2, 1, 5, 5)], {"scale": 0.5}),
    ("Attention-bool-mask-softcap-rank3", "Attention",
     [normal(2, 5, 4), normal(2, 6, 4), normal(2, 6, 4), const(np.arange(30).reshape(5, 6) % 4 != 1)],
     {"scale": 0.8, "softcap": 1.2}),
    ("Attention-layouts-gqa", "Attention", [normal(2, 5, 4, 4), normal(2, 2, 6, 4), normal(6, 2, 2, 3)],
     {"scale": 0.5, "causal": 1, "causal_offset": 1, "layout": ("bthd", "bhtd", "tbhd", "thbd")}),
    ("Attention-hidden-rows", "Attention", [normal(1, 2, 5, 4), normal(1, 2, 5, 4), normal(1, 2, 5, 4)],
     {"scale": 0.7, "causal": 1, "causal_offset": -2}),
    # ... by the fused rule (one AttentionGrad node: attention_grad.cl), head dims past one chunk of 8 and ragged
    ("Attention-fused", "Attention", [normal(2, 2, 5, 4), normal(2, 2, 6, 4), normal(2, 2, 6, 3)],
     {"scale": 0.5, "fused_grad": 1}),
    ("Attention-fused-gqa-causal-hidden", "Attention", [normal(1, 4, 5, 12), normal(1, 2, 6, 12),
                                                        normal(1, 2, 6, 9)],
     {"scale": 0.3, "causal": 1, "causal_offset": -1, "fused_grad": 1}),
    ("Attention-fused-masks-layouts", "Attention",
     [normal(2, 5, 4, 16), normal(2, 2, 6, 16), normal(6, 2, 2, 3), const(np.arange(30).reshape(5, 6) % 4 != 1)],
     {"scale": 0.25, "layout": ("bthd", "bhtd", "tbhd", "thbd"), "fused_grad": 1}),
    ("Attention-fused-float-mask-decomposed", "Attention", [normal(2, 2, 5, 4), normal(2, 2, 5, 4),
                                                            normal(2, 2, 5, 4), normal(2, 1, 5, 5)],
     {"scale": 0.5, "causal": 1, "fused_grad": 1}),  # (a mask with a gradient: the decomposition's rule)
    # indexing (repeated and negative indices; indices shorter than x off the axis)
    ("GatherElements", "GatherElements", [normal(3, 4), const([[0, 2, -1, 1], [2, 2, 0, -3]])], {"axis": 0}),
    ("GatherElements-axis1-short", "GatherElements", [normal(3, 5), const([[0, -1, 2], [4, 4, 1]])], {"axis": 1}),
    ("GatherElements-axis0-short", "GatherElements", [normal(3, 5), const([[0, 2, 1], [1, -1, 0]])], {"axis": 0}),
    ("ScatterElements-none", "ScatterElements", [normal(4, 3), const([[1, 0, 3], [3, 2, 1]]), normal(2, 3)],
     {"axis": 0, "reduction": "none"}),
    ("ScatterElements-add", "ScatterElements", [normal(3, 4), const([[1, 1, -1], [0, 3, 3]]), normal(2, 3)],
     {"axis": 1, "reduction": "add"}),
    ("ScatterElements-max", "ScatterElements", [distinct(3, 4), const([[1, 1, 0], [0, 3, 3]]), distinct(2, 3)],
     {"axis": 1, "reduction": "max"}),
    ("ScatterElements-min", "ScatterElements", [distinct(4, 3), const([[1, 0, 3], [1, 2, 3]]), distinct(2, 3)],
     {"axis": 0, "reduction": "min"}),
    ("ScatterElements-mul", "ScatterElements", [normal(3, 4), const([[1, 1, 0], [0, 3, 3]]), normal(2, 3)],
     {"axis": 1, "reduction": "mul"}),
    # boxes partly outside the planes, batch indices out of order (the rois: constants, no gradient)
    *[(f"RoiAlign-{mode}-ratio{ratio}-hp{hp}", "RoiAlign",
       [normal(2, 3, 7, 8), const(np.array([[0.5, 1, 5, 6.5], [-2, 3, 4, 9], [2, 2, 2.5, 2.2], [6, 0, 10, 4]],
                                           np.float32)), const(np.array([1, 0, 1, 1], np.int64))],
       {"mode": mode, "output_height": 3, "output_width": 2, "spatial_scale": 0.9, "sampling_ratio": ratio,
        "half_pixel": hp}) for mode in ("avg", "max") for ratio, hp in ((0, 1), (2, 0))],
    # positions inside and outside the input on both sides of each axis (grid in [-1.5, 1.5]: a quarter beyond), every
    # mode and padding, 1 to 3 spatial dims
    *[(f"GridSample-{mode}-{pad}-align{align}", "GridSample", [normal(2, 3, 4, 5), uniform(-1.5, 1.5, 2, 3, 3, 2)],
       {"mode": mode, "padding_mode": pad, "align_corners": align})
      for mode, pad, align in (("linear", "zeros", 0), ("linear", "border", 1), ("linear", "reflection", 0),
                               ("cubic", "zeros", 1), ("cubic", "border", 0), ("cubic", "reflection", 1),
                               ("nearest", "zeros", 0), ("nearest", "reflection", 1))],
    ("GridSample-1d", "GridSample", [normal(2, 2, 6), uniform(-1.2, 1.2, 2, 5, 1)],
     {"mode": "linear", "padding_mode": "zeros", "align_corners": 0}),
    ("GridSample-3d", "GridSample", [normal(1, 2, 3, 4, 3), uniform(-1.2, 1.2, 1, 2, 2, 3, 3)],
     {"mode": "linear", "padding_mode": "reflection", "align_corners": 0}),
    ("GridSample-3d-cubic", "GridSample", [normal(1, 2, 3, 4, 3), uniform(-1.2, 1.2, 1, 2, 1, 2, 3)],
     {"mode": "cubic", "padding_mode": "border", "align_corners": 1}),
    # zero updates: one alone at its target (row 0), two at one target (row 1)
    ("ScatterElements-mul-zeros", "ScatterElements", [normal(3, 4), const([[1, 2, 2], [0, 0, 3]]), with_zeros(2, 3)],
     {"axis": 1, "reduction": "mul"}),
]
# BatchNormalization has no kernel (passes fold it into a Conv or Mul + Add before planning): host check only
HOST_ONLY = ("BatchNormalization",)


def ops_with_rules():
    return sorted(name for name, op in OPS.items() if type(op).grad is not Op.grad)


def test_every_differentiable_op_has_a_rule():
    missing = [name for name in OPS if name not in NOT_DIFFERENTIATED and name not in MISSING and
               name not in ops_with_rules()]
    assert not missing, f"differentiable ops without a gradient rule: {missing} (write one, or list the op in " \
                        f"NOT_DIFFERENTIATED with the reason)"
    stale = [name for name in list(NOT_DIFFERENTIATED) + list(MISSING) if name not in OPS or name in ops_with_rules()]
    assert not stale, f"listed as without a rule but unknown or with one: {stale}"


def test_every_rule_has_a_case():
    cases = CASES + test_autodiff.CASES
    covered = {op for _, op, _, _ in cases} | set(test_autodiff.SKIPPED)
    missing = [name for name in ops_with_rules() if name not in covered]
    assert not missing, f"ops with a gradient rule but no central-difference case: {missing}"
    modes = {attrs["mode"] for _, op, _, attrs in cases if op == "Reduce"}
    assert modes == set(REDUCE_NP), set(REDUCE_NP) - modes
    reductions = {attrs["reduction"] for _, op, _, attrs in cases if op == "ScatterElements"}
    assert reductions == {"none", "add", "mul", "max", "min"}


def make_inputs(specs, seed):
    rng = np.random.default_rng(seed)
    return [draw(spec, rng) for spec in specs]


def host_gradients(op, attrs, arrays, w, monkeypatch, constant=()):
    """(loss, [d loss / d x for each float input not in `constant`]) in float64 on the host: the backward graph
    from autodiff evaluated node by node through the ops' numpy forms (the kernels' dtype limits lifted)."""
    for spec in OPS.values():
        monkeypatch.setattr(spec, "dtypes", None)
    g = Graph("host")
    b = Builder(g)
    inputs = [g.add_input(f"x{i}", "float64", a.shape) if a.dtype.kind == "f" and i not in constant else
              g.constant(a) for i, a in enumerate(arrays)]
    xs = [v for v in inputs if v.const is None]
    y = b.op(op, inputs, dict(attrs))
    prod = b.op("Mul", [y, b.const(w)])
    loss = b.op("Reduce", [prod], {"mode": "sum", "axes": tuple(range(prod.rank)), "keepdims": 0})
    grads = gradients(g, loss, xs)
    values = {v.id: arrays[int(v.name[1:])] for v in xs}
    for node in g.nodes:
        assert node.spec.numpy is not None, f"{node.op} has no numpy form"
        ins = [None if v is None else (v.const if v.const is not None else values[v.id]) for v in node.inputs]
        for out, a in zip(node.outputs, node.spec.numpy(node, *ins)):
            values[out.id] = np.asarray(a).reshape(out.shape)
    read = [v.const if v.const is not None else values[v.id] for v in [loss] + grads]
    return float(read[0]), read[1:]


def check(op, specs, attrs, on_device, monkeypatch=None, seed=0):
    arrays = make_inputs(specs, seed)
    constant = {i for i, spec in enumerate(specs) if spec[0] == "const"}
    y = host_forward(op, attrs, arrays)
    w = np.random.default_rng(seed + 100).standard_normal(y.shape)
    if on_device:
        loss, grads = device_gradients(op, attrs, arrays, w, fed_weights=True, constant=constant)
    else:
        loss, grads = host_gradients(op, attrs, arrays, w, monkeypatch, constant)
    ref_loss = float((y * w).sum())
    assert abs(loss - ref_loss) <= 1e-4 * max(1.0, abs(ref_loss)), (loss, ref_loss)
    errors = []
    for i, g in zip([i for i, a in enumerate(arrays) if a.dtype.kind == "f" and i not in constant], grads):
        fd = central_differences(op, attrs, arrays, w, i)
        assert g.shape == fd.shape, (i, g.shape, fd.shape)
        errors.append(rel_l2(g, fd))
    return errors


DEVICE_CASES = [c for c in CASES if c[1] not in HOST_ONLY]


@pytest.mark.parametrize("case_id,op,specs,attrs", DEVICE_CASES, ids=[c[0] for c in DEVICE_CASES])
def test_device_gradient_matches_central_differences(case_id, op, specs, attrs):
    errors = check(op, specs, attrs, on_device=True)
    assert max(errors) <= TOL, f"{case_id}: relative L2 error per input {errors}"


@pytest.mark.parametrize("case_id,op,specs,attrs", CASES, ids=[c[0] for c in CASES])
def test_host_gradient_matches_central_differences(case_id, op, specs, attrs, monkeypatch):
    errors = check(op, specs, attrs, on_device=False, monkeypatch=monkeypatch)
    assert max(errors) <= HOST_TOL, f"{case_id}: relative L2 error per input {errors}"


def _stats_loss(x, scale, bias, w, eps):
    """sum(y w0) + sum(mean w1) + sum(inv w2) of LayerNormalization-17's three outputs, float64"""
    mean = x.mean(axis=-1, keepdims=True)
    inv = 1 / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + eps)
    return float(((x - mean) * inv * scale + bias).ravel() @ w[0].ravel() + mean.ravel() @ w[1].ravel() +
                 inv.ravel() @ w[2].ravel())


def test_layernorm_stats_outputs_carry_their_gradients():
    """LayerNormalization-17's Mean and InvStdDev read by the loss too: dx takes their parts (d mean / dx = 1 / D,
    d inv / dx = -inv^2 xhat / D), on the device, against float64 central differences."""
    rng = np.random.default_rng(7)
    x, scale, bias = rng.standard_normal((3, 6)) * 2 + 0.5, rng.uniform(0.5, 2, 6), rng.standard_normal(6)
    w = [rng.standard_normal((3, 6)), rng.standard_normal((3, 1)), rng.standard_normal((3, 1))]
    eps = 1e-2
    g = Graph("stats")
    b = Builder(g)
    xs = [g.add_input(n, "float32", a.shape) for n, a in (("x", x), ("scale", scale), ("bias", bias))]
    outs = b.op("LayerNormStats", xs, {"epsilon": eps}, n_out=3)
    ws = [g.add_input(f"w{i}", "float32", a.shape) for i, a in enumerate(w)]
    terms = [b.op("Reduce", [b.op("Mul", [o, wv])], {"mode": "sum", "axes": (0, 1), "keepdims": 0})
             for o, wv in zip(outs, ws)]
    loss = b.op("Add", [b.op("Add", terms[:2]), terms[2]])
    grads = gradients(g, loss, xs)
    g.outputs, g.output_names = [loss] + grads, ["loss", "dx", "dscale", "dbias"]
    run_passes(g, [fold_constants, fuse_pointwise, remove_dead])
    plan = Plan(context(), g)
    try:
        got = plan.run([a.astype(np.float32) for a in [x, scale, bias] + w])
    finally:
        plan.release()
    assert abs(float(got[0]) - _stats_loss(x, scale, bias, w, eps)) <= 1e-4 * abs(_stats_loss(x, scale, bias, w, eps))
    arrays = [x.copy(), scale.copy(), bias.copy()]
    for k, dx in enumerate(got[1:]):
        fd = np.zeros_like(arrays[k])
        for i in np.ndindex(fd.shape):
            keep = arrays[k][i]
            arrays[k][i] = keep + 1e-6
            up = _stats_loss(*arrays, w, eps)
            arrays[k][i] = keep - 1e-6
            down = _stats_loss(*arrays, w, eps)
            arrays[k][i] = keep
            fd[i] = (up - down) / 2e-6
        assert rel_l2(dx, fd) <= TOL, (k, rel_l2(dx, fd))


def test_a_wrong_rule_is_caught_on_the_host(monkeypatch):
    """The float64 checker itself: an Erf rule off by a factor sqrt(2) must fail it."""
    def wrong(self, b, node, dys):
        x = node.inputs[0]
        gauss = b.op("Exp", [b.op("Neg", [b.op("Mul", [x, x])])])
        return [b.op("Mul", [dys[0], b.op("Mul", [gauss, b.const(np.asarray(np.sqrt(2 / np.pi), x.dtype))])])]

    monkeypatch.setattr(type(OPS["Erf"]), "grad", wrong)
    errors = check("Erf", [normal(2, 3, 4)], {}, on_device=False, monkeypatch=monkeypatch)
    assert max(errors) > 0.1, errors


def lrn_by_the_spec(x, size, alpha, beta, bias):
    """ONNX's LRN text, one channel at a time: the window is c - floor((size - 1) / 2) .. c + ceil((size - 1) / 2)."""
    sq = np.zeros_like(x, np.float64)
    for c in range(x.shape[1]):
        lo, hi = max(0, c - (size - 1) // 2), min(x.shape[1] - 1, c + -(-(size - 1) // 2))
        sq[:, c] = (x[:, lo:hi + 1].astype(np.float64) ** 2).sum(axis=1)
    return x / (bias + alpha / size * sq) ** beta


def test_lrn_numpy_matches_the_spec_and_onnxruntime():
    """LRN's numpy form (the gradient check's forward) is ONNX's LRN: against the spec's text for every size, and
    onnxruntime for the odd ones it takes (onnx.reference's LRN loops over the batch where it means channels)."""
    x = np.random.default_rng(1).standard_normal((2, 6, 3, 3)).astype(np.float32)
    for size in (1, 2, 3, 4, 5):
        attrs = {"size": size, "alpha": 0.4, "beta": 0.7, "bias": 1.5}
        g = Graph()
        got = Builder(g).op("LRN", [g.constant(x)], attrs).const
        assert rel_l2(got, lrn_by_the_spec(x, **attrs)) <= 1e-6, size
        if size % 2:
            ort = pytest.importorskip("onnxruntime")
            node = helper.make_node("LRN", ["x"], ["y"], **attrs)
            graph = helper.make_graph([node], "lrn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)
            session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            assert rel_l2(got, session.run(None, {"x": x})[0]) <= 1e-6, size


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("ratio,coords", [(0, "half_pixel"), (2, "output_half_pixel")])
def test_roialign_numpy_matches_onnx_reference(mode, ratio, coords):
    """RoiAlign's numpy form (the gradient check's forward) is onnx.reference's RoiAlign."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 7, 8)).astype(np.float32)
    rois = np.array([[0.5, 1, 5, 6.5], [-2, 3, 4, 9], [2, 2, 2.5, 2.2], [6, 0, 10, 4]], np.float32)
    batch = np.array([1, 0, 1, 1], np.int64)
    attrs = {"mode": mode, "output_height": 3, "output_width": 2, "spatial_scale": 0.9, "sampling_ratio": ratio}
    node = helper.make_node("RoiAlign", ["x", "rois", "batch"], ["y"], coordinate_transformation_mode=coords, **attrs)
    graph = helper.make_graph([node], "roi", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape),
                                              helper.make_tensor_value_info("rois", TensorProto.FLOAT, rois.shape),
                                              helper.make_tensor_value_info("batch", TensorProto.INT64, batch.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)], ir_version=8)
    want = reference(model, {"x": x, "rois": rois, "batch": batch})[0]
    g = Graph()
    got = Builder(g).op("RoiAlign", [g.constant(x), g.constant(rois), g.constant(batch)],
                        dict(attrs, half_pixel=int(coords == "half_pixel"))).const
    assert rel_l2(got, want) <= 1e-6


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("spatial", [(4, 5), (3, 4, 3)])
def test_gridsample_numpy_matches_onnx_reference(mode, padding, spatial):
    """GridSample's numpy form (the gradient check's forward) is onnx.reference's GridSample-20 (each align_corners;
    positions well outside the input, reflected several times), to the reference's own float32 rounding of the
    denormalised coordinates (the numpy form keeps float64 there: central differences of 1e-6 need it)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3) + spatial)
    grid = rng.uniform(-3.5, 3.5, (2, 2, 3, len(spatial)) if len(spatial) == 2 else (2, 2, 2, 3, 3))
    for align in (0, 1):
        attrs = {"mode": mode, "padding_mode": padding, "align_corners": align}
        node = helper.make_node("GridSample", ["x", "grid"], ["y"], **attrs)
        graph = helper.make_graph([node], "gs", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, x.shape),
                                                 helper.make_tensor_value_info("grid", TensorProto.DOUBLE, grid.shape)],
                                  [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)
        want = reference(model, {"x": x, "grid": grid})[0]
        g = Graph()
        got = Builder(g).op("GridSample", [g.constant(x), g.constant(grid)], attrs).const
        assert rel_l2(got, want) <= 1e-5, (align, rel_l2(got, want))


def test_piecewise_constant_ops_pass_no_gradient():
    """A weight read only through Floor feeds no differentiable path (None); through Floor and Mul, only Mul's
    part arrives (PyTorch: floor's gradient is zero)."""
    for name in ("Floor", "Ceil", "Round", "Sign"):
        assert OPS[name].differentiable is False, name
    g = Graph()
    b = Builder(g)
    only, both = g.add_input("only", "float32", (3,)), g.add_input("both", "float32", (3,))
    s = b.op("Add", [b.op("Floor", [only]), b.op("Mul", [b.op("Round", [both]), both])])
    loss = b.op("Reduce", [s], {"mode": "sum", "axes": (0,), "keepdims": 0})
    d_only, d_both = gradients(g, loss, [only, both])
    assert d_only is None
    assert d_both is not None and d_both.producer.op == "Mul" and d_both.producer.inputs[1].producer.op == "Round"


# Kinks at exactly the kink, against torch autograd: (id, dlnet op, attrs, torch function of the float inputs,
# inputs). Each input holds the kink points and a few random values.
def _kinks(points, n=12, seed=0):
    rng = np.random.default_rng(seed)
    return np.concatenate([np.asarray(points, np.float64), rng.uniform(-4, 4, n - len(points))]).reshape(3, -1)


def _kink_cases(torch):
    F = torch.nn.functional
    ties = np.array([[1.0, 3.0, 3.0, -1.0], [2.0, 2.0, 2.0, 0.5], [0.0, -1.0, 0.5, 0.5]])
    other = np.array([[1.0, 2.0, 3.0, 0.0], [2.0, 2.5, 1.0, 0.5], [0.0, -1.0, 0.4, 0.6]])
    return [
        ("Relu", "Relu", {}, torch.relu, [_kinks([0.0, 0.0])]),
        ("LeakyRelu", "LeakyRelu", {"alpha": 0.1}, lambda x: F.leaky_relu(x, 0.1), [_kinks([0.0])]),
        ("Elu", "Elu", {"alpha": 0.7}, lambda x: F.elu(x, 0.7), [_kinks([0.0])]),
        ("Selu", "Selu", {}, F.selu, [_kinks([0.0])]),
        ("Celu", "Celu", {"alpha": 1.5}, lambda x: F.celu(x, 1.5), [_kinks([0.0])]),
        ("HardSigmoid", "HardSigmoid", {"alpha": 1 / 6, "beta": 0.5}, F.hardsigmoid, [_kinks([-3.0, 3.0])]),
        ("HardSwish", "HardSwish", {}, F.hardswish, [_kinks([-3.0, 3.0])]),
        ("ThresholdedRelu", "ThresholdedRelu", {"alpha": 1.0}, lambda x: F.threshold(x, 1.0, 0.0),
         [_kinks([1.0])]),
        ("Shrink-soft", "Shrink", {"lambd": 0.5, "bias": 0.5}, lambda x: F.softshrink(x, 0.5),
         [_kinks([-0.5, 0.5])]),
        ("Shrink-hard", "Shrink", {"lambd": 0.5, "bias": 0.0}, lambda x: F.hardshrink(x, 0.5),
         [_kinks([-0.5, 0.5])]),
        ("Clip", "Clip", {"min": -0.5, "max": 0.5}, lambda x: torch.clamp(x, -0.5, 0.5), [_kinks([-0.5, 0.5])]),
        ("Abs", "Abs", {}, torch.abs, [_kinks([0.0])]),
        ("PRelu", "PRelu", {}, lambda x, s: F.prelu(x, s.reshape(-1)),
         [_kinks([0.0, 0.0, 0.0], n=24).reshape(2, 3, 4), np.array([0.25, -0.5, 2.0]).reshape(3, 1)]),
        ("Max-ties", "Max", {}, torch.maximum, [ties, other]),
        ("Min-ties", "Min", {}, torch.minimum, [ties, other]),
        ("Reduce-max-ties", "Reduce", {"mode": "max", "axes": (1,), "keepdims": 0},
         lambda x: torch.amax(x, 1), [ties]),
        ("Reduce-min-ties", "Reduce", {"mode": "min", "axes": (0,), "keepdims": 1},
         lambda x: torch.amin(x, 0, keepdim=True), [ties]),
        ("Reduce-prod-zeros", "Reduce", {"mode": "prod", "axes": (1,), "keepdims": 0},
         lambda x: torch.prod(x, 1), [np.array([[0.0, 2.0, 3.0, 0.5], [0.0, 0.0, 1.5, 2.0], [1.0, 2.0, 0.5, 3.0]])]),
        ("Reduce-l2-zero", "Reduce", {"mode": "l2", "axes": (1,), "keepdims": 0},
         lambda x: torch.linalg.vector_norm(x, 2, 1), [np.array([[0.0] * 4, [1.0, -2.0, 0.5, 0.0]])]),
        ("Reduce-l1-zero", "Reduce", {"mode": "l1", "axes": (1,), "keepdims": 0},
         lambda x: torch.linalg.vector_norm(x, 1, 1), [np.array([[0.0, 1.0, -2.0, 0.0]])]),
        ("Pow-zeros", "Pow", {}, torch.pow, [np.array([[0.0, 0.0, 0.0, 2.0], [1.5, 0.0, 3.0, 0.5]]),
                                             np.array([[0.0, 1.0, 2.0, 0.0], [-1.0, 3.0, 0.5, 2.0]])]),
        ("ScatterElements-max-ties", "ScatterElements", {"axis": 1, "reduction": "max"},
         lambda x, u: torch.scatter_reduce(x, 1, torch.tensor([[1, 1, 0], [0, 2, 2]]), u, "amax"),
         [np.array([[1.0, 2.0, 0.5], [3.0, 0.0, 1.0]]), np.array([[1, 1, 0], [0, 2, 2]]),
          np.array([[2.0, 2.0, 0.5], [3.0, 1.0, 1.0]])]),
        ("Mod-floor", "Mod", {"fmod": 0}, torch.remainder,
         [np.array([[2.5, -2.5, 7.0], [0.5, -7.5, 1.0]]), np.array([[2.0, 2.0, -3.0], [-2.0, 2.0, 3.0]])]),
        ("Mod-fmod", "Mod", {"fmod": 1}, torch.fmod,
         [np.array([[2.5, -2.5, 7.0], [0.5, -7.5, 1.0]]), np.array([[2.0, 2.0, -3.0], [-2.0, 2.0, 3.0]])]),
    ]


KINK_IDS = ["Relu", "LeakyRelu", "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish", "ThresholdedRelu",
            "Shrink-soft", "Shrink-hard", "Clip", "Abs", "PRelu", "Max-ties", "Min-ties", "Reduce-max-ties",
            "Reduce-min-ties", "Reduce-prod-zeros", "Reduce-l2-zero", "Reduce-l1-zero", "Pow-zeros",
            "ScatterElements-max-ties", "Mod-floor", "Mod-fmod"]


@pytest.mark.parametrize("case_id", KINK_IDS)
def test_kinks_follow_torch(case_id):
    torch = pytest.importorskip("torch")
    case = {c[0]: c for c in _kink_cases(torch)}[case_id]
    _, op, attrs, fn, arrays = case
    arrays = [a if a.dtype.kind != "f" else a.astype(np.float32).astype(np.float64) for a in arrays]
    floats = [a for a in arrays if a.dtype.kind == "f"]
    ts = [torch.tensor(a, requires_grad=True) for a in floats]
    y = fn(*ts)
    w = np.random.default_rng(5).standard_normal(tuple(y.shape))
    (y * torch.tensor(w)).sum().backward()
    _, grads = device_gradients(op, attrs, arrays, w.reshape(y.shape), fed_weights=True)
    for g, t in zip(grads, ts):
        want = t.grad.numpy()
        assert rel_l2(g, want) <= 1e-5, (case_id, g, want)


# One SGD step of a small model through dlnet.Trainer against torch: the loss before and the drop after.
def _activation_net(torch):
    nn, F = torch.nn, torch.nn.functional

    class Activations(nn.Module):
        """Conv -> PReLU -> every activation ONNX has an op for -> Linear, with trigonometric ops, Pow, Where,
        Max / Min, gather / scatter and the reductions on the logits"""

        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)
            self.prelu = nn.PReLU(4, init=0.2)
            self.fc = nn.Linear(4 * 6 * 6, 5)
            self.register_buffer("idx", torch.tensor([[0, 2, 2, 1, 4]]).repeat(4, 1))

        def forward(self, x):
            h = self.prelu(self.conv(x))
            a = F.elu(h, 0.7) + F.selu(h) + F.celu(h, 1.5) + F.leaky_relu(h, 0.1) + F.softsign(h) + \
                F.hardsigmoid(h) + F.hardswish(h) + F.hardshrink(h, 0.3) + F.softshrink(h, 0.2)
            a = a + torch.erf(h) + torch.sin(h) * torch.cos(h) + torch.atan(h) + torch.acos(torch.tanh(h) * 0.9)
            a = torch.where(h > 0, a, h * 0.5) + torch.maximum(a, h) - torch.minimum(a, h * 0.3)
            a = a + torch.pow(h.abs() + 1, 1.5)
            o = self.fc(a.flatten(1) * 0.1)
            o = o + torch.gather(o, 1, self.idx) * 0.5
            o = o.scatter_add(1, self.idx[:, :2], o[:, 1:3])
            return o + torch.amax(o, 1, keepdim=True) * 0.1 + torch.logsumexp(o, 1, keepdim=True) * 0.1 + \
                torch.linalg.vector_norm(o, 2, 1, keepdim=True) * 0.1 + torch.prod(torch.sigmoid(o), 1, keepdim=True)

    torch.manual_seed(0)
    return Activations()


def _export(torch, model, x, opset):
    import io

    import onnx
    f = io.BytesIO()
    model.eval()
    torch.onnx.export(model, (torch.from_numpy(x),), f, opset_version=opset, dynamo=False,
                      do_constant_folding=False, input_names=["input"], output_names=["output"])
    model.train()
    return onnx.load_from_string(f.getvalue())


def _data(n=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 3, 6, 6)).astype(np.float32), rng.integers(0, 5, n)


@pytest.mark.parametrize("opset", [13, 17])
def test_sgd_step_matches_torch(opset):
    torch = pytest.importorskip("torch")
    x, y = _data()
    model = _activation_net(torch)
    proto = _export(torch, model, x, opset)
    lr = 0.01
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(ref.parameters(), lr=lr)
    ref_loss = torch.nn.functional.cross_entropy(ref(torch.from_numpy(x)), torch.from_numpy(y))
    ref_loss.backward()
    opt.step()
    ref_after = torch.nn.functional.cross_entropy(ref(torch.from_numpy(x)), torch.from_numpy(y)).item()
    net = dlnet.Net(context()).load_onnx(proto)
    tr = dlnet.Trainer(net, optimizer=dlnet.optim.SGD(lr=lr), params=[n for n, _ in model.named_parameters()])
    loss = tr.step({"input": x, "target": y})
    after = tr.step({"input": x, "target": y})  # the loss of the updated weights
    assert abs(loss - ref_loss.item()) <= 1e-4 * abs(ref_loss.item()), (loss, ref_loss.item())
    drop, ref_drop = loss - after, ref_loss.item() - ref_after
    assert ref_drop > 0.01, ref_drop  # the step moves the loss well above float rounding
    assert abs(drop - ref_drop) <= 1e-4 * abs(ref_drop), (drop, ref_drop)


# Trainer(params=, frozen=): which initializers train
def _scaled_model():
    """y = (x @ w + b) ^ p * scale: w and b weights; p (the exponent) and scale constants an exporter made
    initializers; k an int64 initializer; f read only through Floor."""
    rng = np.random.default_rng(3)
    inits = {"w": rng.standard_normal((6, 5)).astype(np.float32), "b": rng.standard_normal(5).astype(np.float32),
             "p": np.array(2.0, np.float32), "scale": np.array(0.5, np.float32), "k": np.array([1], np.int64),
             "f": np.array(1.7, np.float32)}
    nodes = [helper.make_node("MatMul", ["input", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Pow", ["hb", "p"], ["sq"]), helper.make_node("Mul", ["sq", "scale"], ["m"]),
             helper.make_node("Floor", ["f"], ["ff"]), helper.make_node("Add", ["m", "ff"], ["output"])]
    graph = helper.make_graph(nodes, "scaled", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [4, 6])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, [4, 5])],
                              [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)


def _step(**kw):
    net = dlnet.Net(context()).load_onnx(_scaled_model())
    before = net.state_dict()
    tr = dlnet.Trainer(net, loss="mse", optimizer=dlnet.optim.SGD(lr=0.01), **kw)
    rng = np.random.default_rng(4)
    tr.step({"input": rng.standard_normal((4, 6)).astype(np.float32),
             "target": rng.standard_normal((4, 5)).astype(np.float32)})
    after = net.state_dict()
    return {n for n in before if not np.array_equal(before[n], after[n])}, tr


def test_default_trains_every_float_initializer_on_a_differentiable_path():
    moved, tr = _step()
    assert moved == {"w", "b", "p", "scale"}  # f: only through Floor; k: int64 (and unused)
    assert sorted(tr._active.unused) == ["f"]


def test_params_names_what_trains():
    moved, _ = _step(params=["w", "b"])
    assert moved == {"w", "b"}


def test_frozen_leaves_the_rest():
    moved, _ = _step(frozen=["p", "scale"])
    assert moved == {"w", "b"}
    moved, _ = _step(params=["w", "b", "p"], frozen=["p"])
    assert moved == {"w", "b"}


@pytest.mark.parametrize("kw,name", [({"params": ["w", "nope"]}, "nope"), ({"frozen": ["k"]}, "k"),
                                     ({"params": "w"}, "string")])
def test_unknown_or_non_float_names_are_input_errors(kw, name):
    net = dlnet.Net(context()).load_onnx(_scaled_model())
    with pytest.raises(InputError, match=name):
        dlnet.Trainer(net, loss="mse", **kw)
