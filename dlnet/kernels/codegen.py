"""The pointwise-broadcast-reduce generator (the DLPrimitives idea): expression snippets in, OpenCL C out.

Every operand is a strided view over a buffer: (value, offset, strides per loop dim; 0 = broadcast). One generator
therefore serves elementwise maths with numpy broadcasting, Transpose, Expand, Slice, Concat slots and reductions.
Shapes and strides are kernel arguments, so one program serves every shape of the same rank and expression.
Index arithmetic is 32-bit (I="int") whenever every operand fits: GPUs emulate 64-bit division at great cost.
"""
import re

import numpy as np

from .runtime import DTYPE_TO_C


def contiguous_strides(shape):
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return list(reversed(strides))


def broadcast_strides(in_shape, out_shape, strides=None):
    """Element strides of a contiguous `in_shape` array (or one of these `strides`) read at every index of
    `out_shape` (numpy rules)."""
    strides = contiguous_strides(in_shape) if strides is None else strides
    pad = len(out_shape) - len(in_shape)
    result = [0] * pad
    for d, s, o in zip(in_shape, strides, out_shape[pad:]):
        result.append(0 if d == 1 and o != 1 else s)
    return result


def collapse(shape, stride_sets):
    """Merge adjacent loop dims that are contiguous for every operand; drop size-1 dims. Returns (shape, strides)."""
    dims = [(d, [s[i] for s in stride_sets]) for i, d in enumerate(shape) if d != 1]
    if not dims:
        return [1], [[0] for _ in stride_sets]
    out = [dims[0]]
    for d, ss in dims[1:]:
        pd, pss = out[-1]
        if all(ps == s * d for ps, s in zip(pss, ss)):
            out[-1] = (pd * d, ss)
        else:
            out.append((d, ss))
    return [d for d, _ in out], [[ss[k] for _, ss in out] for k in range(len(stride_sets))]


def _ctype(dtype):
    return DTYPE_TO_C[np.dtype(dtype).name]


def _preamble(dtypes):
    lines = []
    if any(np.dtype(d).name == "float64" for d in dtypes):
        lines.append("#pragma OPENCL EXTENSION cl_khr_fp64 : enable")
    # (half is only loaded and stored, vload_half / vstore_half: core OpenCL, no cl_khr_fp16 pragma, which a device
    # without the extension warns about)
    return "\n".join(lines)


def _load(i, dtype):
    """Read operand i at index `o{i}`; half is stored as 16 bits and computed in float."""
    if np.dtype(dtype).name == "float16":
        return f"vload_half(o{i}, x{i})"
    return f"x{i}[o{i}]"


def _store(dtype, expr):
    if np.dtype(dtype).name == "float16":
        return f"vstore_half({expr}, oy, y);"
    return f"y[oy] = ({_ctype(dtype)})({expr});"


def _vtype(dtype):
    return "float" if np.dtype(dtype).name == "float16" else _ctype(dtype)


