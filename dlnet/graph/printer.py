"""The IR printer: one typed line per node, the debugging tool. dlnet/graph/parser.py reads it back.

    graph resnet50(%0: f32[1,3,224,224] "data_0") {
      # a note                                                       graph.notes, one a line
      # 107 constants ${...}, 97.49 MiB                              a summary (not a note)
      %5: f32[1,64,112,112] = Conv(%0, $1, $2) {strides=(2,2), act=(Relu, ()); algo=gemm tile=8x8}   # @ 1.50 MiB n3
      %6: f32[1,64,56,56] = Conv(%5, $3) {group=64, in_perm=&1}   # n4
      return %9 "prob_1"
    }
    const $1: f32[64,3,7,7] "conv1_w_0", $2: f32[64], $3: ...     the constants: id, type, name (never their data)
    param $4: f32[10,64]                                             a trainable weight (Value.param)
    &1 = ChannelMap(0,2,4,1,3,5)                                     a long attribute value, out of the node's line

%id is a value, $id a constant, _ no input. A node's braces hold its attributes (`key=value, ...`), then after
`;` its schedule (`key=value key=value`). The comment ending a node's first line holds its place in a memory plan
(`@ 1.23 MiB`, `(view)` where it aliases another value's block) and then its name. Values print so that they read
back exactly, type included:

    3  0.1  1e-05  -inf  nan  True  None      int (no '.'), float (repr: always '.', 'e', inf or nan), bool, None
    1e-05f                                    a float that is a float32 widened: 9.999999747378752e-06
    mean  128x64  "two words"  "3"            a string: bare where it reads back as that word, else JSON-quoted
    (1,1)  (x,)  ()  [1,1]  {alpha: 0.1}      tuple, list, dict (the tuple/list distinction is kept)
    f32(0.1)  ndarray(i64[2], [3,4])          numpy scalar and array
    ChannelMap(0,28,56)                       a tuple or list subclass, by its class name (parser.ATTR_CLASSES)
    nodes=[                                   a list of nodes (Fused, prologue): one member a line, indented
        %10: f32[2,12] = Add(%9, $3)          under the node, whose own comment stays on its first line
      ]
A value of any other kind prints as <Type: text> for the reader, and the parser refuses it.
"""
import json
import math
import re

import numpy as np

# numpy dtype name -> the short name Value.type_str prints (tests check the two agree)
SHORT_DTYPES = {"object": "str", "float32": "f32", "float64": "f64", "float16": "f16", "int64": "i64",
                "int32": "i32", "int8": "i8", "uint8": "u8", "bool": "bool", "int16": "i16", "uint16": "u16",
                "uint32": "u32", "uint64": "u64"}
# one bare token of the text: a number, a word, True/False/None
ATOM = re.compile(r"[-+]?[A-Za-z0-9_.][A-Za-z0-9_.+\-/]*")
_INT = re.compile(r"[-+]?\d+")
_FLOAT = re.compile(r"[-+]?((\d+\.\d*|\.\d+)([eE][-+]?\d+)?|\d+[eE][-+]?\d+|inf|nan)")
_FLOAT32 = re.compile(r"[-+]?((\d+\.\d*|\.\d+)([eE][-+]?\d+)?|\d+[eE][-+]?\d+)f")  # a float32, widened
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_KEYWORDS = {"None": None, "True": True, "False": False}
# the constants summary line; a note that reads like it is printed quoted
SUMMARY = re.compile(r"\d+ constants \$\{\.\.\.\}, [0-9.]+ MiB")
INDENT = "    "  # members of a node list, under their node
WIDTH = 120
LONG = 60  # an attribute printed longer than this goes to the table after the graph


def atom_value(text):
    """What a bare token means: int, float, True/False/None, else the word itself (a str)."""
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    if _FLOAT32.fullmatch(text):
        with np.errstate(over="ignore"):  # (1e39f: inf, as numpy has it; the printer never writes one)
            return float(np.float32(float(text[:-1])))
    return _KEYWORDS.get(text, text)


def _float_repr(x):
    """A Python float's repr, or where x is a float32 widened (ONNX float attributes: epsilon 1e-05 is
    9.999999747378752e-06) and that is shorter, the float32's shortest text with an f: `1e-05f`."""
    text = repr(x)
    if not math.isfinite(x) or abs(x) > _FLOAT32_MAX or float(np.float32(x)) != x:
        return text
    short = str(np.float32(x)) + "f"
    if len(short) < len(text) and _FLOAT32.fullmatch(short) and atom_value(short) == x:
        return short
    return text


