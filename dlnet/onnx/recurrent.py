"""RNN, GRU, LSTM unrolled at load into Gemm + pointwise ops (sequence lengths are static).

The input projection X W^T + Wb is one Gemm over all time steps; each step adds H R^T + Rb (a Gemm with C) and
the gate maths. Gate order in W/R/B: LSTM i, o, f, c; GRU z, r, h; RNN one gate.
"""
import numpy as np

from ..errors import ModelError
from .common import const, handler, reshape, slice_axes

ACTIVATIONS = {"Tanh": "Tanh", "Sigmoid": "Sigmoid", "Relu": "Relu"}


def _act(b, name, x):
    op = ACTIVATIONS.get(name)
    if op is None:
        raise ModelError(f"recurrent activation {name!r} is not supported (supported: {sorted(ACTIVATIONS)})")
    return b.op(op, [x])


def _gate(imp, v, k, hidden):
    """Gate k of a [..., G*H] value."""
    return slice_axes(imp, v, [k * hidden], [(k + 1) * hidden], [v.rank - 1], None)


def _weights(imp, d, w, r, bias, gates, hidden):
    """Direction d's W [G*H, I], R [G*H, H] and the W and R halves of its bias (None without a bias)."""
    b = imp.b
    wd = reshape(b, slice_axes(imp, w, [d], [d + 1], [0], None), w.shape[1:])
    rd = reshape(b, slice_axes(imp, r, [d], [d + 1], [0], None), r.shape[1:])
    wb = rb = None
    if bias is not None:
        bd = reshape(b, slice_axes(imp, bias, [d], [d + 1], [0], None), bias.shape[1:])
        wb = slice_axes(imp, bd, [0], [gates * hidden], None, None)
        rb = slice_axes(imp, bd, [gates * hidden], [2 * gates * hidden], None, None)
    return wd, rd, wb, rb


def _gru_step(imp, f, at, xt, h, rd, rb, hidden):
    """One GRU step: the new H from xt (the step's input projection, gates z, r, h) and H."""
    b = imp.b
    rz = slice_axes(imp, rd, [0], [2 * hidden], [0], None)
    rh = slice_axes(imp, rd, [2 * hidden], [3 * hidden], [0], None)
    hr = b.op("Gemm", [h, rz] + ([slice_axes(imp, rb, [0], [2 * hidden], None, None)] if rb is not None
                                  else []), {"transB": 1})
    z = _act(b, f[0], b.op("Add", [_gate(imp, xt, 0, hidden), _gate(imp, hr, 0, hidden)]))
    rg = _act(b, f[0], b.op("Add", [_gate(imp, xt, 1, hidden), _gate(imp, hr, 1, hidden)]))
    rbh = [_gate(imp, rb, 2, hidden)] if rb is not None else []
    if at.get("linear_before_reset", 0):
        hh = b.op("Mul", [rg, b.op("Gemm", [h, rh] + rbh, {"transB": 1})])
    else:
        hh = b.op("Gemm", [b.op("Mul", [rg, h]), rh] + rbh, {"transB": 1})
    cand = _act(b, f[1], b.op("Add", [_gate(imp, xt, 2, hidden), hh]))
    # H = (1 - z) * cand + z * H = cand + z * (H - cand)
    return b.op("Add", [cand, b.op("Mul", [z, b.op("Sub", [h, cand])])])


def _lstm_step(imp, f, pre, c, peeps, hidden):
    """One LSTM step: (H, C) from the gates' pre-activations (i, o, f, c) and C; peeps (p_i, p_o, p_f) or None."""
    b = imp.b
    gi, go, gf, gc = (_gate(imp, pre, k, hidden) for k in range(4))
    if peeps is not None:
        p_i, p_o, p_f = peeps
        gi = b.op("Add", [gi, b.op("Mul", [p_i, c])])
        gf = b.op("Add", [gf, b.op("Mul", [p_f, c])])
    c = b.op("Add", [b.op("Mul", [_act(b, f[0], gf), c]),
                     b.op("Mul", [_act(b, f[0], gi), _act(b, f[1], gc)])])
    if peeps is not None:
        go = b.op("Add", [go, b.op("Mul", [p_o, c])])
    return b.op("Mul", [_act(b, f[0], go), _act(b, f[2], c)]), c