def elementwise_source(rank, in_dtypes, out_dtype, body, I="long", vec=1, inner=None):
    """Kernel `ew`: y[i] = body(x0..xn) over a rank-`rank` loop; `body` assigns `r` from `x0v`, `x1v`, ...

    vec > 1: each work-item takes `vec` consecutive elements of the innermost dim (a multiple of vec), along which
    y is contiguous and each operand contiguous or broadcast (inner: their innermost strides, 1 or 0, y's first):
    one vector load per contiguous operand and one vector store, the body once per element."""
    args = [f"__global {_ctype(out_dtype) if np.dtype(out_dtype).name != 'float16' else 'half'}* y", "ulong y_off"]
    for i, dt in enumerate(in_dtypes):
        args += [f"__global const {_ctype(dt)}* x{i}", f"ulong x{i}_off"]
    args += [f"__constant const {I}* meta"]  # [dims(rank), y strides(rank), x_i strides(rank) ...]
    lines = [_preamble(list(in_dtypes) + [out_dtype]),
             f"__kernel void ew({', '.join(args)}) {{",
             f"  {I} i = get_global_id(0){f' * {vec}' if vec > 1 else ''};",
             f"  {I} total = 1; for (int d = 0; d < {rank}; d++) total *= meta[d];",
             "  if (i >= total) return;",
             "  y += y_off;"]
    lines += [f"  x{i} += x{i}_off;" for i in range(len(in_dtypes))]
    lines += [f"  {I} oy = 0;"] + [f"  {I} o{i} = 0;" for i in range(len(in_dtypes))]
    lines += [f"  {I} r = i;", f"  for (int d = {rank - 1}; d >= 0; d--) {{", f"    {I} q = r % meta[d]; r /= meta[d];",
              f"    oy += q * meta[{rank} + d];"]
    lines += [f"    o{i} += q * meta[{(i + 2) * rank} + d];" for i in range(len(in_dtypes))]
    lines += ["  }"]
    if vec > 1:
        return "\n".join(lines + _vector_body(in_dtypes, out_dtype, body, vec, inner[1:]) + ["}"])
    lines += [f"  {_vtype(dt)} x{i}v = {_load(i, dt)};" for i, dt in enumerate(in_dtypes)]
    lines += [f"  {_vtype(out_dtype)} r0;", f"  {body}", f"  {_store(out_dtype, 'r0')}", "}"]
    return "\n".join(lines)


def _vector_load(i, dtype, vec):
    if np.dtype(dtype).name == "float16":
        return f"vload_half{vec}(0, x{i} + o{i})"
    return f"vload{vec}(0, x{i} + o{i})"


def _vector_body(in_dtypes, out_dtype, body, vec, inner):
    """elementwise_source's statements for `vec` elements from offsets o0.., oy: vector loads of the contiguous
    operands, the body once per element in a block of its own, one vector store."""
    half_out = np.dtype(out_dtype).name == "float16"
    lines = [f"  {_vtype(dt)}{vec} xw{i} = {_vector_load(i, dt, vec)};"
             for i, (dt, s) in enumerate(zip(in_dtypes, inner, strict=True)) if s == 1]
    lines += [f"  {_vtype(dt)} xs{i} = {_load(i, dt)};"
              for i, (dt, s) in enumerate(zip(in_dtypes, inner, strict=True)) if s != 1]
    lines.append(f"  {_vtype(out_dtype)}{vec} rw;")
    for e in range(vec):
        lanes = [f"const {_vtype(dt)} x{i}v = {f'xw{i}.s{e:x}' if s == 1 else f'xs{i}'};"
                 for i, (dt, s) in enumerate(zip(in_dtypes, inner, strict=True))]
        lines.append(f"  {{ {' '.join(lanes)} {_vtype(out_dtype)} r0; {body} rw.s{e:x} = "
                     f"{'r0' if half_out else f'({_ctype(out_dtype)})(r0)'}; }}")
    lines.append(f"  vstore_half{vec}(rw, 0, y + oy);" if half_out else f"  vstore{vec}(rw, 0, y + oy);")
    return lines


# Elements per work-item along the innermost loop dim in elementwise_rows_source: enough to pay for the index
# arithmetic of the outer dims once, few enough that a flat 800K-element op still makes 1600 work-items.
ROW_CHUNK = 512


