"""Generated elementwise kernels: pointwise chains, copies into views, fills (codegen.py writes their source)."""
import numpy as np

from ...graph.ir import Node, Value
from .. import codegen, half
from ..runtime import kernel_source

# CPU devices: erf and tanh in generated float32 kernels are cpu_math.cl's inline ones (PoCL's built-ins run out of
# line, element by element: bias + exact GELU over 1 x 128 x 3072 floats 13.7 -> 0.25 ms, bias + tanh 4.4 -> 0.17;
# bias + Relu 0.05). PoCL's headers define both names as macros: undefined first.
CPU_MATH = "\n#undef erf\n#undef tanh\n#undef exp\n#define erf(x) dl_erf(x)\n#define tanh(x) dl_tanh(x)\n" \
    "#define exp(x) dl_exp(x)\n"


def cpu_math(code):
    """The prefix that gives float32 CPU kernel source `code` cpu_math.cl's erf, tanh and exp ("" where it calls
    none)."""
    return kernel_source("cpu_math") + CPU_MATH if any(f in code for f in ("erf(", "tanh(", "exp(")) else ""


def transposed_strides(in_shape, perm, out_shape):
    """Element strides of transpose(a contiguous `in_shape` array, perm) read at every index of `out_shape`."""
    strides = codegen.contiguous_strides(in_shape)
    shape = [in_shape[p] for p in perm]
    pad = len(out_shape) - len(shape)
    return [0] * pad + [0 if d == 1 and o != 1 else strides[p] for d, p, o in zip(shape, perm, out_shape[pad:])]


