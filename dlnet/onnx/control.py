"""Control flow inlined at load: If on a constant condition, Scan and Loop unrolled (trip counts are static).

A body graph is built by the same handlers, in the importer's value scope (bodies may read outer values), with its
inputs bound to IR values; the scope is restored afterwards.
"""
import numpy as np

from ..errors import ModelError
from .common import const, handler, norm_axis, reshape, slice_axes


def inline(imp, body, bound):
    """Build GraphProto `body` with its inputs bound to `bound` (a list of values); returns its output values."""
    if len(bound) != len(body.input):
        raise ModelError(f"subgraph {body.name!r} takes {len(body.input)} inputs, given {len(bound)}")
    saved, name = dict(imp.values), imp.b.node_name
    try:
        for init in body.initializer:
            imp.initializer(init, f"{imp.path}: subgraph {body.name!r} initializer {init.name!r}")
        for vi, v in zip(body.input, bound, strict=False):
            imp.values[vi.name] = v
        for k, node in enumerate(body.node):  # (as the graph's own nodes: checks, host dtypes, bfloat16)
            imp.import_node(f"{body.name}/{k}", node)
        missing = [o.name for o in body.output if o.name not in imp.values]
        if missing:
            raise ModelError(f"subgraph {body.name!r}: output {missing[0]!r} is never computed")
        return [imp.values[o.name] for o in body.output]
    finally:
        imp.values, imp.b.node_name = saved, name


@handler("If", 1, 11, 13, 16, 19, 21, 23, 24, 25)  # later versions add types (sequences, optionals)
def _if(imp, node, xs, at):
    cond = np.asarray(const(xs[0], "If's condition (the branch is chosen at load)")).reshape(-1)
    branch = at["then_branch"] if bool(cond[0]) else at["else_branch"]
    outs = inline(imp, branch, [])
    return [imp.b.op("Identity", [v]) if v.const is None else v for v in outs]


def _stack(b, parts, axis):
    parts = [reshape(b, p, p.shape[:axis] + (1,) + p.shape[axis:]) for p in parts]
    return parts[0] if len(parts) == 1 else b.op("Concat", parts, {"axis": axis})


def _scan(imp, node, xs, at, states, scans):
    """Unrolled Scan: states carried, scan inputs sliced per step, scan outputs stacked."""
    b = imp.b
    body = at["body"]
    n_scan = at["num_scan_inputs"]
    in_axes = list(at.get("scan_input_axes") or [0] * n_scan)
    in_dirs = list(at.get("scan_input_directions") or [0] * n_scan)
    n_out = len(body.output) - len(states)
    out_axes = list(at.get("scan_output_axes") or [0] * n_out)
    out_dirs = list(at.get("scan_output_directions") or [0] * n_out)
    in_axes = [norm_axis(a, s.rank) for a, s in zip(in_axes, scans, strict=False)]
    steps = scans[0].shape[in_axes[0]] if scans else 0
    collected = [[] for _ in range(n_out)]
    for t in range(steps):
        slices = []
        for s, a, d in zip(scans, in_axes, in_dirs, strict=False):
            i = steps - 1 - t if d else t
            slices.append(reshape(b, slice_axes(imp, s, [i], [i + 1], [a], None), s.shape[:a] + s.shape[a + 1:]))
        outs = inline(imp, body, states + slices)
        states = outs[:len(states)]
        for k, v in enumerate(outs[len(states):]):
            collected[k].append(v)
    results = list(states)
    for k, parts in enumerate(collected):
        if out_dirs[k]:
            parts = parts[::-1]
        axis = norm_axis(out_axes[k], parts[0].rank + 1) if parts else 0
        results.append(_stack(b, parts, axis))
    return results


@handler("Scan", 9, 11, 16, 19, 21, 23, 24, 25)  # 9: no batch axis or sequence_lens; axes/directions attrs
def _scan_9(imp, node, xs, at):
    n_scan = at["num_scan_inputs"]
    states, scans = list(xs[:len(xs) - n_scan]), list(xs[len(xs) - n_scan:])
    return _scan(imp, node, xs, at, states, scans)


@handler("Scan", 8)
def _scan_8(imp, node, xs, at):  # op-set 8: batch axis 0, optional sequence_lens first (all full length here)
    b = imp.b
    n_scan = at["num_scan_inputs"]
    lens, rest = xs[0], list(xs[1:])
    states, scans = rest[:len(rest) - n_scan], rest[len(rest) - n_scan:]
    if lens is not None and not np.all(np.asarray(const(lens, "Scan's sequence_lens")) == scans[0].shape[1]):
        raise ModelError("Scan-8 with sequence_lens shorter than the sequence is not supported")
    nb = states[0].shape[0] if states else scans[0].shape[0]
    per_batch = []
    for i in range(nb):
        st = [reshape(b, slice_axes(imp, s, [i], [i + 1], [0], None), s.shape[1:]) for s in states]
        sc = [reshape(b, slice_axes(imp, s, [i], [i + 1], [0], None), s.shape[1:]) for s in scans]
        at9 = dict(at, scan_input_directions=at.get("directions"))
        per_batch.append(_scan(imp, node, xs, at9, st, sc))
    return [_stack(b, [r[k] for r in per_batch], 0) for k in range(len(per_batch[0]))]


LOOP_LIMIT = 4096  # unrolled iterations at most: a bound on the graph a Loop may grow into


@handler("Loop", 1, 11, 13, 16, 19, 21, 23, 24, 25)  # later versions add types (sequences, optionals)
def _loop(imp, node, xs, at):
    """Unrolled while the (constant) trip count and the (folded) condition allow; scan outputs stacked on axis 0."""
    b = imp.b
    body = at["body"]
    trip = int(np.asarray(const(xs[0], "Loop's trip count")).reshape(-1)[0]) if xs[0] is not None else None
    cond_v = xs[1] if len(xs) > 1 else None
    cond = bool(np.asarray(const(cond_v, "Loop's condition")).reshape(-1)[0]) if cond_v is not None else True
    states = list(xs[2:])
    n_scan = len(body.output) - 1 - len(states)
    collected = [[] for _ in range(n_scan)]
    i = 0
    while cond and (trip is None or i < trip):
        if i >= LOOP_LIMIT:
            raise ModelError(f"Loop runs past {LOOP_LIMIT} unrolled iterations")
        outs = inline(imp, body, [b.const(np.asarray(i, np.int64)), b.const(np.asarray(cond))] + states)
        cond = bool(np.asarray(const(outs[0], "Loop's condition after an iteration")).reshape(-1)[0])
        states = outs[1:1 + len(states)]
        for k, v in enumerate(outs[1 + len(states):]):
            collected[k].append(v)
        i += 1
    if n_scan and i == 0:
        raise ModelError("Loop with scan outputs that runs no iteration (empty outputs) is not supported")
    return [b.op("Identity", [s]) for s in states] + [_stack(b, parts, 0) for parts in collected]
