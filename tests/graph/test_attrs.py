"""Op attributes declared once (Op.attrs, filled when a node is made) and the one convolution geometry."""
import numpy as np
import pytest

import dlnet
from dlnet.graph.ir import Builder, Graph, Node
from dlnet.graph.ops import OPS, REQUIRED
from dlnet.graph.ops.nn import ConvGeometry, conv_geometry


def _old_conv_dims(x_shape, dy_shape, w_shape, attrs):
    """grad_nn._conv_dims as it was before the geometry was computed in one place (the oracle of the alias)."""
    nsp = len(x_shape) - 2
    strides = list(attrs.get("strides") or [1] * nsp)
    pads = list(attrs.get("pads") or [0] * 2 * nsp)[:nsp]
    dil = list(attrs.get("dilations") or [1] * nsp)
    if nsp == 1:
        return 1, x_shape[2], 1, dy_shape[2], 1, w_shape[2], [1] + strides, [0] + pads, [1] + dil
    if nsp != 2:
        raise dlnet.ModelError(f"{nsp}-D convolution/pool gradients are not supported (1-D and 2-D are)")
    return (x_shape[2], x_shape[3], dy_shape[2], dy_shape[3], w_shape[2], w_shape[3], strides, pads, dil)


def _graph(x_shape):
    g = Graph()
    return g, Builder(g), g.add_input("x", "float32", x_shape)


def _weights(b, shape):
    return b.const(np.zeros(shape, np.float32))


# ------------------------------------------------------------------------------------------ declarations ----------
def test_node_fills_absent_attributes_from_the_declaration():
    g, b, x = _graph((2, 4, 9, 9))
    y = b.op("Conv", [x, _weights(b, (6, 4, 3, 3))], {"pads": (1, 1, 1, 1)})
    conv = y.producer
    assert conv.attrs == {"pads": (1, 1, 1, 1), "strides": (1, 1), "dilations": (1, 1), "group": 1}
    assert y.shape == (2, 6, 9, 9)
    for key in ("act", "winograd", "tap_major", "prologue", "in_perm"):  # pass attributes stay absent
        assert key not in conv.attrs and key in conv.spec.pass_attrs
    given = {"strides": (2, 1), "pads": (0, 1, 2, 1), "dilations": (1, 2), "group": 2}
    assert b.op("Conv", [x, _weights(b, (6, 2, 3, 3))], given).producer.attrs == given
    g1, b1, x1 = _graph((2, 4, 10))
    assert b1.op("Conv", [x1, _weights(b1, (3, 4, 5))]).producer.attrs == {
        "strides": (1,), "pads": (0, 0), "dilations": (1,), "group": 1}
    m = b.op("MaxPool", [y], {"kernel_shape": (2, 2), "strides": (2, 2)}).producer
    assert m.attrs == {"kernel_shape": (2, 2), "strides": (2, 2), "pads": (0, 0, 0, 0), "dilations": (1, 1),
                       "ceil_mode": 0}
    avg = b.op("AveragePool", [y], {"kernel_shape": (3, 3)}).producer
    assert avg.attrs["count_include_pad"] == 0 and avg.attrs["ceil_mode"] == 0


def test_present_values_are_never_replaced_even_when_falsy():
    g, b, x = _graph((3,))
    assert Node("LeakyRelu", [x], [], {"alpha": 0.0}).attrs == {"alpha": 0.0}
    assert Node("LeakyRelu", [x], [], {}).attrs == {"alpha": 0.01}
    assert Node("Clip", [x], [], {"min": 0.0}).attrs == {"min": 0.0, "max": None}
    assert Node("Gemm", [], [], {"transB": 1}).attrs == {"transB": 1, "transA": 0, "alpha": 1.0, "beta": 1.0}
    # a default sized by the spatial rank needs the first input; required attributes are never made up
    assert Node("Conv", [], [], {}).attrs == {"group": 1}
    assert Node("Reshape", [x], [], {}).attrs == {}
    assert Node("NoSuchOp", [x], [], {"k": 1}).attrs == {"k": 1}


def test_every_declaration_is_well_formed():
    for name, op in OPS.items():
        assert isinstance(op.attrs, dict) and isinstance(op.pass_attrs, dict), name
        assert not set(op.attrs) & set(op.pass_attrs), name
        for key, default in op.attrs.items():
            if callable(default) and default is not REQUIRED:
                for nsp in (1, 2, 3):
                    assert len(default(nsp)) in (nsp, 2 * nsp), (name, key)


def test_filled_attributes_print_after_the_given_ones():
    g, b, x = _graph((1, 2, 5, 5))
    y = b.op("Conv", [x, _weights(b, (4, 2, 3, 3)), b.const(np.zeros(4, np.float32))], {"pads": (1, 1, 1, 1)})
    g.outputs, g.output_names = [y], ["y"]
    line = str(g).splitlines()[2].strip()
    assert line == "%3: f32[1,4,5,5] = Conv(%0, $1, $2) {pads=(1,1,1,1), strides=(1,1), dilations=(1,1), group=1}"