def elementwise_rows_source(rank, in_dtypes, out_dtype, body, I, inner_strides):
    """Kernel `ew_rows` for CPU devices, same arguments and meta as `ew`: one work-item per ROW_CHUNK elements of one
    row of the innermost dim (global size (chunks, rows)), the outer index decomposed once per work-item instead of
    a division chain per element. inner_strides: [y, x0, ...] along the innermost dim; 0 and 1 become literals so
    that PoCL's compiler sees unit-stride and broadcast loads."""
    args = [f"__global {_ctype(out_dtype) if np.dtype(out_dtype).name != 'float16' else 'half'}* y", "ulong y_off"]
    for i, dt in enumerate(in_dtypes):
        args += [f"__global const {_ctype(dt)}* x{i}", f"ulong x{i}_off"]
    args += [f"__constant const {I}* meta"]
    last = rank - 1
    step = [str(v) if v in (0, 1) else f"meta[{(k + 1) * rank + last}]" for k, v in enumerate(inner_strides)]
    lines = [_preamble(list(in_dtypes) + [out_dtype]),
             f"__kernel void ew_rows({', '.join(args)}) {{",
             f"  const {I} j0 = ({I})get_global_id(0) * {ROW_CHUNK}, row = get_global_id(1);",
             f"  const {I} inner = meta[{last}];",
             f"  {I} rows = 1; for (int d = 0; d < {last}; d++) rows *= meta[d];",
             "  if (j0 >= inner || row >= rows) return;",
             f"  const {I} n = inner - j0 < {ROW_CHUNK} ? inner - j0 : {ROW_CHUNK};",
             f"  {I} oy = j0 * {step[0]};"] + [f"  {I} o{i} = j0 * {step[i + 1]};" for i in range(len(in_dtypes))]
    lines += [f"  {I} r = row;", f"  for (int d = {last - 1}; d >= 0; d--) {{",
              f"    {I} q = r % meta[d]; r /= meta[d];", f"    oy += q * meta[{rank} + d];"]
    lines += [f"    o{i} += q * meta[{(i + 2) * rank} + d];" for i in range(len(in_dtypes))]
    lines += ["  }", "  y += y_off + oy;"] + [f"  x{i} += x{i}_off + o{i};" for i in range(len(in_dtypes))]
    if all(s in ("0", "1") for s in step):
        # y written in place over an input (the planner's in-place outputs) fails the vectoriser's run-time overlap
        # check, and the loop ran scalar: ViT's bias + GELU in place 2.1 ms against 0.4 into another buffer. Element
        # j is read before it is written and no other element is: safe to vectorise (a broadcast input is read only).
        # Where the loop cannot be vectorised anyway (training's kernels), clang would warn in the build log.
        lines[0] += '\n#pragma clang diagnostic ignored "-Wpass-failed"'
        lines.append("  #pragma clang loop vectorize(assume_safety)")
    lines += [f"  for ({I} j = 0; j < n; j++) {{"]
    for i, dt in enumerate(in_dtypes):
        idx = f"j * {step[i + 1]}"
        load = f"vload_half({idx}, x{i})" if np.dtype(dt).name == "float16" else f"x{i}[{idx}]"
        lines.append(f"    {_vtype(dt)} x{i}v = {load};")
    out = f"j * {step[0]}"
    store = f"vstore_half(r0, {out}, y);" if np.dtype(out_dtype).name == "float16" else \
        f"y[{out}] = ({_ctype(out_dtype)})(r0);"
    lines += [f"    {_vtype(out_dtype)} r0;", f"    {body}", f"    {store}", "  }", "}"]
    return "\n".join(lines)