def is_bare(s):
    """A string that prints without quotes: one token that reads back as that same word."""
    return type(s) is str and ATOM.fullmatch(s) is not None and s != "_" and type(atom_value(s)) is str


def short_dtype(dtype):
    name = np.dtype(dtype).name
    return SHORT_DTYPES.get(name, name)


def _quote(s):
    return json.dumps(s, ensure_ascii=False)


def _is_node(x):
    return hasattr(x, "op") and hasattr(x, "outputs") and hasattr(x, "attrs") and hasattr(x, "schedule")


def _is_number(x):
    return isinstance(x, (int, float, np.bool_, np.integer, np.floating))


def _float_text(x):
    """A numpy float's shortest text where it reads back to the same value in its own dtype, else the exact
    float64 repr."""
    text = str(x)
    back = x.dtype.type(float(text)) if _FLOAT.fullmatch(text) else None
    if back is not None and (back == x or (np.isnan(back) and np.isnan(x))) and np.signbit(back) == np.signbit(x):
        return text
    return repr(float(x))


def _scalar_text(x):
    """The text inside f32(...) / i64(...) / bool(...), and of each element of an ndarray."""
    if isinstance(x, np.floating):
        return _float_text(x)
    if isinstance(x, (np.bool_, np.integer)):
        return str(x.item())
    return format_value(x)


def _opaque(v):
    """A value of a kind the parser does not know: printed for the reader, refused by the parser."""
    text = v.ir_str() if hasattr(v, "ir_str") else repr(v)
    return f"<{type(v).__name__}: {' '.join(str(text).split())}>"


def _format_items(items, indent):
    sep = "," if all(_is_number(x) for x in items) else ", "
    return sep.join(format_value(x, indent) for x in items)


def _format_region(nodes, indent, brackets, table):
    """A list (or tuple) of nodes: the opening bracket ends the line, each member on a line of its own."""
    inner = indent + INDENT
    lines = [brackets[0]] + [inner + format_node(n, None, inner, table) for n in nodes] + [indent + "  " + brackets[1]]
    return "\n".join(lines)


def _format_array(a):
    if a.dtype == object:  # strings
        items = _format_items(list(a.reshape(-1)), "")
    else:
        items = ", ".join(_scalar_text(x) for x in a.reshape(-1))
    return f"ndarray({short_dtype(a.dtype)}[{','.join(str(d) for d in a.shape)}], [{items}])"


def format_value(v, indent="", table=None):
    """An attribute or schedule value as text that the parser reads back to an equal value of the same type;
    `indent`: the indentation of the line a node list starts on; `table`: its members' long values (format_node)."""
    if v is None or type(v) is bool or type(v) is int:
        return str(v)
    if type(v) is float:
        return _float_repr(v)
    if type(v) is str:
        return v if is_bare(v) else _quote(v)
    if isinstance(v, (np.bool_, np.integer, np.floating)):
        return f"{short_dtype(v.dtype)}({_scalar_text(v)})"
    if isinstance(v, np.ndarray):
        return _format_array(v)
    if isinstance(v, (list, tuple)) and v and all(_is_node(x) for x in v):
        if type(v) in (list, tuple):
            return _format_region(v, indent, "[]" if type(v) is list else "()", table)
        return _opaque(v)
    if type(v) is tuple:
        return "(" + _format_items(v, indent) + ("," if len(v) == 1 else "") + ")"
    if type(v) is list:
        return "[" + _format_items(v, indent) + "]"
    if isinstance(v, tuple):
        return f"{type(v).__name__}({_format_items(v, indent)})"
    if isinstance(v, list):
        return f"{type(v).__name__}[{_format_items(v, indent)}]"
    if type(v) is dict:
        return "{" + ", ".join(f"{format_value(k)}: {format_value(x, indent)}" for k, x in v.items()) + "}"
    return _opaque(v)


def comment_text(s):
    """A name or note as the rest of a comment line: bare where it reads back unchanged, else JSON-quoted."""
    plain = s and s == s.strip() and s.isprintable() and s[0] not in "\"@(" and not SUMMARY.fullmatch(s)
    return s if plain else _quote(s)


def _ref(v):
    if v is None:
        return "_"
    return f"${v.id}" if v.const is not None else f"%{v.id}"


