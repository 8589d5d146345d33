"""The printed IR: golden text of small graphs, and print -> parse -> print round trips (the reference CNNs, their
memory plans, every kind of attribute value), and the parser's errors, each naming its line."""
import math
import os
import re

import numpy as np
import onnx
import pytest

import dlnet
from dlnet.errors import ModelError
from dlnet.graph.ir import Builder, Graph, Node, Value
from dlnet.graph.memory import plan_memory
from dlnet.graph.parser import constants_of, graphs_equal, parse_graph
from dlnet.graph.passes.fuse import ChannelMap, fuse_conv_prologues, fuse_epilogues, fuse_pointwise
from dlnet.graph.printer import SHORT_DTYPES, atom_value, format_graph, format_node, format_value

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
# vgg19 and densenet121 are the long ones on a 2-core CPU (tests/onnx/test_models.py): opt-in, `pytest -m models`
_LONG = pytest.mark.models
LIGHT_MODELS = ["bvlc_alexnet", pytest.param("densenet121", marks=_LONG), "inception_v1", "inception_v2", "resnet50",
                "shufflenet", "squeezenet", pytest.param("vgg19", marks=_LONG), "zfnet512"]
R = np.random.default_rng(0)
CONV = {"strides": (1, 1), "pads": (1, 1, 1, 1), "dilations": (1, 1), "group": 1}


def f32(*shape):
    return R.standard_normal(shape).astype(np.float32)


def round_trip(graph, plan=None):
    """Parse the print of `graph` (with the original's constants) and check it is the same graph, printed alike."""
    text = format_graph(graph, plan)
    parsed = parse_graph(text, constants_of(graph))
    same, why = graphs_equal(parsed, graph)
    assert same, why
    assert format_graph(parsed, plan) == text
    assert parsed.verify()
    return parsed


def conv_relu_graph():
    """Conv (bias) -> Relu, the Relu fused as the Conv's epilogue."""
    g = Graph("convnet")
    b = Builder(g)
    x = g.add_input("x", "float32", (1, 2, 5, 5))
    c = b.op("Conv", [x, b.const(f32(4, 2, 3, 3)), b.const(f32(4))], dict(CONV), name="conv1")
    g.outputs, g.output_names = [b.op("Relu", [c], name="relu1")], ["y"]
    assert fuse_epilogues(g)
    return g


# ------------------------------------------------------------------ golden text ---------------------------------------
def test_conv_with_fused_bias_relu_and_schedule():
    g = conv_relu_graph()
    g.nodes[0].schedule.update(algo="winograd4", tile="128x64")
    assert format_graph(g) == "\n".join([
        'graph convnet(%0: f32[1,2,5,5] "x") {',
        "  # 2 constants ${...}, 0.00 MiB",
        "  %4: f32[1,4,5,5] = Conv(%0, $1, $2) {strides=(1,1), pads=(1,1,1,1), dilations=(1,1), group=1, "
        "act=(Relu, ()); algo=winograd4 tile=128x64}   # conv1",
        '  return %4 "y"',
        "}",
        "const $1: f32[4,2,3,3], $2: f32[4]"])
    parsed = round_trip(g)
    assert parsed.nodes[0].schedule == {"algo": "winograd4", "tile": "128x64"}
    assert parsed.nodes[0].attrs["act"] == ("Relu", ())


def test_gemm_with_leaky_relu_epilogue_and_hand_set_schedule():
    g = Graph("fc")
    b = Builder(g)
    x = g.add_input("x", "float32", (2, 8))
    y = b.op("Gemm", [x, b.const(f32(8, 3)), b.const(f32(3))], {"alpha": 1.0, "beta": 0.5}, name="fc")
    g.outputs, g.output_names = [b.op("LeakyRelu", [y], {"alpha": 0.1})], ["y"]
    assert fuse_epilogues(g)
    g.nodes[0].schedule.update(algo="gemv", tile="8x8", split_k=4)
    assert format_node(g.nodes[0]) == "%4: f32[2,3] = Gemm(%0, $1, $2) {alpha=1.0, beta=0.5, transA=0, transB=0, " \
                                      "act=(LeakyRelu, ((alpha, 0.1),)); algo=gemv tile=8x8 split_k=4}   # fc"
    parsed = round_trip(g)
    assert parsed.nodes[0].schedule == {"algo": "gemv", "tile": "8x8", "split_k": 4}
    assert type(parsed.nodes[0].schedule["split_k"]) is int


