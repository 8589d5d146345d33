"""A plan's run on a CPU device as one persistent kernel: consecutive launches merged into a single launch of one
work-group per worker thread, whose work-items claim each layer's work-groups through atomic counters and wait for
the layer's last one before the next.

Why: PoCL 3.0's idle worker sleeps at every kernel boundary, and the first worker to take a kernel takes half its
work-groups at once, so on two vCPUs a kernel of 0.1-0.4 ms ran only 1.45-1.75x faster on two workers than on one.
In one kernel the workers stay awake between layers: the same chain of layers ran 1.9-2.0x faster
(bench/RESULTS.md, session 31). A worker that starts late, or never, costs no correctness: every claimed work-group
is run by a running worker, so the others wait only for work in flight, and the last worker out zeroes the counters
for the next run.

How: each launch's program (its defines and .cl text) becomes a chunk of one program; its functions, typedefs and
kernels are renamed with the program's index (launches of one program share it), its kernel turns into a function
taking the work-group's indices and the grid's size, its
__local array points into one array of the persistent kernel, and its macros are undefined after it. The calls pass
each argument as a literal (scalars) or one of the persistent kernel's buffers (the plan's arenas and tables).
Launches that do not fit (a local size above 1, barriers or local ids under a local size PoCL picks, __local
arguments, an upload to wait for) run as themselves between merged runs. Plan.run switches to these launches at the
plan's second run (Options.cpu_persistent_after), so that a plan run once builds no such program;
Options.cpu_persistent turns it off."""
import re

import numpy as np

from .launch import Deferred, Launch, PendingKernel
from .runtime import cl

# numpy scalar type of a kernel argument -> its OpenCL C cast
_SCALARS = {np.dtype(np.int32): "int", np.dtype(np.uint32): "uint", np.dtype(np.int64): "long",
            np.dtype(np.uint64): "ulong", np.dtype(np.float32): "float"}
_BUILTINS = {  # the work-item functions of a kernel of local size 1, from the claimed work-group's indices
    "get_global_id": "((d) == 0 ? _g0 : (d) == 1 ? _g1 : _g2)", "get_group_id": "get_global_id(d)",
    "get_global_size": "((d) == 0 ? _G0 : (d) == 1 ? _G1 : _G2)", "get_num_groups": "get_global_size(d)",
    "get_local_id": "0", "get_local_size": "1"}
_FUNC = re.compile(r"^(?:inline\s+|static\s+)*(?!typedef\b|return\b|else\b)[A-Za-z_]\w*\s*\**\s+\**\s*(\w+)\s*\(",
                   re.M)
_KERNEL = re.compile(r"__kernel\s+(?:__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)\s*)?void\s+(\w+)\s*\(")
_TYPEDEF = re.compile(r"^typedef\b[^;]*?(\w+)\s*;", re.M)
_DEFINE = re.compile(r"^\s*#\s*define\s+(\w+)", re.M)
_LOCAL = re.compile(r"__local\s+(\w+)\s+(\w+)\s*\[([^\]]+)\]\s*;")
_NUMERIC = re.compile(r"^\s*#\s*define\s+(\w+)\s+([^\\\n]+)$", re.M)


def _close(text, start, pair="()"):
    """Index of the bracket closing the one at text[start] (pair: the opening and closing characters)."""
    depth, step = 0, {pair[0]: 1, pair[1]: -1}
    for i in range(start, len(text)):
        depth += step.get(text[i], 0)
        if depth == 0:
            return i
    raise ValueError(f"unbalanced {pair}")


def _value(expr, macros):
    """The integer an array size of a literal or object-like macros (the chunk's defines) comes to, or None."""
    for _ in range(8):
        expr = expr.strip()
        while expr.startswith("(") and expr.endswith(")"):
            expr = expr[1:-1].strip()
        if re.fullmatch(r"\d+[uUlL]*", expr):
            return int(re.sub(r"[uUlL]", "", expr))
        if expr not in macros:
            return None
        expr = macros[expr]
    return None


_BYTES = {"char": 1, "uchar": 1, "short": 2, "ushort": 2, "half": 2, "int": 4, "uint": 4, "float": 4, "long": 8,
          "ulong": 8, "double": 8, "float2": 8, "float4": 16, "float8": 32, "float16": 64, "int4": 16}


