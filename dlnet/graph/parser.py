"""The IR parser: reads what printer.format_graph writes back into an equal Graph (the grammar: printer.py).

    graph = parse_graph(format_graph(original), constants=constants_of(original))
    same, why = graphs_equal(graph, original)

Constants are printed as declarations without data, after the graph (`const $4: f32[64] "conv1_b"`). With
`constants` ({value id: array}), each is made with its array (the declared dtype and shape must match; a missing
id is an error). Without it, each gets a read-only zero array of the declared dtype and shape (np.broadcast_to: no
memory), so the graph verifies, prints, plans memory and lowers the same, but computes with zeros.

Comments are ignored, except two kinds that the printer writes: comment lines before the first node are the
graph's notes (bar the constants summary), and the comment ending a node's first line is its name (after its place
in a memory plan, `@ 1.23 MiB (view)`, which is skipped). Value names other than the graph inputs' and the
constants' are not printed and come back empty; so does graph.cut (a note says where a graph stops). The ids are
kept; graph._next_id is one past the largest. Every error is a ModelError naming the line.
"""
import copy
import json
import re

import numpy as np

from ..errors import ModelError
from .ir import HALF_NOTE, Graph, Node, Value, stored_as
from .ops import get_op
from .passes.fuse import ChannelMap
from .printer import ATOM, SHORT_DTYPES, SUMMARY, atom_value, constants

# tuple and list subclasses an attribute may hold, printed as Name(items) / Name[items]
ATTR_CLASSES = {"ChannelMap": ChannelMap}
_DTYPES = {short: name for name, short in SHORT_DTYPES.items()}
_TOKEN = re.compile(r"""(?P<nl>\n)|(?P<ws>[ \t\r]+)|(?P<comment>\#[^\n]*)|(?P<str>"(?:[^"\\\n]|\\.)*")
    |(?P<val>%\d+)|(?P<const>\$\d+)|(?P<label>&\d+)|(?P<punct>[()\[\]{},:=;])|(?P<atom>""" + ATOM.pattern + ")", re.X)
_PLAN = re.compile(r"@ \S+ MiB( \(view\))?( |$)")
_CLOSE = {"(": ")", "[": "]", "{": "}"}


def constants_of(graph):
    """{value id: array} of every constant the graph reads: the `constants` that parse_graph takes."""
    return {v.id: v.const for v in constants(graph)}


def _tokens(text, error):
    """[(kind, text, line)]: kind is nl, comment, str, val, const, punct, atom; the last token is ('eof', '', n)."""
    out, pos, line = [], 0, 1
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            error(line, f"unexpected character {text[pos]!r}")
        if m.lastgroup != "ws":
            out.append((m.lastgroup, m.group(), line))
        line += m.lastgroup == "nl"
        pos = m.end()
    out.append(("eof", "", line))
    return out