def reduce_source(rank_out, rank_red, in_dtypes, acc_dtype, out_dtype, pre, combine, init, post, group=0,
                  I="long", prologue="", splits=1, lanes=1):  # noqa: E741 (I: the index type, as in the other kernels)
    """Kernel `red`: one work-item per output; loops over the reduced dims.

    prologue: C statements of x0v.. run per element before pre (a fused pointwise producer);
    pre: C expression of x0v.. (or of the prologue's variables) for one element; combine: C statement updating
    `acc` from `v`;
    post: C expression of `acc` and `count` giving the output.
    group > 0: one work-group of `group` work-items per output (GPUs, long reductions): each strides over the
    reduced elements, then the partial results combine in local memory.
    splits > 1 (with group): `splits` work-groups per output, each over every splits-th run of `group` elements,
    write their partial results to `part` (no post); kernel `red_finish`, one work-item per output, combines them.
    splits > 1 without group (columns: the kept dims innermost, a bias gradient's sum over rows): work-item
    s * outputs + i sums every splits-th element of output i from the s-th, so that neighbouring work-items read
    neighbouring outputs' elements; partial result s of output i at part[s * outputs + i].
    lanes > 1 (one work-item per output, one or two reduced dims): that many accumulators over interleaved elements
    of the last reduced dim, combined at the end, so a CPU's adds overlap in place of waiting on each other
    (GlobalAveragePool 1000 x 13 x 13 on 2 cores: 0.115 -> 0.039 ms); over two, the first is a loop outside them,
    with no division per element (a convolution's bias gradient, dy [8, 32, 64, 64] summed over (0, 2, 3): 3.64 ->
    0.24 ms).
    """
    n = len(in_dtypes)
    acc_t = _ctype(acc_dtype)
    # meta: out dims, y strides, x_i strides over out dims, red dims, x_i strides over red dims
    base_red = rank_out * (2 + n)
    args = _reduce_args(in_dtypes, acc_t, out_dtype, I, splits)
    lines = [_preamble(list(in_dtypes) + [out_dtype, acc_dtype]),
             f"__kernel void red({', '.join(args)}) {{"]
    lines += _reduce_output_index(rank_out, n, I, group, splits)
    lines += [_reduce_count(I, rank_red, base_red), f"  {acc_t} acc = {init};"]
    body = [f"{_vtype(dt)} x{k}v = {_load(k, dt)};" for k, dt in enumerate(in_dtypes)] + \
        ([prologue] if prologue else []) + [f"{acc_t} v = {pre};"]
    if lanes > 1 and rank_red <= 2 and not group and splits == 1:  # lanes accumulators, the tail on acc
        lines += _reduce_lanes(n, I, base_red, acc_t, init, combine, body, lanes, rank_red)
    else:
        lines.append(_reduce_loop(I, group, splits))
        lines += _reduce_element_offsets(rank_red, n, I, base_red)
        lines += [f"    {b}" for b in body] + [f"    {combine}", "  }"]
    if group:
        lines += _reduce_work_group(acc_t, group, combine)
        if splits > 1:
            lines = [line.replace("part[", "lpart[") for line in lines]
    if splits > 1:
        lines += [f"  part[{'split * total + i' if not group else 'get_group_id(0)'}] = acc;", "}"]
        lines += _reduce_finish(args, I, rank_out, rank_red, base_red, acc_t, init, combine, splits, not group)
    where = "y_off + oy" if splits > 1 else "oy"
    if np.dtype(out_dtype).name == "float16":  # (half has no arithmetic or casts without cl_khr_fp16: a store)
        lines += [f"  vstore_half({post}, {where}, y);", "}"]
    else:
        lines += [f"  y[{where}] = ({_ctype(out_dtype)})({post});", "}"]
    return "\n".join(lines)


def reduce_columns_cpu_source(pre, combine, init, post, I="long"):  # noqa: E741
    """Kernel `red_cols` for CPU devices: float32 sums (or the mode's combine) down the columns of x viewed as
    [count, n_out] rows `stride` apart (a bias gradient: dy [rows, N] over rows), 8 neighbouring columns a work-item
    in one float8 accumulator, so each row's 8 are one vector load; the ragged last work-item's columns one by one.
    The mode's strings (ReduceFamily.REDUCE) serve float8 and float alike."""
    def body(t, load):
        return [f"    {t} acc = ({t})({init});", f"    for ({I} r = 0; r < count; r++) {{",
                f"      const {t} x0v = {load};", f"      {t} v = {pre};", f"      {combine}", "    }"]
    lines = [f"__kernel void red_cols(__global float* y, ulong y_off, __global const float* x0, ulong x0_off, "
             f"{I} n_out, {I} count, {I} stride) {{",
             f"  const {I} i0 = ({I})get_global_id(0) * 8;",
             "  if (i0 >= n_out) return;",
             "  y += y_off + i0;", "  x0 += x0_off + i0;",
             "  if (i0 + 8 <= n_out) {"]
    lines += body("float8", "vload8(0, x0 + r * stride)")
    lines += [f"    vstore8({post}, 0, y);", "    return;", "  }",
              "  for (int c = 0; c < n_out - i0; c++) {"]
    lines += body("float", "x0[r * stride + c]")
    return "\n".join(lines + [f"    y[c] = {post};", "  }", "}"])


