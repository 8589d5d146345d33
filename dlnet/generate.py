"""Decoding with a KV cache on the device: dlnet.generate(net, prompt_ids, max_new_tokens, ...).

A decoder graph is recognised by the exporters' names: `input_ids`, `attention_mask` and `position_ids` where
present, past key/value inputs (`past_key_values.N.key`, `past_key.N`, `past.N`) paired with present outputs
(`present.N.key`, `present_key.N`, `present.N`) by what follows the prefix, and `logits` (else the first other
output). Every step runs with `Net.run(keep={present: past})`, so the cache never crosses the host.

Two kinds of cache:
- static: the past inputs have a fixed length Tmax (the model writes each step's keys and values in place at a
  position input, `cache_position` or `position`, and masks the keys after it). Every step has the same shapes, so
  every step runs the same plan, its launch list bound once. Where the model writes the cache elementwise (Where
  with a one-hot) each present key is computed in its past one's place, so no step copies the cache; otherwise
  (ScatterND from index_copy) it is copied once a step, device to device.
- growing: the past inputs' length is symbolic and the present is the past with the new keys concatenated (the
  standard exports). Each length is a new shape, so each step plans anew (through Net's plan cache: compiled
  programs are reused, the launches are bound again); the cache still stays on the device.
"""
import re

import numpy as np

from .errors import InputError, ModelError

PAST_PREFIXES = ("past_key_values", "past_key_value", "past")
PRESENT_PREFIXES = ("present_key_values", "present")
WRITE_POSITION_NAMES = ("cache_position", "position", "positions")  # a static cache's write index
KV_WORDS = {"k": "key", "v": "value", "keys": "key", "values": "value"}