class _Parser:
    def __init__(self, text, constants, source):
        self.lines = text.splitlines()
        self.source = source
        self.tokens = _tokens(text, self.fail)
        self.pos = 0
        self.constants = constants
        self.values = {}  # id -> Value, every one defined so far (node lists' members included)
        self.stmts = []  # {line, comment, outputs} of the node statements being read, innermost last
        self.table = {}  # label (&1) -> a long attribute value
        self.read_lines = set()  # lines of declarations and table rows, read before the nodes
        self.top = set()  # ids of the graph's inputs and of its nodes' outputs read so far (not members')
        self.parsed = None  # the graph being read, once its header is (stored_as: precision "fp16")

    # tokens ---------------------------------------------------------------------------------------------------------
    def fail(self, line, msg):
        where = f"{self.source}: " if self.source else ""
        text = self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""
        raise ModelError(f"{where}line {line}: {msg}" + (f": {text[:100]}" if text else ""))

    def error(self, msg, tok=None):
        tok = tok or self.peek()
        self.fail(tok[2], msg)

    def peek(self):
        return self.tokens[self.pos]

    def next(self):
        tok = self.tokens[self.pos]
        self.pos += tok[0] != "eof"
        return tok

    def accept(self, text, kind="punct"):
        tok = self.peek()
        if tok[0] == kind and tok[1] == text:
            return self.next()
        return None

    def expect(self, text, what, kind="punct"):
        tok = self.accept(text, kind)
        if tok is None:
            got = self.peek()
            self.error(f"expected {text!r} {what}, got {got[1] or ('end of line' if got[0] == 'nl' else 'end')!r}")
        return tok

    def expect_kind(self, kind, what):
        tok = self.peek()
        if tok[0] != kind:
            self.error(f"expected {what}, got {tok[1] or 'end of line'!r}")
        return self.next()

    def end_of_line(self, what):
        """An optional comment (the name of the node being read, where it is on that node's first line), then
        the end of the line."""
        if self.peek()[0] == "comment":
            self.take_comment(self.next())
        if self.peek()[0] not in ("nl", "eof"):
            self.error(f"expected the end of the line after {what}, got {self.peek()[1]!r}")
        self.next()

    # types and references -------------------------------------------------------------------------------------------
    def type_(self):
        """`f32[1,3,224,224]` -> (numpy dtype name, shape)."""
        tok = self.expect_kind("atom", "a type such as f32[1,3]")
        try:
            dtype = np.dtype(_DTYPES.get(tok[1], tok[1])).name
        except Exception:  # numpy's parser of type strings raises TypeError, ValueError, SyntaxError...
            dtype = None
        if dtype is None or (tok[1] not in _DTYPES and dtype != tok[1]):  # numpy's own names too: complex64
            self.error(f"unknown dtype {tok[1]!r}", tok)
        self.expect("[", f"after the dtype {tok[1]}")
        shape = []
        while not self.accept("]"):
            if shape:
                self.expect(",", "between dimensions")
            dim = self.expect_kind("atom", "a dimension")
            if type(atom_value(dim[1])) is not int or int(dim[1]) < 0:
                self.error(f"dimension {dim[1]!r} is not a size", dim)
            shape.append(int(dim[1]))
        return dtype, tuple(shape)

    def ref(self, top=False):
        """An input: %id (defined earlier; top: by the graph's inputs or nodes, not a node list's members), $id (a
        declared constant) or _ (none)."""
        tok = self.next()
        if tok[0] in ("val", "const"):
            v = self.values.get(int(tok[1][1:]))
            if v is None or (v.const is not None) != (tok[0] == "const"):
                what = "declared as a constant" if tok[0] == "const" else "defined by an earlier node or input"
                self.error(f"{tok[1]} is not {what}", tok)
            if top and v.const is None and v.id not in self.top:
                self.error(f"{tok[1]} is not defined by an earlier node or input (a member of a node list's)", tok)
            return v
        if tok == ("atom", "_", tok[2]):
            return None
        self.error(f"expected %id, $id or _, got {tok[1]!r}", tok)

    def define(self, vid, dtype, shape, tok, shared=None, name="", const=None):
        if shared is not None and vid in shared:  # a Fused node's last member writes the node's own output
            v = shared[vid]
            if (v.dtype, v.shape) != (dtype, shape):
                self.error(f"%{vid} is {v.type_str()} on its node's line", tok)
            return v
        if vid in self.values:
            self.error(f"%{vid} is defined twice", tok)
        v = Value(vid, name, dtype, shape, const)
        self.values[vid] = v
        return v

    # attribute values -----------------------------------------------------------------------------------------------
    def value(self):
        """One attribute or schedule value (the forms printer.format_value writes)."""
        tok = self.next()
        kind, text = tok[0], tok[1]
        if kind == "str":
            return self.unquote(text, tok)
        if kind == "punct" and text in "([" and self.peek()[0] in ("nl", "comment"):
            nodes = self.region(_CLOSE[text])
            return nodes if text == "[" else tuple(nodes)
        if kind == "punct" and text == "(":
            items, trailing = self.items(")")
            if len(items) == 1 and not trailing:
                self.error("a one-element tuple is written (x,)", tok)
            return tuple(items)
        if kind == "punct" and text == "[":
            return self.items("]")[0]
        if kind == "punct" and text == "{":
            return self.dict_()
        if kind == "atom" and self.peek()[:2] in (("punct", "("), ("punct", "[")):
            return self.construct(tok)
        if kind == "atom":
            return atom_value(text)
        if kind == "label" and text in self.table:
            return copy.deepcopy(self.table[text])
        if kind == "label":
            self.error(f"{text} is not in the table after the graph", tok)
        self.error(f"expected a value, got {text or 'end of line'!r}", tok)

    def key(self):
        """An attribute's or a dict's key: a value that can be one."""
        tok = self.peek()
        key = self.value()
        try:
            hash(key)
        except TypeError:
            self.error(f"{key!r} cannot be a key", tok)
        return key

    def items(self, close):
        """Values separated by commas up to `close` -> (list, whether a comma ended it)."""
        out, trailing = [], False
        while not self.accept(close):
            if out and not trailing:
                self.expect(",", f"or {close!r} between items")
                trailing = True
                continue
            out.append(self.value())
            trailing = False
        return out, trailing

    def dict_(self):
        out = {}
        while not self.accept("}"):
            if out:
                self.expect(",", "or '}' between dict items")
            key = self.key()
            self.expect(":", "after a dict key")
            out[key] = self.value()
        return out

    def construct(self, tok):
        """f32(0.1) (a numpy scalar), ndarray(f32[2], [1.0, 2.0]), ChannelMap(0,2,1) (an attribute class)."""
        name = tok[1]
        opening = self.next()[1]
        if name in ATTR_CLASSES and opening == _bracket(ATTR_CLASSES[name]):
            return ATTR_CLASSES[name](self.items(_CLOSE[opening])[0])
        if opening != "(":
            self.error(f"unknown attribute class {name!r} (known: {', '.join(ATTR_CLASSES)})", tok)
        if name == "ndarray":
            dtype, shape = self.type_()
            self.expect(",", "after the array's type")
            self.expect("[", "before the array's elements")
            elements = self.items("]")[0]
            self.expect(")", "after the array's elements")
            try:
                with np.errstate(over="raise"):
                    return np.array(elements, dtype=dtype).reshape(shape)
            except (TypeError, ValueError, OverflowError, FloatingPointError) as e:
                self.error(f"array elements do not make a {dtype}{list(shape)}: {e}", tok)
        if name in _DTYPES and name != "str":
            x = self.value()
            self.expect(")", f"after the {name} scalar")
            if type(x) not in (int, float, bool):
                self.error(f"{name}(...) holds a number, not {x!r}", tok)
            try:
                with np.errstate(over="raise"):
                    return np.dtype(_DTYPES[name]).type(x)
            except (OverflowError, ValueError, FloatingPointError) as e:
                self.error(f"{x!r} is not a {name}: {e}", tok)
        self.error(f"unknown constructor {name!r}: a numpy scalar (f32(...)), ndarray(...) or one of "
                   f"{', '.join(ATTR_CLASSES)}", tok)

    def region(self, close):
        """The members of a node list, one statement a line, up to the closing bracket."""
        self.end_of_line("the opening bracket of a node list")
        members = []
        while True:
            self.skip_read_lines()
            if self.accept(close):
                return members
            members.append(self.node())

    def attributes(self):
        """{key=value, ...; key=value ...} -> (attrs, schedule); the opening brace is read."""
        attrs, schedule, target = {}, {}, None
        while not self.accept("}"):
            if target is None and self.accept(";"):
                target = schedule
                continue
            if target is None:
                target = attrs
            elif target is attrs and not self.accept(","):
                if self.accept(";"):
                    target = schedule
                    continue
                self.error("expected ',', ';' or '}' after an attribute")
            key_tok = self.peek()
            key = self.key()
            if key in target:
                self.error(f"{key!r} is given twice", key_tok)
            self.expect("=", f"after {key!r}")
            target[key] = self.value()
        return attrs, schedule

    # statements -----------------------------------------------------------------------------------------------------
    def node(self):
        """One node statement (with the node lists in its attributes), outputs defined, types checked."""
        outer = self.stmts[-1]["outputs"] if self.stmts else None
        stmt = {"line": self.peek()[2], "comment": None, "outputs": {}}
        self.stmts.append(stmt)
        outputs = []
        if not self.accept("("):
            while True:
                tok = self.expect_kind("val", "an output %id")
                self.expect(":", f"after {tok[1]}")
                outputs.append(self.define(int(tok[1][1:]), *self.type_(), tok, outer))
                if not self.accept(","):
                    break
        else:
            self.expect(")", "after '(' (a node without outputs)")
        stmt["outputs"] = {v.id: v for v in outputs}
        self.expect("=", "after the outputs")
        op_tok = self.expect_kind("atom", "an op name")
        try:
            get_op(op_tok[1])
        except ModelError:
            self.error(f"unknown op {op_tok[1]!r}", op_tok)
        self.expect("(", f"after {op_tok[1]}")
        inputs = []
        while not self.accept(")"):
            if inputs:
                self.expect(",", "or ')' between inputs")
            inputs.append(self.ref(top=outer is None))
        attrs, schedule = self.attributes() if self.accept("{") else ({}, {})
        self.end_of_line("the node")
        self.stmts.pop()
        node = Node(op_tok[1], inputs, outputs, attrs, self.name_of(stmt["comment"]), schedule)
        for v in outputs:
            v.producer = node  # a member's; graph.add_node makes a top-level node the producer
        self.check_types(node, op_tok)
        return node

    def take_comment(self, tok):
        if self.stmts and self.stmts[-1]["line"] == tok[2] and self.stmts[-1]["comment"] is None:
            self.stmts[-1]["comment"] = tok

    def name_of(self, tok):
        """A node's name from the comment ending its first line (after its place in a memory plan, if any)."""
        if tok is None:
            return ""
        text = tok[1][1:].strip()
        plan = _PLAN.match(text)
        if plan:
            text = text[plan.end():]
        return self.unquote(text, tok) if text.startswith('"') else text

    def unquote(self, text, tok):
        try:
            s = json.loads(text)
        except ValueError:
            s = None
        if type(s) is not str:
            self.error(f"{text} is not a JSON string", tok)
        return s

    def check_types(self, node, tok):
        try:
            types = get_op(node.op).infer(node)
        except Exception as e:  # a node of the wrong arity or attributes fails inside inference
            self.error(f"{node.op}: the output types cannot be inferred ({type(e).__name__}: {e})", tok)
        if len(types) != len(node.outputs):
            self.error(f"{node.op} has {len(types)} outputs, {len(node.outputs)} printed", tok)
        for v, (dtype, shape) in zip(node.outputs, types, strict=True):
            if not stored_as(self.parsed, np.dtype(dtype).name, v.dtype) or tuple(shape) != v.shape:
                want = Value(v.id, "", dtype, shape).type_str()
                self.error(f"{node.op} output %{v.id} is printed {v.type_str()}, inference says {want}", tok)

    def array(self, vid, dtype, shape, tok):
        if self.constants is None:
            return np.broadcast_to(np.zeros((), dtype), shape)
        if vid not in self.constants:
            self.error(f"${vid} is not among the constants given", tok)
        a = np.asarray(self.constants[vid])
        if (a.dtype.name, a.shape) != (dtype, shape):
            self.error(f"${vid} is declared {dtype}{list(shape)}, the array is {a.dtype.name}{list(a.shape)}", tok)
        return a

    def declarations(self):
        """`const $1: f32[64] "name", $2: ...` (or `param ...`): constants, with their arrays."""
        keyword = self.next()[1]
        while True:
            tok = self.expect_kind("const", "a constant $id")
            self.expect(":", f"after {tok[1]}")
            dtype, shape = self.type_()
            name = self.unquote(self.next()[1], tok) if self.peek()[0] == "str" else ""
            vid = int(tok[1][1:])
            v = self.define(vid, dtype, shape, tok, name=name, const=self.array(vid, dtype, shape, tok))
            v.param = keyword == "param"
            if not self.accept(","):
                break
        self.end_of_line(f"the {keyword} declarations")

    def header(self):
        """`graph name(%0: f32[1,3] "x", ...) {` -> a Graph with its inputs."""
        self.skip_read_lines()
        self.expect("graph", "at the start", kind="atom")
        tok = self.next()
        if tok[0] == "str":
            graph = Graph(self.unquote(tok[1], tok))
        elif tok[0] == "atom" and type(atom_value(tok[1])) is str:
            graph = Graph(tok[1])
        else:
            self.error(f"expected the graph's name, got {tok[1]!r}", tok)
        self.expect("(", "after the graph's name")
        while not self.accept(")"):
            if graph.inputs:
                self.expect(",", "or ')' between inputs")
            tok = self.expect_kind("val", "an input %id")
            self.expect(":", f"after {tok[1]}")
            dtype, shape = self.type_()
            name = self.unquote(self.expect_kind("str", "the input's name in quotes")[1], tok)
            graph.inputs.append(self.define(int(tok[1][1:]), dtype, shape, tok, name=name))
            self.top.add(graph.inputs[-1].id)
        self.expect("{", "after the inputs")
        self.end_of_line("'{'")
        while self.peek()[0] in ("nl", "comment"):
            tok = self.next()
            text = tok[1][2:] if tok[1].startswith("# ") else tok[1][1:]
            text = text.rstrip()
            if tok[0] == "comment" and not SUMMARY.fullmatch(text):
                graph.notes.append(self.unquote(text, tok) if text.startswith('"') else text)
        graph.stored_half = any(note.startswith(HALF_NOTE) for note in graph.notes)  # (precision "fp16")
        self.parsed = graph
        return graph

    def trailer(self):
        """The lines after the graph that its nodes refer to, wherever they are: constants' declarations (`const
        $1: f32[64] "b", ...`, `param ...`) and the table of long values (`&1 = ChannelMap(...)`)."""
        for i, tok in enumerate(self.tokens[:-1]):
            if i and self.tokens[i - 1][0] != "nl":
                continue
            nxt = self.tokens[i + 1]
            declaration = tok[0] == "atom" and tok[1] in ("const", "param") and nxt[0] == "const"
            if declaration or (tok[0] == "label" and nxt[:2] == ("punct", "=")):
                self.pos = i
                if declaration:
                    self.declarations()
                else:
                    self.next()
                    self.next()
                    if tok[1] in self.table:
                        self.error(f"{tok[1]} is in the table twice", tok)
                    self.table[tok[1]] = self.value()
                    self.end_of_line(f"the value of {tok[1]}")
                self.read_lines.add(tok[2])

    def skip_read_lines(self):
        """Blank and comment lines, and the lines trailer() read."""
        while self.peek()[0] in ("nl", "comment") or self.peek()[2] in self.read_lines and self.peek()[0] != "eof":
            self.next()

    def graph(self):
        graph = self.header()
        body = self.pos
        self.trailer()
        self.pos = body
        while True:
            self.skip_read_lines()
            tok = self.peek()
            if tok[0] == "atom" and tok[1] == "return":
                self.next()
                break
            if tok[0] == "eof" or tok[:2] == ("punct", "}"):
                self.error("the graph ends without a return line")
            graph.add_node(self.node())
            self.top.update(v.id for v in graph.nodes[-1].outputs)
        while self.peek()[0] not in ("nl", "eof", "comment"):
            if graph.outputs:
                self.expect(",", "or the end of the line between outputs")
            graph.outputs.append(self.ref(top=True))
            graph.output_names.append(self.unquote(self.expect_kind("str", "the output's name in quotes")[1],
                                                   self.peek()))
        self.end_of_line("the return line")
        self.skip_read_lines()
        self.expect("}", "closing the graph")
        self.skip_read_lines()
        if self.peek()[0] != "eof":
            self.error("text after the graph's closing '}'")
        graph._next_id = max(self.values, default=-1) + 1
        return graph