def fused_graph():
    """Add -> Mul -> Sigmoid, one Fused node."""
    g = Graph("chain")
    b = Builder(g)
    x = g.add_input("x", "float32", (2, 12))
    c = b.const(f32(12))
    b.node_name = "add"
    a = b.op("Add", [x, c])
    m = b.op("Mul", [a, c], name="mul")
    g.outputs, g.output_names = [b.op("Sigmoid", [m], name="out")], ["y"]
    assert fuse_pointwise(g)
    return g


def test_fused_pointwise_chain_prints_its_members_under_it():
    g = fused_graph()
    plan = plan_memory(g)
    assert format_graph(g, plan) == "\n".join([
        'graph chain(%0: f32[2,12] "x") {',
        "  # 1 constants ${...}, 0.00 MiB",
        "  %4: f32[2,12] = Fused(%0, $1) {nodes=[   # @ 0.00 MiB out",
        "      %2: f32[2,12] = Add(%0, $1)   # add",
        "      %3: f32[2,12] = Mul(%2, $1)   # mul",
        "      %4: f32[2,12] = Sigmoid(%3)   # out",
        "    ]}",
        '  return %4 "y"',
        "}",
        "const $1: f32[12]"])
    parsed = round_trip(g, plan)
    fused = parsed.nodes[0]
    assert [n.op for n in fused.attrs["nodes"]] == ["Add", "Mul", "Sigmoid"]
    assert fused.attrs["nodes"][-1].outputs[0] is fused.outputs[0]  # the last member writes the node's output
    assert fused.attrs["nodes"][0].outputs[0].producer is fused.attrs["nodes"][0]
    assert fused.attrs["nodes"][0].outputs[0].users == []  # members are not the users of anything


def test_long_values_go_to_a_table_after_the_graph():
    g = conv_relu_graph()
    g.nodes[0].attrs["in_perm"] = ChannelMap([1, 0])
    g.nodes[0].attrs["order"] = tuple(range(24))
    text = format_graph(g)
    assert "group=1, act=(Relu, ()), in_perm=ChannelMap(1,0), order=&1}   # conv1" in text
    assert text.endswith("\n&1 = (" + ",".join(str(i) for i in range(24)) + ")")
    parsed = round_trip(g)
    assert type(parsed.nodes[0].attrs["in_perm"]) is ChannelMap


def test_short_dtype_names_agree_with_value_type_str():
    for name, short in SHORT_DTYPES.items():
        assert Value(0, "", name, (2, 3)).type_str() == f"{short}[2,3]"


# ------------------------------------------------------------------ values --------------------------------------------
ODD_VALUES = [0, -7, 2 ** 70, 0.1, 1e-05, -0.0, 1e+16, 5e-324, math.inf, -math.inf, math.nan, True, False, None,
              float(np.float32(1e-05)), float(np.float32(-0.3)), float(np.float32(3.4e38)),
              "mean", "128x64", "", "two words", "3", "1e5", "None", "_", 'say "hi"\n\t#', "é", "-x",
              (), (1,), (1, 2), [], [1], [1.5, "a", None], ((1, 2), [3]), {}, {"alpha": 0.1, 3: "x"},
              ("LeakyRelu", {"alpha": 0.1}), np.float32(0.1), np.float32(1e-30), np.float16(65504), np.float64(0.3),
              np.int64(-3), np.int8(5), np.bool_(True), np.float32(np.nan),
              np.arange(6, dtype=np.int64).reshape(2, 3), np.array([0.1, -0.0, np.inf], np.float32),
              np.array(2.5), np.zeros((0, 2), np.float16), np.array(["a", "b c"], object), np.array([True, False]),
              ChannelMap([3, 1, 2, 0]), ChannelMap([5])]


def test_every_kind_of_attribute_value_reads_back_with_its_type():
    g = conv_relu_graph()
    node = g.nodes[0]
    for i, v in enumerate(ODD_VALUES):
        node.attrs[f"v{i}"] = v
    node.schedule.update({"algo": "winograd4", "tile": "128x64", "k": 4, "ratio": 0.5, "name": "a b", "on": True})
    parsed = round_trip(g)
    for i, v in enumerate(ODD_VALUES):
        assert type(parsed.nodes[0].attrs[f"v{i}"]) is type(v), (i, v)
    assert parsed.nodes[0].schedule == node.schedule
    # and the comparison that said so tells a tuple from a list, 0.0 from -0.0, f32 from f64
    for a, b in [((1, 2), [1, 2]), (0.0, -0.0), (np.float32(1), np.float64(1)), (1, True), (ChannelMap([1]), (1,))]:
        node.attrs["x"] = a
        other = parse_graph(format_graph(g), constants_of(g))
        node.attrs["x"] = b
        same, why = graphs_equal(other, g)
        assert not same and "attrs.x" in why