def chunk(source, name, i):
    """(OpenCL C text, __local bytes) of program `source` with kernel `name` as function `name`_L<i> (its work-group's
    indices and the grid's size its last arguments), or None where it does not fit."""
    kernels = _KERNEL.findall(source)
    if name not in kernels:
        return None
    names = {n for n in set(kernels) | set(_FUNC.findall(source)) | set(_TYPEDEF.findall(source))
             if not n.startswith("__") and n not in ("void", "sizeof")}
    out, pos = [], 0  # kernels become functions with the work-group's indices (and the __local array) last
    for m in _KERNEL.finditer(source):
        close = _close(source, m.end() - 1)
        out += [source[pos:m.start()], f"__attribute__((noinline)) void {m.group(1)}(", source[m.end():close],
                ", const ulong _g0, const ulong _g1, const ulong _g2, const ulong _G0, const ulong _G1,"
                " const ulong _G2, __local char* _lm)"]
        pos = close + 1
    text = "".join(out) + source[pos:]
    macros = dict(_NUMERIC.findall(source))
    try:
        mine = _LOCAL.findall(_kernel_body(text, name))
    except ValueError:
        return None
    if len(mine) > 1 or any(t not in _BYTES or _value(n, macros) is None for t, _, n in mine):
        return None
    decls = [(_value(n, macros), t) for t, _, n in _LOCAL.findall(text) if t in _BYTES]  # (every kernel's array
    nbytes = max([v * _BYTES[t] for v, t in decls if v] + [0])  # that is compiled in shares _lm)
    text = _LOCAL.sub(lambda m: f"__local {m.group(1)}* {m.group(2)} = (__local {m.group(1)}*)_lm;", text)
    text = re.sub(r"(?m)^(?!__constant)(.*)__constant\b", r"\1__global", text)  # (table arguments, read alike)
    text = re.sub(r"\b(" + "|".join(sorted(names, key=len, reverse=True)) + r")\b", rf"\1_L{i}", text)
    head = "".join(f"#define {k}(d) {v}\n" for k, v in _BUILTINS.items()) + "#define barrier(f) ((void)0)\n"
    undef = sorted(set(_DEFINE.findall(text)) | set(_BUILTINS) | {"barrier"})
    return head + text + "\n" + "".join(f"#undef {k}\n" for k in undef), nbytes


def _kernel_body(text, name):
    """The text of function `name`'s body (ValueError where there is none)."""
    m = re.search(rf"\bvoid\s+{name}\s*\(", text)
    if m is None:
        raise ValueError(f"no function {name}")
    brace = text.index("{", _close(text, m.end() - 1))
    return text[brace:_close(text, brace, "{}") + 1]


def _literal(a):
    """A scalar argument as an OpenCL C expression of its type."""
    kind = _SCALARS[np.asarray(a).dtype]
    if kind == "float":
        v = float(a)
        return "INFINITY" if v == np.inf else "(-INFINITY)" if v == -np.inf else "NAN" if v != v else \
            f"{v.hex()}f"
    return f"(({kind}){int(a)}{'UL' if kind == 'ulong' else 'L' if kind == 'long' else ''})"


def mergeable(launch):
    """Can this launch be a layer of a persistent kernel?"""
    p = launch.pending
    if not isinstance(p, PendingKernel) or p.key[1] or launch.wait is not None:
        return False
    if launch.lsize is not None and any(v != 1 for v in launch.lsize):
        return False
    for a in p.args:  # (buffers and scalars; no __local arguments)
        if not isinstance(a, (Deferred, cl.MemoryObjectHolder)) and np.asarray(a).dtype not in _SCALARS:
            return False
    if launch.lsize is not None:
        return True
    try:  # (a local size PoCL picks: the kernel must not depend on it)
        body = _kernel_body(p.key[0], p.name)
    except ValueError:
        return False
    return not re.search(r"\b(barrier|get_local_id|get_group_id|get_local_size)\s*\(", body)