def _bracket(cls):
    return "(" if issubclass(cls, tuple) else "["


def parse_graph(text, constants=None, source=None):
    """The Graph that format_graph printed as `text`, checked with graph.verify(). constants: {value id: array}
    (constants_of(original)); without it, constants are zeros of their declared type (see the module's doc).
    source names the text in error messages (a file name)."""
    graph = _Parser(text, constants, source).graph()
    try:
        graph.verify()
    except ModelError as e:
        raise ModelError(f"{source + ': ' if source else ''}the parsed graph does not verify: {e}") from e
    return graph


# ------------------------------------------------------------------ comparison ----------------------------------------
def _same(a, b, where, data):
    """None where a and b are equal and of the same types all the way down, else the first difference."""
    if type(a) is not type(b):
        return f"{where}: {type(a).__name__} {a!r} != {type(b).__name__} {b!r}"
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return f"{where}: {len(a)} items != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            diff = _same(x, y, f"{where}[{i}]", data)
            if diff:
                return diff
        return None
    if isinstance(a, dict):
        if list(a) != list(b):
            return f"{where}: keys {list(a)} != {list(b)}"
        diffs = (_same(a[k], b[k], f"{where}.{k}", data) for k in a)
        return next((d for d in diffs if d), None)
    if isinstance(a, Node):
        return _node_diff(a, b, where, data)
    if isinstance(a, (np.ndarray, np.generic)):
        a, b = np.asarray(a), np.asarray(b)
        nan = a.dtype.kind in "fc"
        if a.dtype != b.dtype or a.shape != b.shape or not np.array_equal(a, b, equal_nan=nan) or \
                (nan and not np.array_equal(np.signbit(a), np.signbit(b))):
            return f"{where}: {a!r} != {b!r}"
        return None
    if isinstance(a, float):
        same = (a == b or (a != a and b != b)) and np.signbit(a) == np.signbit(b)
        return None if same else f"{where}: {a!r} != {b!r}"
    return None if a == b else f"{where}: {a!r} != {b!r}"


