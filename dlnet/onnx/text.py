"""Text ops: StringNormalizer, StringConcat, StringSplit, RegexFullMatch (host ops on strings) and TfIdfVectorizer
(n-gram counts composed of device ops)."""
import numpy as np

from ..errors import ModelError
from .common import handler, reshape


@handler("StringNormalizer", 10)
def _string_normalizer(imp, node, xs, at):
    keep = ("case_change_action", "is_case_sensitive", "stopwords", "locale")
    return [imp.b.op("StringNormalizer", [xs[0]], {k: v for k, v in at.items() if k in keep})]


@handler("StringConcat", 20)
def _string_concat(imp, node, xs, at):
    return [imp.b.op("StringConcat", list(xs))]


@handler("StringSplit", 20)
def _string_split(imp, node, xs, at):
    keep = {k: v for k, v in at.items() if k in ("delimiter", "maxsplit")}
    return imp.b.op("StringSplit", [xs[0]], keep, n_out=2)


@handler("RegexFullMatch", 20)
def _regex_full_match(imp, node, xs, at):
    return [imp.b.op("RegexFullMatch", [xs[0]], {"pattern": at.get("pattern", "")})]


def _grams(at):
    """[(n, grams int64/str [P_n, n], pool ids [P_n])] for the n-gram sizes counted (min..max_gram_length); a gram
    listed twice keeps its last id, as the ONNX reference's pool does."""
    pool = at.get("pool_int64s") or at.get("pool_strings")
    if not pool:
        raise ModelError("TfIdfVectorizer needs pool_int64s or pool_strings")
    pool = np.asarray(pool, np.int64 if "pool_int64s" in at else object)
    starts = list(at["ngram_counts"]) + [len(pool)]
    last, out, first_id = {}, [], 0
    for i in range(len(starts) - 1):
        n = i + 1
        grams = pool[starts[i]:starts[i + 1]].reshape(-1, n)
        for k, g in enumerate(grams):
            last[(n, tuple(g))] = first_id + k
        first_id += len(grams)
    for i in range(len(starts) - 1):
        n = i + 1
        if not at["min_gram_length"] <= n <= at["max_gram_length"]:
            continue
        found = [(g, j) for (m, g), j in last.items() if m == n]
        if found:
            out.append((n, np.asarray([g for g, _ in found], pool.dtype), np.asarray([j for _, j in found])))
    return out


@handler("TfIdfVectorizer", 9)
def _tfidf_vectorizer(imp, node, xs, at):
    """y[r, ngram_indexes[j]] = f_j, the count of pool n-gram j in row r, its items skip + 1 apart for every skip in
    0..max_skip_count (1-grams counted once); TF: f, IDF: weight if f > 0, TFIDF: f * weight (weights default 1,
    indexed by output position as in the ONNX reference)."""
    b, x = imp.b, xs[0]
    if x.rank not in (1, 2):
        raise ModelError(f"TfIdfVectorizer takes [C] or [N, C], got {list(x.shape)}")
    rows = reshape(b, x, (1, x.size)) if x.rank == 1 else x
    if rows.dtype in ("int32", "int64") and "pool_int64s" not in at:
        raise ModelError("TfIdfVectorizer on integers needs pool_int64s")
    if rows.dtype not in ("int64", "object"):
        rows = b.op("Cast", [rows], {"to": "int64"})
    n_rows, length = rows.shape
    indexes = np.asarray(at["ngram_indexes"], np.int64)
    size = int(indexes.max()) + 1
    counts, ids = [], []
    for n, grams, gram_ids in _grams(at):
        skips = range(1, at.get("max_skip_count", 0) + 2) if n > 1 else [1]
        windows = [np.arange(s, s + (n - 1) * d + 1, d) for d in skips for s in range(length - (n - 1) * d)]
        if not windows:
            continue
        win = b.op("Gather", [rows, b.const(np.asarray(windows, np.int64))], {"axis": 1})
        hit = b.op("Equal", [reshape(b, win, (n_rows, len(windows), 1, n)), b.const(grams[None, None])])
        whole = b.op("Reduce", [b.op("Cast", [hit], {"to": "float32"})], {"mode": "min", "axes": (3,), "keepdims": 0})
        counts.append(b.op("Reduce", [whole], {"mode": "sum", "axes": (1,), "keepdims": 0}))
        ids.append(gram_ids)
    if counts:
        f = counts[0] if len(counts) == 1 else b.op("Concat", counts, {"axis": 1})
        ids = np.concatenate(ids)
        to_out = np.zeros((ids.size, size), np.float32)
        to_out[np.arange(ids.size), indexes[ids]] = 1
        y = b.op("Gemm", [f, b.const(to_out)], {})
    else:
        y = b.const(np.zeros((n_rows, size), np.float32))
    weights = at.get("weights")
    w = b.const(np.asarray(weights, np.float32)) if weights else None
    mode = at["mode"]
    if mode == "IDF":
        y = b.op("Cast", [b.op("Greater", [y, b.const(np.float32(0))])], {"to": "float32"})
        y = b.op("Mul", [y, w]) if w is not None else y
    elif mode == "TFIDF" and w is not None:
        y = b.op("Mul", [y, w])
    elif mode not in ("TF", "TFIDF"):
        raise ModelError(f"TfIdfVectorizer's mode is {mode!r}; expected TF, IDF or TFIDF")
    return [reshape(b, y, (size,)) if x.rank == 1 else y]