# ------------------------------------------------------------------------------------------ geometry --------------
CASES = [  # x spatial, kernel, strides, pads (begins + ends), dilations, group
    ((9, 9), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
    ((16, 15), (3, 3), (2, 2), (0, 1, 0, 1), (1, 1), 1),
    ((11, 7), (5, 3), (2, 1), (2, 1, 2, 1), (2, 1), 2),
    ((8, 8), (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
    ((12, 12), (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 4),
    ((20,), (5,), (3,), (2, 2), (2,), 1),
    ((9,), (3,), (1,), (0, 1), (1,), 2),
]


@pytest.mark.parametrize("spatial, kernel, strides, pads, dil, group", CASES)
def test_conv_geometry_of_conv_and_its_gradients(spatial, kernel, strides, pads, dil, group):
    n, c, k = 2, 4, 8
    g, b, x = _graph((n, c) + spatial)
    attrs = {"strides": strides, "pads": pads, "dilations": dil, "group": group}
    w = _weights(b, (k, c // group) + kernel)
    y = b.op("Conv", [x, w], attrs)
    geo = conv_geometry(y.producer)
    assert (geo.N, geo.C, geo.K, geo.group) == (n, c, k, group)
    assert geo.in_size == spatial and geo.kernel == kernel and geo.out_size == y.shape[2:]
    assert (geo.strides, geo.pads, geo.dilations) == (strides, pads, dil)
    assert geo.one_d == (len(spatial) == 1) and geo.begin_pads == pads[:len(spatial)]
    assert geo.symmetric == (pads[:len(spatial)] == pads[len(spatial):])
    # the 2-D view the kernels take, against the old derivation
    old = _old_conv_dims(x.shape, y.shape, w.shape, attrs)
    assert (geo.H, geo.W, geo.OH, geo.OW, geo.KH, geo.KW) == old[:6]
    assert [list(geo.strides_2d), list(geo.pads_2d), list(geo.dilations_2d)] == list(old[6:])
    dy = g.add_input("dy", "float32", y.shape)
    gx = b.op("ConvGradX", [dy, w], dict(y.producer.attrs, x_shape=x.shape)).producer
    gw = b.op("ConvGradW", [dy, x], dict(y.producer.attrs, w_shape=w.shape)).producer
    assert conv_geometry(gx) == geo and conv_geometry(gw) == geo


def test_conv_geometry_reads_every_weight_layout():
    g, b, x = _graph((1, 8, 10, 10))
    attrs = {"pads": (1, 1, 1, 1)}
    plain = conv_geometry(b.op("Conv", [x, _weights(b, (16, 8, 3, 3))], attrs).producer)
    tap_major = conv_geometry(b.op("Conv", [x, _weights(b, (16, 3, 3, 8))], dict(attrs, tap_major=1)).producer)
    winograd = conv_geometry(b.op("Conv", [x, _weights(b, (4, 4, 16, 8))], dict(attrs, winograd=1)).producer)
    assert plain == tap_major == winograd
    assert (plain.K, plain.kernel, plain.out_size) == (16, (3, 3), (10, 10))
    with pytest.raises(dlnet.ModelError, match="input has 8 channels, weights \\[16, 3, 3, 3\\] with group=1 expect 3"):
        b.op("Conv", [x, _weights(b, (16, 3, 3, 3))], attrs)


@pytest.mark.parametrize("ceil_mode", [0, 1])
def test_conv_geometry_of_pools_and_their_gradient(ceil_mode):
    g, b, x = _graph((2, 3, 11, 10))
    attrs = {"kernel_shape": (3, 3), "strides": (2, 2), "pads": (1, 0, 1, 0), "ceil_mode": ceil_mode}
    for op in ("MaxPool", "AveragePool"):
        y = b.op(op, [x], attrs)
        geo = conv_geometry(y.producer)
        assert (geo.N, geo.C, geo.K, geo.group, geo.kernel) == (2, 3, 3, 3, (3, 3))
        assert y.shape == (2, 3) + geo.out_size == ((2, 3, 6, 5) if ceil_mode else (2, 3, 6, 4))
        grad = b.op("PoolGrad", [g.add_input("dy", "float32", y.shape), x], dict(y.producer.attrs, mode="max"))
        assert conv_geometry(grad.producer) == geo
        w_shape = (1, 1) + attrs["kernel_shape"]
        old = _old_conv_dims(x.shape, y.shape, w_shape, attrs)
        assert (geo.H, geo.W, geo.OH, geo.OW, geo.KH, geo.KW) == old[:6]
        assert [list(geo.strides_2d), list(geo.pads_2d), list(geo.dilations_2d)] == list(old[6:])


def test_three_d_windows_infer_but_have_no_2d_view():
    g, b, x = _graph((1, 2, 6, 6, 6))
    y = b.op("Conv", [x, _weights(b, (3, 2, 3, 3, 3))], {"strides": (2, 2, 2)})
    geo = conv_geometry(y.producer)
    assert y.shape == (1, 3, 2, 2, 2) and geo.out_size == (2, 2, 2) and not geo.one_d
    with pytest.raises(dlnet.ModelError, match="3-D window has no 2-D view"):
        _ = geo.H


def test_conv_geometry_from_shapes_matches_the_nodes():
    for spatial, kernel, strides, pads, dil, group in CASES:
        attrs = {"strides": strides, "pads": pads, "dilations": dil}
        g, b, x = _graph((1, 4) + spatial)
        y = b.op("Conv", [x, _weights(b, (8, 4 // group) + kernel)], dict(attrs, group=group))
        assert ConvGeometry.from_shapes(x.shape, (8, 4 // group) + kernel, attrs, group=group) == \
            conv_geometry(y.producer)