def _value_diff(a, b, where, data):
    if a is None or b is None:
        return None if a is b else f"{where}: {a!r} != {b!r}"
    fields = ("id", "dtype", "shape", "param") + (("name",) if a.const is not None else ())
    for f in fields:
        if getattr(a, f) != getattr(b, f):
            return f"{where} (%{a.id}): {f} {getattr(a, f)!r} != {getattr(b, f)!r}"
    if (a.const is None) != (b.const is None):
        return f"{where} (%{a.id}): constant in one graph only"
    if data and a.const is not None:
        return _same(np.asarray(a.const), np.asarray(b.const), f"{where} ${a.id} data", True)
    return None


def _node_diff(a, b, where, data):
    where = f"{where} ({a.op} {a.name})".rstrip()
    for f in ("op", "name"):
        if getattr(a, f) != getattr(b, f):
            return f"{where}: {f} {getattr(a, f)!r} != {getattr(b, f)!r}"
    for f in ("inputs", "outputs"):
        va, vb = getattr(a, f), getattr(b, f)
        if len(va) != len(vb):
            return f"{where}: {len(va)} {f} != {len(vb)}"
        for i, (x, y) in enumerate(zip(va, vb, strict=True)):
            diff = _value_diff(x, y, f"{where} {f}[{i}]", data)
            if diff:
                return diff
    return _same(a.attrs, b.attrs, f"{where} attrs", data) or _same(a.schedule, b.schedule, f"{where} schedule", data)


