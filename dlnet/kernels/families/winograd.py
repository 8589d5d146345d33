"""Winograd F(2x2, 3x3) and F(4x4, 3x3) convolutions on the GPU cores (winograd.cl's transforms around one batched
GEMM), their input gradients, and their weight gradients (F(2x2)); and the workspace each asks of the planner."""
import numpy as np

from ..emitter import act_macro, defines
from ..half import half_defines
from ..rules import round_up, wino_chunk
from ..runtime import kernel_source


def winograd_workspace(k, c, y_shape, options, on_device=False, m=2):
    """(all, least) bytes of a Winograd F(m x m, 3x3) convolution's workspace: V and M, (m + 2)^2 (C + K) floats
    per m x m output tile, all of them or at least an eighth of the layer's tiles (at most 8 chunks) and at least
    options.winograd_min_tiles (all of them up to options.winograd_whole_bytes); before them U (16 K C floats) where
    it is made on the device every run."""
    tiles = y_shape[0] * -(-y_shape[2] // m) * -(-y_shape[3] // m)
    per_tile = 4 * (m + 2) ** 2 * (k + c)
    u = -(-64 * k * c // 256) * 256 if on_device else 0
    full = u + per_tile * tiles
    if full <= options.winograd_whole_bytes:
        return full, full
    return full, u + per_tile * min(tiles, max(options.winograd_min_tiles, -(-tiles // 8)))


def workspace(node, options):
    """The workspace a Winograd node (Conv, ConvGradX, ConvGradW with attrs winograd) asks of the planner, or
    None."""
    if not node.attrs.get("winograd"):
        return None
    w = node.inputs[1]
    if node.op == "Conv":
        y = node.outputs[0]
        if node.attrs["winograd"] == 1:  # U [m + 2, m + 2, K, C] made at load
            return winograd_workspace(w.shape[2], w.shape[3], y.shape, options, m=w.shape[0] - 2)
        return winograd_workspace(w.shape[0], w.shape[1], y.shape, options, on_device=True)
    if node.op == "ConvGradX":  # U of the flipped, transposed filters, then V and M over dx's tiles
        return winograd_workspace(w.shape[1], w.shape[0], node.outputs[0].shape, options, on_device=True)
    if node.op == "ConvGradW":  # the 16 sums over tiles [16, K, C], then dY's and x's transformed tiles
        k, c = node.attrs["w_shape"][:2]
        return winograd_workspace(k, c, node.inputs[0].shape, options, on_device=True)
    return None


class WinogradFamily:
    def winograd(self, x, u, bargs, rargs, y, head, pads, label, w=None, flip=False):
        """A convolution through Winograd F(2x2, 3x3), u = G w G^T [4, 4, K, C], or F(4x4, 3x3), u [6, 6, K, C]:
        input transform (winograd.cl) -> (m + 2)^2 products U[xi] V[xi] as one batched GEMM on the core -> output
        transform with the epilogue. V and M live in the block of the activation arena the planner set aside for this
        layer (plan.temps): where it is short of the whole layer, the layer runs in chunks of tiles, three launches
        each. u: the transformed weights (passes/winograd.py), or None with w: weights that change every run
        (training, F(2x2)), transformed here first into the front of that block (flip: dX's filters, w [C, K, 3, 3]
        flipped and transposed)."""
        N, C, H, W = x.shape
        K, OH, OW = y.shape[1:]
        m = u.shape[0] - 2 if u is not None else 2
        nx, kind = (m + 2) ** 2, "" if m == 2 else str(m)
        TH, TW = -(-OH // m), -(-OW // m)
        T = N * TH * TW
        off, nbytes = self.plan.temps[y.id]  # the planner's block for U, V and M (winograd_workspace)
        if u is None:
            u_bytes = round_up(64 * K * C, 256)
            src = defines({"IDX": self.index_type(w.size, 16 * K * C)} | ({"FLIP": 1} if flip else {})) + \
                act_macro(None) + kernel_source("conv_half") + kernel_source("winograd")
            self.emit(src, "wino_weights", self.args(w) + [self.act_buf, np.uint64(off // 4)] + [
                np.int32(K), np.int32(C)], (round_up(K * C, 64),), (64,), label + " winograd weights")
            uargs = [self.act_buf, np.uint64(off // 4)]
            off, nbytes = off + u_bytes, nbytes - u_bytes
        else:
            uargs = self.args(u)
        TC = wino_chunk(T, nbytes, C, K, self.options, nx)
        v_at, m_at = [self.act_buf, np.uint64(off // 4)], [self.act_buf, np.uint64(off // 4 + nx * C * TC)]
        idx = self.index_type(x.size, y.size, nx * C * TC, nx * K * TC)
        src = defines({"IDX": idx, "WINO_M": m}) + head + kernel_source("conv_half") + kernel_source("winograd")
        for t0 in range(0, T, TC):
            tc = min(TC, T - t0)
            table = np.array([[xi * K * C, xi * C * tc, 0, xi * K * tc] for xi in range(nx)], np.int64)
            tag = f" winograd{kind}{'' if TC == T else f' tiles {t0}+{tc}'}"
            self.emit(src, "wino_input" + kind, self.args(x) + v_at + [np.int32(v) for v in (
                C, H, W, pads[0], pads[1], TH, TW, t0, tc)], (round_up(tc, 64), C), (64, 1), label + tag + " in")
            self._gemm_launch(uargs, v_at, None, m_at, table, K, tc, C, (C, 1, tc, 1, 0, 0), idx, None, 1.0,
                              0.0, label + tag + " gemm", f"winograd{m}", half_defines(A=u))  # (u: fp16's half)
            self.emit(src, "wino_output" + kind, m_at + bargs + rargs + self.args(y) + [
                np.int32(v) for v in (K, OH, OW, TH, TW, t0, tc)] + [np.int64(K * OH * OW)] * 2,
                (round_up(tc, 64), K), (64, 1), label + tag + " out")

    def winograd_dw(self, dy, x, dw, pads, label):
        """dW of a 3x3 stride-1 convolution through Winograd F(2x2, 3x3): per chunk of tiles, x's tiles transformed
        (V = B^T d B, wino_input), dy's (E = A dY A^T, wino_dy), and the 16 sums over tiles M[xi] += E[xi] V[xi]^T
        as one batched GEMM (K x tc times tc x C, both along the tiles); then dw = G^T M G (wino_dw). M sits at the
        front of the planner's block for this node (plan.temps), E and V after it."""
        N, C, H, W = x.shape
        K, OH, OW = dy.shape[1:]
        TH, TW = -(-OH // 2), -(-OW // 2)
        T = N * TH * TW
        off, nbytes = self.plan.temps[dw.id]  # ConvGradW.workspace
        m_bytes = round_up(64 * K * C, 256)
        m_at = [self.act_buf, np.uint64(off // 4)]
        off, nbytes = off + m_bytes, nbytes - m_bytes
        TC = wino_chunk(T, nbytes, C, K, self.options)
        e_at, v_at = [self.act_buf, np.uint64(off // 4)], [self.act_buf, np.uint64(off // 4 + 16 * K * TC)]
        idx = self.index_type(x.size, dy.size, 16 * C * TC, 16 * K * TC, 16 * K * C)
        src = defines({"IDX": idx}) + act_macro(None) + kernel_source("conv_half") + kernel_source("winograd")
        for t0 in range(0, T, TC):
            tc = min(TC, T - t0)
            tag = f" winograd{'' if TC == T else f' tiles {t0}+{tc}'}"
            self.emit(src, "wino_input", self.args(x) + v_at + [np.int32(v) for v in (
                C, H, W, pads[0], pads[1], TH, TW, t0, tc)], (round_up(tc, 64), C), (64, 1), label + tag + " in")
            self.emit(src, "wino_dy", self.args(dy) + e_at + [np.int32(v) for v in (K, OH, OW, TH, TW, t0, tc)],
                      (round_up(tc, 64), K), (64, 1), label + tag + " dy")
            table = np.array([[xi * K * tc, xi * C * tc, xi * K * C, xi * K * C] for xi in range(16)], np.int64)
            self._gemm_launch(e_at, v_at, m_at if t0 else None, m_at, table, K, C, tc, (tc, 1, 1, tc, C, 1), idx,
                              None, 1.0, 1.0, label + tag + " gemm", "winograd_dw")
        self.emit(src, "wino_dw", m_at + self.args(dw) + [np.int32(K), np.int32(C)], (round_up(K * C, 64),), (64,),
                  label + " winograd dw")