def test_a_value_of_an_unknown_kind_prints_but_does_not_parse():
    g = conv_relu_graph()
    g.nodes[0].attrs["obj"] = object()
    text = format_graph(g)
    assert "obj=<object: <object object at" in text
    with pytest.raises(ModelError, match=r"line 3: unexpected character '<'"):
        parse_graph(text, constants_of(g))


@pytest.mark.parametrize("name", ["n1", "conv 1", " padded ", "@ 2.00 MiB n", "(view) x", '"quoted"', "a # b",
                                  "tab\there", "line\nbreak", "n8/scale"])
def test_node_names_graph_names_and_notes_read_back(name):
    g = conv_relu_graph()
    g.nodes[0].name = name
    g.name = name
    g.notes = [name, "stops before ONNX node #3: NonZero", "", "12 constants ${...}, 1.00 MiB"]
    g.inputs[0].name = name
    parsed = round_trip(g, plan_memory(g))
    assert parsed.nodes[0].name == name and parsed.name == name and parsed.notes == g.notes


def test_constants_placeholders_params_and_graph_outputs():
    g = conv_relu_graph()
    g.nodes[0].inputs[1].param = True
    g.nodes[0].inputs[2].name = "conv1.bias"
    g.outputs.append(g.nodes[0].inputs[2])  # a constant as an output
    g.output_names.append("b")
    text = format_graph(g)
    assert text.endswith('\nconst $2: f32[4] "conv1.bias"\nparam $1: f32[4,2,3,3]')
    parsed = round_trip(g)
    assert parsed.nodes[0].inputs[1].param and parsed.outputs[1] is parsed.nodes[0].inputs[2]
    # without the constants: zeros of the declared types, which print, verify and plan alike
    bare = parse_graph(text)
    assert graphs_equal(bare, g, data=False) == (True, "")
    same, why = graphs_equal(bare, g)
    assert not same and why.startswith("node 0 (Conv conv1) inputs[1] $1 data")
    w = bare.nodes[0].inputs[1].const
    assert w.shape == (4, 2, 3, 3) and w.dtype == np.float32 and not w.any() and not w.flags.writeable
    assert format_graph(bare) == text
    assert str(plan_memory(bare)) == str(plan_memory(g))


def test_conv_prologue_round_trips():
    g = Graph("prologue")
    b = Builder(g)
    x = g.add_input("x", "float32", (1, 4, 3, 3))
    s = b.op("Mul", [x, b.const(f32(1, 4, 1, 1))], name="scale")
    a = b.op("Relu", [b.op("Add", [s, b.const(f32(1, 4, 1, 1))], name="shift")], name="relu")
    conv = b.op("Conv", [a, b.const(f32(8, 4, 1, 1))], dict(CONV, pads=(0, 0, 0, 0)), name="conv")
    g.outputs, g.output_names = [conv], ["y"]
    assert fuse_pointwise(g) and fuse_conv_prologues(g, 64)
    assert [n.op for n in g.nodes] == ["Conv"] and "prologue=[   # conv\n      %2: f32[1,4,3,3] = Mul(" in str(g)
    parsed = round_trip(g, plan_memory(g))
    assert [n.name for n in parsed.nodes[0].attrs["prologue"]] == ["scale", "shift", "relu"]


def test_a_node_without_outputs_and_a_missing_input():
    g = conv_relu_graph()
    relu = Node("Relu", [g.outputs[0]], [], {}, "sink")
    g.add_node(relu)
    g.nodes[0].inputs.append(None)
    g.nodes[0].inputs.append(None)
    assert "  () = Relu(%4)   # sink" in format_graph(g)
    with pytest.raises(ModelError, match="line 3: Conv: the output types cannot be inferred|line 4: Relu has 1"):
        parse_graph(format_graph(g), constants_of(g))  # Relu infers one output: the text is checked


# ------------------------------------------------------------------ reference models ----------------------------------
@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_reference_cnn_round_trips(ctx, name):
    """The graph after passes, printed with its memory plan, reads back as the same graph; with a schedule on each
    Conv and Gemm too."""
    net = dlnet.Net(ctx).load_onnx(os.path.join(LIGHT, f"light_{name}.onnx"))
    graph, plan = net.graph.ir, net.graph.plan
    text = str(net.graph)
    assert "MiB" in text.splitlines()[2]  # the plan's comments are in the text
    parsed = parse_graph(text, constants_of(graph), source=name)
    assert graphs_equal(parsed, graph) == (True, "")
    assert format_graph(parsed, plan) == text
    assert format_graph(parsed) == format_graph(graph)
    for i, node in enumerate(n for n in graph.nodes if n.op in ("Conv", "Gemm")):
        node.schedule.update(algo="implicit_gemm" if i % 2 else "winograd4", tile=f"{16 * (i % 4 + 1)}x64")
    round_trip(graph, plan)
    net.release()