def _where(node, plan):
    """The node's first output's place in the memory plan, or ''."""
    if plan is None or not node.outputs:
        return ""
    v = node.outputs[0]
    rid, eoff = plan.alias_of.get(v.id, (v.id, 0))
    if rid not in plan.act_offsets:
        return ""
    off = plan.act_offsets[rid] + eoff * v.nbytes // max(v.size, 1)
    return f"@ {off / 2**20:.2f} MiB" + (" (view)" if rid != v.id else "")


def _attr_text(v, indent, table):
    """An attribute's text, or the label of a row of the graph's table of long values (`&1`, printed after the
    graph) where it is long: the node's line stays short enough to read."""
    text = format_value(v, indent, table)
    if table is None or len(text) <= LONG or "\n" in text:
        return text
    return table.setdefault(text, f"&{len(table) + 1}")


def format_node(node, plan=None, indent="", table=None):
    """One node: `%12: f32[1,64,56,56] = Conv(%11, $3) {pads=(1,1,1,1), group=1; algo=gemm}   # @ 1.23 MiB name`.
    A node list in its attributes continues on the lines below (each starting with `indent`). table: {text:
    label} of long values, which the line shows by label (format_graph prints the table); None: all inline."""
    outs = ", ".join(f"%{v.id}: {v.type_str()}" for v in node.outputs) or "()"
    args = ", ".join(_ref(v) for v in node.inputs)
    attrs = ", ".join(f"{format_value(k)}={_attr_text(v, indent, table)}" for k, v in node.attrs.items())
    schedule = " ".join(f"{format_value(k)}={_attr_text(v, indent, table)}" for k, v in node.schedule.items())
    body = attrs + (f"; {schedule}" if schedule else "")
    text = f"{outs} = {node.op}({args})" + (f" {{{body}}}" if body else "")
    notes = [part for part in (_where(node, plan), comment_text(node.name) if node.name else "") if part]
    if not notes:
        return text
    first, nl, rest = text.partition("\n")
    return first + "   # " + " ".join(notes) + nl + rest


def constants(graph):
    """Every constant value the graph reads (node lists included, then the outputs), each once, in reading order."""
    seen = {}

    def walk(nodes):
        for n in nodes:
            for v in n.inputs:
                if v is not None and v.const is not None:
                    seen.setdefault(v.id, v)
            for a in list(n.attrs.values()) + list(n.schedule.values()):
                if isinstance(a, (list, tuple)) and a and all(_is_node(x) for x in a):
                    walk(a)
    walk(graph.nodes)
    for v in graph.outputs:
        if v is not None and v.const is not None:
            seen.setdefault(v.id, v)
    return list(seen.values())


def _declarations(values):
    """`const $1: f32[64] "name", $2: ...` lines, as many items to a line as fit in WIDTH columns."""
    lines = []
    for keyword, group in (("const", [v for v in values if not v.param]), ("param", [v for v in values if v.param])):
        line = ""
        for v in group:
            item = f"${v.id}: {v.type_str()}" + (f" {_quote(v.name)}" if v.name else "")
            if line and len(line) + 2 + len(item) > WIDTH:
                lines.append(line)
                line = ""
            line = f"{line}, {item}" if line else f"{keyword} {item}"
        if line:
            lines.append(line)
    return lines


def format_graph(graph, plan=None):
    """The whole graph; with a memory plan, each node's comment starts with its output's offset in the arena. After
    the closing brace: the constants' declarations, then the table of long attribute values."""
    ins = ", ".join(f"%{v.id}: {v.type_str()} {_quote(v.name)}" for v in graph.inputs)
    name = graph.name if is_bare(graph.name) else _quote(graph.name)
    lines = [f"graph {name}({ins}) {{"]
    lines += [f"  # {comment_text(note)}" for note in graph.notes]
    consts = constants(graph)
    if consts:
        total = sum(v.nbytes for v in consts)
        lines.append(f"  # {len(consts)} constants ${{...}}, {total / 2**20:.2f} MiB")
    table = {}
    for n in graph.nodes:
        lines.append("  " + format_node(n, plan, "  ", table))
    names = list(graph.output_names) + [""] * (len(graph.outputs) - len(graph.output_names))
    outs = ", ".join(f"{_ref(v)} {_quote(name)}" for v, name in zip(graph.outputs, names, strict=False))
    lines.append(f"  return {outs}".rstrip())
    lines.append("}")
    lines += _declarations(consts)
    lines += [f"{label} = {text}" for text, label in table.items()]
    return "\n".join(lines)