def _reduce_args(in_dtypes, acc_t, out_dtype, index_t, splits):
    """The parameters of `red` and `red_finish`: y, the operands, meta, then `part` where the work is split."""
    args = [f"__global {_ctype(out_dtype)}* y", "ulong y_off"]
    for i, dt in enumerate(in_dtypes):
        args += [f"__global const {_ctype(dt)}* x{i}", f"ulong x{i}_off"]
    args += [f"__constant const {index_t}* meta"]
    if splits > 1:
        args += [f"__global {acc_t}* part"]
    return args


def _reduce_output_index(rank_out, n, index_t, group, splits):
    """The output this work-item (or work-group) computes: y's offset `oy` and each operand's base offset `b{k}`."""
    columns = splits > 1 and not group
    at = f"get_group_id(0) / {splits}" if splits > 1 and group else "get_group_id(0)" if group else "get_global_id(0)"
    lines = [f"  {index_t} i = {at};",
             f"  {index_t} total = 1; for (int d = 0; d < {rank_out}; d++) total *= meta[d];"]
    if columns:
        lines += [f"  const {index_t} split = i / total;", "  i %= total;",
                  f"  if (split >= {splits}) return;"]
    lines += ["  if (i >= total) return;",
             "  y += y_off;"]
    lines += [f"  x{k} += x{k}_off;" for k in range(n)]
    lines += [f"  {index_t} oy = 0;"] + [f"  {index_t} b{k} = 0;" for k in range(n)]
    lines += [f"  {index_t} r = i;", f"  for (int d = {rank_out - 1}; d >= 0; d--) {{",
              f"    {index_t} q = r % meta[d]; r /= meta[d];", f"    oy += q * meta[{rank_out} + d];"]
    lines += [f"    b{k} += q * meta[{(k + 2) * rank_out} + d];" for k in range(n)]
    return lines + ["  }"]


def _reduce_count(index_t, rank_red, base_red):
    """`count`: the number of reduced elements per output."""
    return f"  {index_t} count = 1; for (int d = 0; d < {rank_red}; d++) count *= meta[{base_red} + d];"


def _reduce_loop(index_t, group, splits):
    """The loop over this work-item's reduced elements `j`: all of them, every group-th, or every group-th of
    this work-group's runs."""
    if splits > 1 and not group:
        return f"  for ({index_t} j = split; j < count; j += {splits}) {{"
    if splits > 1:
        return (f"  for ({index_t} j = (get_group_id(0) % {splits}) * {group} + get_local_id(0); j < count; "
                f"j += {group * splits}) {{")
    if group:
        return f"  for ({index_t} j = get_local_id(0); j < count; j += {group}) {{"
    return f"  for ({index_t} j = 0; j < count; j++) {{"