# ------------------------------------------------------------------ errors --------------------------------------------
GOOD = [
    'graph convnet(%0: f32[1,2,5,5] "x") {',
    "  # 2 constants ${...}, 0.00 MiB",
    "  %4: f32[1,4,5,5] = Conv(%0, $1, $2) {strides=(1,1), pads=(1,1,1,1), dilations=(1,1), group=1, act=(Relu, ())}",
    "  %5: f32[1,4,5,5] = Relu(%4)   # r",
    '  return %5 "y"',
    "}",
    "const $1: f32[4,2,3,3], $2: f32[4]"]
BAD = {  # line number, its replacement, the error expected (and the line it names, where another)
    "unknown op": (4, "  %5: f32[1,4,5,5] = Relux(%4)", "unknown op 'Relux'"),
    "undefined value": (4, "  %5: f32[1,4,5,5] = Relu(%9)", "%9 is not defined by an earlier node"),
    "reads its own output": (4, "  %5: f32[1,4,5,5] = Relu(%5)", "%5 is not defined by an earlier node"),
    "a constant as a value": (4, "  %5: f32[1,4,5,5] = Relu(%1)", "%1 is not defined"),
    "undeclared constant": (4, "  %5: f32[1,4,5,5] = Relu($7)", r"\$7 is not declared"),
    "unknown dtype": (4, "  %5: f99[1,4,5,5] = Relu(%4)", "unknown dtype 'f99'"),
    "missing '='": (4, "  %5: f32[1,4,5,5] Relu(%4)", "expected '=' after the outputs"),
    "wrong type": (4, "  %5: f32[1,4,5,6] = Relu(%4)", r"Relu output %5 is printed f32\[1,4,5,6\], inference says"),
    "defined twice": (4, "  %4: f32[1,4,5,5] = Relu(%4)", "%4 is defined twice"),
    "unclosed braces": (3, "  %4: f32[1,4,5,5] = Conv(%0, $1, $2) {group=1", "expected ',', ';' or '}' after an"),
    "one-element tuple": (3, "  %4: f32[1,4,5,5] = Conv(%0, $1, $2) {pads=(1)}",
                          r"a one-element tuple is written \(x,\)"),
    "duplicate attribute": (3, "  %4: f32[1,4,5,5] = Conv(%0, $1, $2) {group=1, group=1}", "'group' is given twice"),
    "unknown constructor": (3, "  %4: f32[1,4,5,5] = Conv(%0, $1, $2) {x=Foo(1)}", "unknown constructor 'Foo'"),
    "unterminated string": (3, '  %4: f32[1,4,5,5] = Conv(%0, $1, $2) {x="ab}', "unexpected character '\"'"),
    "stray character": (4, "  %5: f32[1,4,5,5] = Relu(%4) ?", "unexpected character '\\?'"),
    "text after a node": (4, "  %5: f32[1,4,5,5] = Relu(%4) Relu", "expected the end of the line after the node"),
    "missing return": (5, "", "the graph ends without a return line", 6),
    "text after the graph": (6, "} x", "text after the graph's closing"),
    "bad header": (1, "graf convnet(%0: f32[1,2,5,5] \"x\") {", "expected 'graph' at the start"),
    "negative dimension": (1, 'graph convnet(%0: f32[1,-2,5,5] "x") {', "dimension '-2' is not a size"),
    "bad declaration": (7, "const $1: f32[4,2,3,3], $2", r"expected ':' after \$2"),
    "declared type against the array": (7, "const $1: f32[4,2,3,3], $2: f32[5]",
                                        r"\$2 is declared float32\[5\], the array is float32\[4\]"),
    "bad quoted name": (4, '  %5: f32[1,4,5,5] = Relu(%4)   # "r', "\"r is not a JSON string"),
    "unknown table label": (3, "  %4: f32[1,4,5,5] = Conv(%0, $1, $2) {x=&3}", "&3 is not in the table"),
}