def _unroll(imp, node, xs, at, kind):
    b = imp.b
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    x, w, r = xs[0], xs[1], xs[2]
    opt = list(xs[3:]) + [None] * (8 - len(xs))
    bias, seq_lens, init_h = opt[0], opt[1], opt[2]
    init_c = opt[3] if kind == "LSTM" else None
    peep = opt[4] if kind == "LSTM" else None
    layout = at.get("layout", 0)
    if layout:
        x = b.op("Transpose", [x], {"perm": (1, 0, 2)})
        init_h = b.op("Transpose", [init_h], {"perm": (1, 0, 2)}) if init_h is not None else None
        init_c = b.op("Transpose", [init_c], {"perm": (1, 0, 2)}) if init_c is not None else None
    seq, batch, _ = x.shape
    if seq_lens is not None:
        lens = np.asarray(const(seq_lens, f"{kind}'s sequence_lens")).reshape(-1)
        if not np.all(lens == seq):
            raise ModelError(f"{kind} with sequence_lens {lens.tolist()} shorter than the sequence ({seq})")
    hidden = at.get("hidden_size") or r.shape[-1]
    direction = at.get("direction", "forward")
    ndir = 2 if direction == "bidirectional" else 1
    defaults = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}[kind]
    acts = list(at.get("activations") or defaults * ndir)
    if at.get("clip") is not None:
        raise ModelError(f"{kind} with clip is not supported")
    if kind == "LSTM" and at.get("input_forget", 0):
        raise ModelError("LSTM with input_forget is not supported")
    zeros = b.const(np.zeros((batch, hidden), x.dtype))
    ys, hs, cs = [], [], []
    x2 = reshape(b, x, (seq * batch, x.shape[2]))
    for d in range(ndir):
        reverse = direction == "reverse" or d == 1
        f = acts[d * len(defaults):(d + 1) * len(defaults)]
        wd, rd, wb, rb = _weights(imp, d, w, r, bias, gates, hidden)
        proj = b.op("Gemm", [x2, wd] + ([wb] if wb is not None else []), {"transB": 1})
        proj = reshape(b, proj, (seq, batch, gates * hidden))
        h = reshape(b, slice_axes(imp, init_h, [d], [d + 1], [0], None), (batch, hidden)) \
            if init_h is not None else zeros
        c = reshape(b, slice_axes(imp, init_c, [d], [d + 1], [0], None), (batch, hidden)) \
            if init_c is not None else zeros
        peeps = None
        if peep is not None:
            pd = reshape(b, slice_axes(imp, peep, [d], [d + 1], [0], None), peep.shape[1:])
            peeps = tuple(_gate(imp, pd, k, hidden) for k in range(3))
        outs = [None] * seq
        for t in (range(seq - 1, -1, -1) if reverse else range(seq)):
            xt = reshape(b, slice_axes(imp, proj, [t], [t + 1], [0], None), (batch, gates * hidden))
            if kind == "GRU":
                h = _gru_step(imp, f, at, xt, h, rd, rb, hidden)
            else:
                pre = b.op("Add", [xt, b.op("Gemm", [h, rd] + ([rb] if rb is not None else []), {"transB": 1})])
                if kind == "RNN":
                    h = _act(b, f[0], pre)
                else:
                    h, c = _lstm_step(imp, f, pre, c, peeps, hidden)
            outs[t] = reshape(b, h, (1, 1, batch, hidden))
        ys.append(outs[0] if seq == 1 else b.op("Concat", outs, {"axis": 0}))
        hs.append(reshape(b, h, (1, batch, hidden)))
        cs.append(reshape(b, c, (1, batch, hidden)))
    y = ys[0] if ndir == 1 else b.op("Concat", ys, {"axis": 1})
    yh = hs[0] if ndir == 1 else b.op("Concat", hs, {"axis": 0})
    yc = cs[0] if ndir == 1 else b.op("Concat", cs, {"axis": 0})
    if layout:
        y = b.op("Transpose", [y], {"perm": (2, 0, 1, 3)})
        yh = b.op("Transpose", [yh], {"perm": (1, 0, 2)})
        yc = b.op("Transpose", [yc], {"perm": (1, 0, 2)})
    outs = [y, yh] + ([yc] if kind == "LSTM" else [])
    return outs[:len(node.output)]


@handler("RNN", 1, 7, 14, 22)  # 7 drops output_sequence; 14 adds layout; 22 adds types
def _rnn(imp, node, xs, at):
    return _unroll(imp, node, xs, at, "RNN")


@handler("GRU", 1, 3, 7, 14, 22)  # 3 adds linear_before_reset
def _gru(imp, node, xs, at):
    return _unroll(imp, node, xs, at, "GRU")


@handler("LSTM", 1, 7, 14, 22)
def _lstm(imp, node, xs, at):
    return _unroll(imp, node, xs, at, "LSTM")