def _links_diff(a, b):
    """Producers and users of the top-level values, as node positions."""
    pos_a = {id(n): i for i, n in enumerate(a.nodes)}
    pos_b = {id(n): i for i, n in enumerate(b.nodes)}
    values_b = {v.id: v for v in b.values()}
    for v in a.values():
        w = values_b.get(v.id)
        if w is None:
            return f"%{v.id} is in the first graph only"
        prod = (pos_a.get(id(v.producer)), pos_b.get(id(w.producer)))
        if prod[0] != prod[1] and v.const is None:
            return f"%{v.id}: produced by node {prod[0]} != node {prod[1]}"
        users = (sorted(pos_a.get(id(u), -1) for u in v.users), sorted(pos_b.get(id(u), -1) for u in w.users))
        if users[0] != users[1]:
            return f"%{v.id}: read by nodes {users[0]} != {users[1]} (-1: a node not in the graph)"
    return None


def graphs_equal(a, b, data=True):
    """(True, "") where graphs a and b are the same: name, notes, inputs (id, name, type), nodes in order (op, name,
    inputs, outputs, attrs and schedule with their types, node lists too), outputs and their names, producers and
    users; the constants' data too unless data=False. Else (False, the first difference)."""
    checks = [("name", a.name, b.name), ("notes", a.notes, b.notes), ("output names", a.output_names, b.output_names)]
    for what, x, y in checks:
        if x != y:
            return False, f"{what}: {x!r} != {y!r}"
    for what, xs, ys in (("input", a.inputs, b.inputs), ("node", a.nodes, b.nodes), ("output", a.outputs, b.outputs)):
        if len(xs) != len(ys):
            return False, f"{len(xs)} {what}s != {len(ys)}"
        for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
            if what == "node":
                diff = _node_diff(x, y, f"node {i}", data)
            else:
                diff = _value_diff(x, y, f"{what} {i}", data) or (x is not None and x.name != y.name and
                                                                    f"{what} {i}: name {x.name!r} != {y.name!r}")
            if diff:
                return False, diff
    diff = _links_diff(a, b)
    return (False, diff) if diff else (True, "")