def generate(net, prompt_ids, max_new_tokens, *, greedy=True, top_k=None, top_p=None, temperature=1.0, seed=None,
             eos_id=None, cache=None):
    """Decode `max_new_tokens` tokens after `prompt_ids` (ints, [batch, length] or [length]) with a decoder Net.
    Returns the prompt with the new tokens appended, int64 of the prompt's rank; it ends early where every row
    has produced `eos_id` (a finished row is padded with it).

    greedy: the most likely token (the first of ties). greedy=False samples from softmax(logits / temperature),
    within the `top_k` most likely tokens and the smallest set whose probability reaches `top_p`, with
    numpy's generator seeded by `seed` (the same seed gives the same tokens).
    cache: {present output: past input} where the names do not follow the exporters' (see the module docstring)."""
    sample = _check_sampling(net, greedy, top_k, top_p, temperature)
    ids = np.asarray(prompt_ids)
    if ids.dtype.kind not in "iu" or ids.ndim not in (1, 2) or ids.shape[-1] < 1 or ids.size == 0:
        raise InputError(f"{net.path}: generate: prompt_ids must be integers of shape [batch, length >= 1] or "
                         f"[length], got {ids.dtype}{list(ids.shape)}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 0:
        raise InputError(f"{net.path}: generate: max_new_tokens={max_new_tokens!r}: expected an integer >= 0")
    rows = ids.reshape(1, -1) if ids.ndim == 1 else ids
    dec = Decoder(net, cache)
    dec.check_length(rows.shape[1] + max_new_tokens)
    rng = np.random.default_rng(seed)
    tokens = rows.astype(np.int64)
    done = np.zeros(len(rows), bool)
    try:
        logits = dec.prefill(tokens)
        for step in range(max_new_tokens):
            new = np.argmax(logits, axis=-1) if sample is None else sample(logits, rng)
            if eos_id is not None:
                new = np.where(done, eos_id, new)
                done |= new == eos_id
            tokens = np.concatenate([tokens, new[:, None].astype(np.int64)], axis=1)
            if step + 1 == max_new_tokens or done.all():
                break
            logits = dec.step(tokens[:, -1:], tokens.shape[1] - 1)
    finally:
        net.drop_kept(list(dec.keep.values()))
    return tokens if ids.ndim == 2 else tokens[0]


class Decoder:
    """How a Net's inputs and outputs play in decoding, found by name; feeds for each step."""

    def __init__(self, net, cache=None):
        if net.model is None:
            raise ModelError("generate() before load_onnx()")
        self.net, self.path = net, net.path
        ins = {i.name: i for i in net.inputs}
        outs = {o.name: o for o in net.outputs}
        self.keep = _check_cache(net, cache) if cache is not None else _pair_by_name(net)
        self.past = [ins[n] for n in self.keep.values()]
        others = [n for n in ins if n not in self.keep.values()]
        self.ids = _find(others, ("input_ids",)) or next((n for n in others if ins[n].dtype in ("int64", "int32")
                                                          and len(ins[n].shape) == 2), None)
        if self.ids is None:
            raise ModelError(f"{self.path}: generate: no input_ids input among {others}")
        self.mask = _find(others, ("attention_mask",))
        self.position_ids = _find(others, ("position_ids",))
        self.write_at = _find(others, WRITE_POSITION_NAMES)
        known = {self.ids, self.mask, self.position_ids, self.write_at}
        unknown = [n for n in others if n not in known]
        if unknown:
            raise ModelError(f"{self.path}: generate: input {unknown[0]!r} is neither input_ids, attention_mask, "
                             f"position_ids, a write position ({', '.join(WRITE_POSITION_NAMES)}) nor a past key or "
                             "value; pass cache={present output: past input} where the names differ")
        rest = [n for n in outs if n not in self.keep]
        self.logits = "logits" if "logits" in rest else (rest[0] if rest else None)
        if self.logits is None:
            raise ModelError(f"{self.path}: generate: no logits output besides the present keys and values")
        flat = [p.name for p in self.past if len(p.shape) < 2]
        if flat:
            raise ModelError(f"{self.path}: generate: past input {flat[0]!r} has rank < 2; expected [..., length, "
                             "head size]")
        lengths = {p.shape[-2] for p in self.past}
        self.static = all(isinstance(t, int) for t in lengths)
        if self.static and (len(lengths) != 1 or (self.write_at or self.position_ids) is None):
            raise ModelError(f"{self.path}: generate: past inputs of fixed length {sorted(lengths)} need one length "
                             f"and a position input ({', '.join(WRITE_POSITION_NAMES)} or position_ids) that says "
                             "where each step writes")
        self.tmax = lengths.pop() if self.static else None
        seq = ins[self.ids].shape[-1]
        self.chunk = seq if isinstance(seq, int) else None  # input_ids of a fixed length: fed that many at a time
        if self.chunk not in (None, 1):
            raise ModelError(f"{self.path}: generate: input_ids has a fixed length {seq}; expected 1 or symbolic")

    def check_length(self, total):
        if self.static and total > self.tmax:
            raise InputError(f"{self.path}: generate: prompt and new tokens make {total} positions; the model's "
                             f"static cache holds {self.tmax}")

    def prefill(self, tokens):
        """The prompt's run(s) from an empty cache; the last position's logits."""
        empty = {p.name: np.zeros(self._past_shape(p, len(tokens)), p.dtype) for p in self.past}
        if self.chunk is None:
            return self._run(tokens, 0, empty)
        logits = self._run(tokens[:, :1], 0, empty)
        for t in range(1, tokens.shape[1]):
            logits = self.step(tokens[:, t:t + 1], t)
        return logits

    def step(self, new, start):
        """Tokens `new` [batch, n] at positions start..start+n-1, the cache read where the last run kept it."""
        return self._run(new, start, {})

    def _run(self, new, start, feeds):
        b, n = new.shape
        info = {i.name: i for i in self.net.inputs}
        feeds[self.ids] = new.astype(info[self.ids].dtype)
        end = start + n
        if self.mask is not None:
            width = self.tmax if self.static else end
            feeds[self.mask] = np.broadcast_to(np.arange(width) < end, (b, width)).astype(info[self.mask].dtype)
        positions = np.arange(start, end)
        if self.position_ids is not None:
            shaped = positions if len(info[self.position_ids].shape) == 1 else np.broadcast_to(positions, (b, n))
            feeds[self.position_ids] = np.ascontiguousarray(shaped).astype(info[self.position_ids].dtype)
        if self.write_at is not None:
            shaped = positions if len(info[self.write_at].shape) == 1 else np.int64(start)
            feeds[self.write_at] = np.asarray(shaped).astype(info[self.write_at].dtype)
        out = self.net.run(feeds, outputs=[self.logits], keep=self.keep)[self.logits]
        if out.ndim != 3 or out.shape[:2] != (b, n):
            raise ModelError(f"{self.path}: generate: output {self.logits!r} has shape {list(out.shape)}; expected "
                             f"[batch {b}, tokens {n}, vocabulary]")
        return out[:, -1, :]

    def _past_shape(self, info, batch):
        dims = list(info.shape)
        for axis, d in enumerate(dims):
            if isinstance(d, str):
                dims[axis] = 0 if axis == len(dims) - 2 else batch  # the growing length starts empty
        return dims


def _words(name, prefixes):
    """What follows the past/present prefix, as a sorted tuple of words ('0', 'key'), or None."""
    for prefix in prefixes:
        if name.startswith(prefix):
            words = [KV_WORDS.get(w, w) for w in re.split(r"[._/]+", name[len(prefix):]) if w]
            return tuple(sorted(words)) if any(w.isdigit() for w in words) else None
    return None


def _pair_by_name(net):
    past = {}
    for i in net.inputs:
        key = _words(i.name, PAST_PREFIXES)
        if key is not None:
            past[key] = i.name
    keep = {}
    for o in net.outputs:
        key = _words(o.name, PRESENT_PREFIXES)
        if key is not None and key in past:
            keep[o.name] = past.pop(key)
    if not keep or past:
        left = sorted(past.values()) if past else [i.name for i in net.inputs]
        raise ModelError(f"{net.path}: generate: no present output pairs with input(s) {left} by the exporters' "
                         "names (past_key_values.N.key / present.N.key, past_key.N / present_key.N); pass "
                         "cache={present output: past input}")
    return keep


def _check_cache(net, cache):
    if not isinstance(cache, dict) or not cache:
        raise InputError(f"{net.path}: generate: cache must be a non-empty dict {{present output: past input}}, got "
                         f"{cache!r}")
    ins, outs = {i.name for i in net.inputs}, {o.name for o in net.outputs}
    for present, past in cache.items():
        if present not in outs or past not in ins:
            raise InputError(f"{net.path}: generate: cache pairs output {present!r} with input {past!r}; the model's "
                             f"outputs are {sorted(outs)}, its inputs {sorted(ins)}")
    return dict(cache)


def _find(names, wanted):
    return next((n for n in names if n in wanted), None)


def _check_sampling(net, greedy, top_k, top_p, temperature):
    """None for greedy decoding, else a function (logits [batch, vocab], rng) -> tokens [batch]."""
    if greedy:
        if top_k is not None or top_p is not None or temperature != 1.0:
            raise InputError(f"{net.path}: generate: top_k, top_p and temperature sample; pass greedy=False with them")
        return None
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1):
        raise InputError(f"{net.path}: generate: top_k={top_k!r}: expected an integer >= 1")
    if top_p is not None and not 0.0 < float(top_p) <= 1.0:
        raise InputError(f"{net.path}: generate: top_p={top_p!r}: expected 0 < top_p <= 1")
    if not float(temperature) > 0.0:
        raise InputError(f"{net.path}: generate: temperature={temperature!r}: expected > 0")
    return lambda logits, rng: sample_tokens(logits, rng, top_k, top_p, float(temperature))


def sample_tokens(logits, rng, top_k=None, top_p=None, temperature=1.0):
    """One token per row of `logits` [batch, vocab], drawn from softmax(logits / temperature) restricted to the
    top_k most likely and to the smallest most-likely set whose probability reaches top_p."""
    z = np.asarray(logits, np.float64) / temperature
    if top_k is not None and top_k < z.shape[-1]:
        kth = np.sort(z, axis=-1)[:, -top_k][:, None]
        z = np.where(z < kth, -np.inf, z)
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    if top_p is not None and top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")
        ranked = np.take_along_axis(p, order, axis=-1)
        drop = np.cumsum(ranked, axis=-1) - ranked >= top_p  # the tokens after the set reaches top_p
        np.put_along_axis(p, order, np.where(drop, 0.0, ranked), axis=-1)
        p /= p.sum(axis=-1, keepdims=True)
    u = rng.random(len(p))[:, None]
    return np.minimum((np.cumsum(p, axis=-1) < u).sum(axis=-1), p.shape[-1] - 1)