def test_the_good_text_parses():
    g = parse_graph("\n".join(GOOD), {1: f32(4, 2, 3, 3), 2: f32(4)})
    assert [n.name for n in g.nodes] == ["", "r"] and g.nodes[0].attrs["act"] == ("Relu", ())


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_bad_line_is_named(case):
    line, text, message, *named = BAD[case] + (None,)
    lines = list(GOOD)
    lines[line - 1] = text
    with pytest.raises(ModelError, match=f"^ir.txt: line {named[0] or line}: ({message})"):
        parse_graph("\n".join(lines), {1: f32(4, 2, 3, 3), 2: f32(4)}, source="ir.txt")


def test_missing_constants_and_values_defined_out_of_reach_are_named():
    with pytest.raises(ModelError, match=r"line 7: \$2 is not among the constants given"):
        parse_graph("\n".join(GOOD), {1: f32(4, 2, 3, 3)})
    text = "\n".join(GOOD).replace('return %5 "y"', 'return %6 "y"')
    with pytest.raises(ModelError, match="line 5: %6 is not defined"):
        parse_graph(text)
    fused = format_graph(parse_graph(format_graph(fused_graph()), constants_of(fused_graph()))).splitlines()
    assert fused[3] == "      %2: f32[2,12] = Add(%0, $1)   # add"
    fused[7] = '  return %2 "y"'  # a member's value, read outside its node
    with pytest.raises(ModelError, match=r"line 8: %2 is not defined by an earlier node or input \(a member"):
        parse_graph("\n".join(fused))


def test_floats_read_back_exactly():
    """Python floats by repr, or (floats that are float32s widened, as ONNX float attributes are) by the float32's
    shortest text and an f, where shorter; numpy floats in their own dtype. 20000 random bit patterns each."""
    bits = np.random.default_rng(1).integers(0, 2 ** 32, 20000, dtype=np.uint64)
    singles = bits.astype(np.uint32).view(np.float32)
    doubles = np.random.default_rng(2).integers(0, 2 ** 63, 20000, dtype=np.uint64).view(np.float64)
    with np.errstate(all="ignore"):  # (signalling NaNs, and float16s out of range: infinities)
        widened, halves = singles.astype(np.float64), singles[:2000].astype(np.float16)
    for x in list(widened) + list(doubles):
        x = float(x)
        text = format_value(x)
        back = atom_value(text)
        assert type(back) is float and (back == x or (math.isnan(x) and math.isnan(back))), (x, text)
        assert math.isnan(x) or math.copysign(1, back) == math.copysign(1, x)
    for x in list(singles[:2000]) + list(halves):
        text = format_value(x)
        assert text.startswith(("f32(", "f16(")), text
        back = x.dtype.type(atom_value(text[4:-1]))
        assert back.tobytes() == x.tobytes() or (np.isnan(x) and np.isnan(back)), (x, text)


def test_mangled_text_raises_model_errors_only():
    """3000 texts with a few characters deleted, replaced or inserted: each parses or raises a ModelError."""
    g = conv_relu_graph()
    g.nodes[0].attrs.update({f"v{i}": v for i, v in enumerate(ODD_VALUES)})
    g.nodes[0].schedule.update(algo="winograd4", tile="128x64")
    text, consts = format_graph(g), constants_of(g)
    rng = np.random.default_rng(5)
    alphabet = list("()[]{},:=;%$&#\"\\_\n -+.0123456789abfxNTF@") + ["%4", "$1", "&1", "f32(", "ndarray(", "Relu"]
    errors = 0
    for _ in range(3000):
        chars = list(text)
        for _ in range(rng.integers(1, 4)):
            at, how = int(rng.integers(len(chars))), rng.random()
            if how < 0.4:
                del chars[at]
            elif how < 0.8:
                chars[at] = alphabet[rng.integers(len(alphabet))]
            else:
                chars.insert(at, alphabet[rng.integers(len(alphabet))])
        try:
            parse_graph("".join(chars), consts if rng.random() < 0.5 else None)
        except ModelError as e:
            errors += 1
            assert re.search(r"line \d+: ", str(e)), e
    assert errors > 1000


def test_format_value_is_what_the_attribute_braces_show():
    assert format_value((3, 3)) == "(3,3)" and format_value([1]) == "[1]" and format_value("SAME_UPPER") == \
        "SAME_UPPER"
    assert format_value(("LeakyRelu", {"alpha": 0.1})) == "(LeakyRelu, {alpha: 0.1})"
    assert format_value(np.float32(0.1)) == "f32(0.1)" and format_value("1e5") == '"1e5"'
    assert format_value(float(np.float32(1e-05))) == "1e-05f" and format_value(1e-05) == "1e-05"