def source(launches):
    """(program text, [buffers]) of the persistent kernel "persist" running `launches` in order, one work-group per
    worker, or None where one of them does not fit; its last arguments are the counters (2 per launch + 1, from
    `base` on)."""
    chunks, calls, buffers, lm, programs = [], [], {}, 0, {}
    for i, launch in enumerate(launches):
        p = launch.pending
        j = programs.get((p.key, p.name))
        if j is None:  # (launches of one program share its function)
            j = programs[p.key, p.name] = len(programs)
            made = chunk(p.key[0], p.name, j)
            if made is None:
                return None
            text, nbytes = made
            lm = max(lm, nbytes)
            chunks.append(text)
        args = []
        for a in p.args:
            if isinstance(a, (Deferred, cl.MemoryObjectHolder)):
                buf = a.get() if isinstance(a, Deferred) else a
                args.append(f"B{buffers.setdefault(buf.int_ptr, (len(buffers), buf))[0]}")
            else:
                args.append(_literal(a))
        g = tuple(launch.gsize) + (1,) * (3 - len(launch.gsize))
        total = g[0] * g[1] * g[2]
        ids = [f"(ulong)(k % {g[0]})", f"(ulong)((k / {g[0]}) % {g[1]})", f"(ulong)(k / {g[0] * g[1]})"] + \
            [f"{v}UL" for v in g] + ["_lm"]
        call = f"{p.name}_L{j}({', '.join(args + ids)})"
        calls.append(_LAYER.format(i=i, claim=2 * i, done=2 * i + 1, total=total, call=call))
    bufs = sorted(buffers.values())
    params = ", ".join([f"__global void* B{j}" for j, _ in bufs] + ["volatile __global int* counters", "int base"])
    counters = 2 * len(launches)
    kernel = (f"__kernel __attribute__((reqd_work_group_size(1, 1, 1)))\nvoid persist({params}) {{\n"
              f"    __local float16 _lmv[{max(1, -(-lm // 64))}];\n    __local char* _lm = (__local char*)_lmv;\n"
              "    const int workers = get_num_groups(0);\n    volatile __global int* ctr = counters + base;\n"
              + "".join(calls) +
              f"    if (atomic_inc(ctr + {counters}) == workers - 1)\n"
              f"        for (int i = 0; i <= {counters}; i++) ctr[i] = 0;\n}}\n")
    return "\n".join(chunks) + "\n" + kernel, [b for _, b in bufs]


# one layer of the persistent kernel: claim work-groups until none is left, then wait for the others' in flight
_LAYER = """    for (;;) {{  // layer {i}: guided, each claim a 1 / (2 workers) share of what is left
        const int left = {total} - *(volatile __global int*)(ctr + {claim}), share = left / (2 * workers);
        const int step = share > 1 ? share : 1, c = atomic_add(ctr + {claim}, step);
        if (c >= {total}) break;
        const int e = c + step < {total} ? c + step : {total};
        for (int k = c; k < e; k++) {call};
        atomic_add(ctr + {done}, e - c);
    }}
    while (*(volatile __global int*)(ctr + {done}) < {total}) ;
    atomic_add(ctr + {done}, 0);
"""


# launches per persistent kernel at most: a longer run is cut into even pieces, their programs built at once (cold,
# densenet121's 187 launches took 10 s as one program on 2 cores)
PIECE = 48


def counters_bytes(ctx, launches):
    """Bytes of counters the persistent kernels of `launches` may need on ctx (an upper bound: 2 per launch and 1
    per kernel), or 0 where it runs none: not a CPU device of several workers, Options.cpu_persistent off, or fewer
    than Options.cpu_persistent_min launches that can be merged at all."""
    if not (ctx.is_cpu and ctx.options.cpu_persistent and ctx.device.max_compute_units > 1):
        return 0
    n = sum(1 for la in launches if mergeable(la))
    return 4 * (3 * n + 1) if n >= max(2, ctx.options.cpu_persistent_min) else 0


def persistent_launches(ctx, launches, counters):
    """The launches a run enqueues: each run of at least Options.cpu_persistent_min consecutive mergeable launches
    as persistent launches of at most PIECE (their programs built here, together; the launches as they are where one
    does not build), the rest as they are. `counters`: a zeroed buffer of counters_bytes(ctx, launches) for them."""
    least = max(2, ctx.options.cpu_persistent_min)
    groups, run = [], []

    def flush():
        if len(run) >= least:
            size = -(-len(run) // -(-len(run) // PIECE))
            groups.extend(run[i:i + size] for i in range(0, len(run), size))
        else:
            groups.extend([la] for la in run)
        run.clear()
    for launch in launches:
        if mergeable(launch):
            run.append(launch)
        else:
            flush()
            groups.append([launch])
    flush()
    made = [source(g) if len(g) > 1 else None for g in groups]
    try:
        ctx.build_all([(m[0], ()) for m in made if m is not None])
    except Exception:  # noqa: BLE001 (each is built alone below, where it builds)
        pass
    out, base = [], 0
    for g, m in zip(groups, made):
        merged = _merge(ctx, g, m, counters, base) if m is not None else None
        out.extend([merged] if merged is not None else g)
        base += 2 * len(g) + 1 if merged is not None else 0
    return out


def _merge(ctx, launches, made, counters, base):
    text, bufs = made
    try:
        kernel = ctx.kernel(text, "persist")
    except Exception:  # noqa: BLE001 (a program the compiler refuses: the launches run as they are)
        return None
    kernel.set_args(*bufs, counters, np.int32(base))
    label = f"persistent {launches[0].label} .. {launches[-1].label} ({len(launches)} launches)"
    return Launch(kernel, (ctx.device.max_compute_units,), (1,), label, "persistent")