class ElementwiseFamily:
    # precision "fp16" (kernels/half.py): the generated copies take half operands as the pointwise chains do
    # (schedule.half_io); Expand is a pointwise Identity
    HALF_IO = {op: half.EVERY for op in ("Transpose", "Slice", "Concat", "Expand")}

    def _elementwise(self, y, y_off, y_strides, operands, body, label):
        """operands: [(value, element offset, strides over y's loop)]; body assigns r0 from x0v.."""
        shape = list(y.shape)
        dims, sets = codegen.collapse(shape, [list(y_strides)] + [list(s) for _, _, s in operands])
        I = self.index_type(*[v.size for v, _, _ in operands], y.size)
        ybuf, yo = self.loc(y)
        args = [ybuf, np.uint64(yo + y_off)]
        for v, off, _ in operands:
            buf, o = self.loc(v)
            args += [buf, np.uint64(o + off)]
        args.append(self.meta(dims + [s for st in sets for s in st], np.int32 if I == "int" else np.int64))
        self.emit_ew(dims, sets, [v.dtype for v, _, _ in operands], y.dtype, body, I, args, label)

    def emit_ew(self, dims, sets, in_dtypes, out_dtype, body, I, args, label):
        """The generated elementwise kernel over collapsed `dims` (sets: y's strides, then each operand's): on CPUs
        a work-item per chunk of a row (no division chain per element), elsewhere one per element."""
        total = int(np.prod(dims))
        if self.dev.is_cpu:
            src = codegen.elementwise_rows_source(len(dims), in_dtypes, out_dtype, body, I, [st[-1] for st in sets])
            if all(np.dtype(d).name not in ("float64", "float16") for d in [*in_dtypes, out_dtype]):
                src = cpu_math(body) + src
            rows = total // dims[-1] if dims[-1] else 0
            self.emit(src, "ew_rows", args, (max(-(-dims[-1] // codegen.ROW_CHUNK), 1), max(rows, 1)), None, label)
            return
        vec = self.options.ew_vector
        if vec > 1 and self._vectors(dims, sets, args[1:-1:2], vec):
            src = codegen.elementwise_source(len(dims), in_dtypes, out_dtype, body, I, vec, [st[-1] for st in sets])
            self.emit(src, "ew", args, (max(total // vec, 1),), None, label)
            return
        src = codegen.elementwise_source(len(dims), in_dtypes, out_dtype, body, I)
        self.emit(src, "ew", args, (max(total, 1),), None, label)

    @staticmethod
    def _vectors(dims, sets, offsets, vec):
        """Can `vec` consecutive elements be one vector load and store: y contiguous along the innermost dim, each
        operand contiguous (rows and offset on multiples of vec) or broadcast there."""
        if not dims or dims[-1] % vec or sets[0][-1] != 1:
            return False
        return all(st[-1] == 0 or st[-1] == 1 and int(o) % vec == 0 and all(s % vec == 0 for s in st[:-1])
                   for st, o in zip(sets, offsets, strict=True))

    def pointwise(self, nodes):
        """A chain of pointwise nodes (last one's output is written) as one generated kernel."""
        out = nodes[-1].outputs[0]
        operands, lines = self._pointwise_body(nodes, out.shape)
        body = " ".join(lines) + f" r0 = t{len(nodes) - 1};"
        label = "+".join(n.op for n in nodes)
        self._elementwise(out, 0, self.strides(out), operands, body, f"{nodes[-1].name} {label}")

    @staticmethod
    def _pointwise_body(nodes, out_shape):
        """C statements t0.. of a chain of pointwise nodes over the operands x0v.. ([(value, 0, strides over
        out_shape)]); the last node's result is t{len(nodes) - 1}."""
        inside = {n.outputs[0].id: f"t{i}" for i, n in enumerate(nodes)}
        operands, names = [], {}
        lines = []
        for i, n in enumerate(nodes):
            args = []
            for v in n.inputs:
                if v.id in inside and inside[v.id] != f"t{i}":
                    args.append(inside[v.id])
                    continue
                # a Transpose member (passes/transposes.py) reads its input through permuted strides: its own operand
                key = (v.id, tuple(n.attrs["perm"])) if n.op == "Transpose" else v.id
                if key not in names:
                    names[key] = f"x{len(operands)}v"
                    strides = codegen.broadcast_strides(v.shape, out_shape) if n.op != "Transpose" else \
                        transposed_strides(v.shape, n.attrs["perm"], out_shape)
                    operands.append((v, 0, strides))
                args.append(names[key])
            tdt = n.outputs[0].dtype
            T = codegen._vtype(tdt)
            if n.op == "Transpose":
                lines.append(f"{T} t{i} = {args[0]};")
                continue
            cT = codegen._vtype(n.inputs[0].dtype) if n.spec.bool_out else T
            lines.append(f"{T} t{i} = ({T})({n.spec.expr(n, args, cT)});")
        return operands, lines

    def pointwise_single(self, op, y, inputs):
        node = Node(op, inputs, [y], {})
        self.pointwise([node])

    def copy(self, y, x, x_offset, x_strides):
        self._elementwise(y, 0, self.strides(y), [(x, x_offset, x_strides)], "r0 = x0v;", f"copy {y.id}")

    def copy_into(self, y, y_offset, y_strides, x):
        """Write x (contiguous) into a view of y at y_offset with y_strides (over x's shape)."""
        self._elementwise_view(x, y, y_offset, y_strides)

    def _elementwise_view(self, x, y, y_offset, y_strides):
        shadow = Value(-1, "", y.dtype, x.shape)
        dims, sets = codegen.collapse(list(x.shape), [list(y_strides), self.strides(x)])
        I = self.index_type(y.size, x.size)
        ybuf, yo = self.loc(y)
        xbuf, xo = self.loc(x)
        args = [ybuf, np.uint64(yo + y_offset), xbuf, np.uint64(xo),
                self.meta(dims + sets[0] + sets[1], np.int32 if I == "int" else np.int64)]
        del shadow
        self.emit_ew(dims, sets, [x.dtype], y.dtype, "r0 = x0v;", I, args, f"copy into {y.id}")

    def fill(self, y, value):
        src = codegen.elementwise_source(1, [], y.dtype, f"r0 = ({codegen._vtype(y.dtype)}){float(value)!r};")
        buf, off = self.loc(y)
        self.emit(src, "ew", [buf, np.uint64(off), self.meta([y.size, 1])], (max(y.size, 1),), None, "fill")