def _reduce_lanes(n, index_t, base_red, acc_t, init, combine, body, lanes, rank_red=1):
    """`lanes` accumulators over interleaved elements of the last reduced dim, its tail on acc, inside a loop over the
    first reduced dim where there are two; the accumulators then combined into acc."""
    last = base_red + rank_red - 1  # (meta: the last reduced dim's extent; each operand's stride along it)
    lines = [f"  {acc_t} " + ", ".join(f"acc{la} = {init}" for la in range(1, lanes)) + ";"]
    if rank_red == 2:
        lines += [f"  for ({index_t} jo = 0; jo < meta[{base_red}]; jo++) {{"]
        lines += [f"  const {index_t} c{k} = b{k} + jo * meta[{base_red + (k + 1) * 2}];" for k in range(n)]
    else:
        lines += [f"  const {index_t} c{k} = b{k};" for k in range(n)]
    lines += [f"  {index_t} j = 0;", f"  for (; j + {lanes} <= meta[{last}]; j += {lanes}) {{"]
    for la in range(lanes):
        lines += ["    {"] + [f"      {index_t} o{k} = c{k} + (j + {la}) * meta[{last + (k + 1) * rank_red}];"
                              for k in range(n)]
        lines += [f"      {b}" for b in body] + [
            "      " + (combine if la == 0 else re.sub(r"\bacc\b", f"acc{la}", combine)), "    }"]
    lines += ["  }", f"  for (; j < meta[{last}]; j++) {{"]
    lines += [f"    {index_t} o{k} = c{k} + j * meta[{last + (k + 1) * rank_red}];" for k in range(n)]
    lines += [f"    {b}" for b in body] + [f"    {combine}", "  }"] + (["  }"] if rank_red == 2 else [])
    return lines + [f"  {{ {acc_t} v = acc{la}; {combine} }}" for la in range(1, lanes)]


def _reduce_element_offsets(rank_red, n, index_t, base_red):
    """Each operand's offset `o{k}` of reduced element j."""
    if rank_red == 1:  # one reduced dim (the lowering merges contiguous ones): no division per element
        return [f"    {index_t} o{k} = b{k} + j * meta[{base_red + k + 1}];" for k in range(n)]
    lines = [f"    {index_t} o{k} = b{k};" for k in range(n)]
    lines += [f"    {index_t} s = j;", f"    for (int d = {rank_red - 1}; d >= 0; d--) {{",
              f"      {index_t} q = s % meta[{base_red} + d]; s /= meta[{base_red} + d];"]
    lines += [f"      o{k} += q * meta[{base_red + (k + 1) * rank_red} + d];" for k in range(n)]
    return lines + ["    }"]


def _reduce_work_group(acc_t, group, combine):
    """Combine the work-items' partial results in local memory, a tree of halves (combine is associative:
    acc op= v); work-item 0 goes on with the result."""
    return [f"  __local {acc_t} part[{group}];", "  const int l = get_local_id(0);",
            "  part[l] = acc;", "  barrier(CLK_LOCAL_MEM_FENCE);",
            f"  for (int s = {group // 2}; s > 0; s >>= 1) {{",
            f"    if (l < s) {{ acc = part[l]; {acc_t} v = part[l + s]; {combine} part[l] = acc; }}",
            "    barrier(CLK_LOCAL_MEM_FENCE);", "  }", "  if (l != 0) return;", "  acc = part[0];"]


def _reduce_finish(args, index_t, rank_out, rank_red, base_red, acc_t, init, combine, splits, columns):
    """Kernel `red_finish`, up to its store: one work-item per output combines the `splits` partial results (columns:
    split s's at part[s * total + i], else at part[i * splits + s])."""
    at = "s * total + i" if columns else f"i * {splits} + s"
    return [f"__kernel void red_finish({', '.join(args)}) {{",
            f"  {index_t} i = get_global_id(0);",
            f"  {index_t} total = 1; for (int d = 0; d < {rank_out}; d++) total *= meta[d];",
            "  if (i >= total) return;",
            f"  {index_t} oy = 0, r = i;",
            f"  for (int d = {rank_out - 1}; d >= 0; d--) {{ {index_t} q = r % meta[d]; r /= meta[d]; "
            f"oy += q * meta[{rank_out} + d]; }}",
            _reduce_count(index_t, rank_red, base_red),
            f"  {acc_t} acc = {init};",
            f"  for (int s = 0; s < {splits}; s++) {{ {acc_t} v = part[{at}]; {combine} }}"]
