"""The ONNX backend node cases of the installed onnx package, run through dlnet (shared by the test and a CLI).

Scope: every case whose nodes are all in the default domain, at any op-set ("all"); "core" is the part whose
model op-set is <= 13. `python tests/onnx/node_cases.py` runs them all and prints one line per failure.
"""
import os
import sys
import time
import warnings

import numpy as np

XFAIL_FILE = os.path.join(os.path.dirname(__file__), "node_xfail.txt")


def _schema_exists(op_type, domain):
    import onnx
    try:
        onnx.defs.get_schema(op_type, onnx.defs.onnx_opset_version(), domain)
        return True
    except Exception:
        return False


def model_opset(model):
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return 0


def in_scope(model):
    return all(n.domain in ("", "ai.onnx") and _schema_exists(n.op_type, n.domain) for n in model.graph.node)


def collect():
    """[(name, case, core)] sorted by name."""
    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = collect_testcases()
    out = [(c.name, c, model_opset(c.model) <= 13) for c in cases if in_scope(c.model)]
    return sorted(out, key=lambda t: t[0])


def read_xfail(path=XFAIL_FILE):
    """{case name: reason} from lines `name: reason` (# comments)."""
    table = {}
    if not os.path.exists(path):
        return table
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip() if line.lstrip().startswith("#") else line.strip()
            if not line:
                continue
            name, _, reason = line.partition(":")
            table[name.strip()] = reason.strip()
    return table


def release(ctx):
    """Free every OpenCL object before the interpreter exits (PoCL can crash freeing them during teardown)."""
    import gc
    ctx.finish()
    ctx._programs.clear()
    gc.collect()


def run_case(ctx, case):
    """None when dlnet matches every data set of the case, else a one-line reason."""
    for inputs, expected in case.data_sets:
        why = _run_data_set(ctx, case.model, inputs, expected, case.rtol, case.atol)
        if why is not None:
            return why
    return None


def _numpy_held(proto):
    """Whether a TensorProto's dtype is a plain numpy one (float8, bfloat16, int4... come back as ml_dtypes)."""
    import onnx
    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(proto.data_type)
        return dtype.isbuiltin == 1 and dtype.kind in "biufc"
    except (KeyError, ValueError):
        return False


def _run_data_set(ctx, model, inputs, expected, rtol, atol):
    import onnx

    import dlnet
    inits = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    if len(inputs) != len(names):
        return f"case feeds {len(inputs)} inputs, model has {len(names)}"
    feeds = {}
    for n, a in zip(names, inputs):
        if isinstance(a, np.generic):
            a = np.asarray(a)
        if isinstance(a, onnx.TensorProto):  # newer cases store every Cast tensor as a proto, plain dtypes too
            if not _numpy_held(a):
                return f"input {n} is {onnx.TensorProto.DataType.Name(a.data_type)}, which numpy and dlnet do not hold"
            a = onnx.numpy_helper.to_array(a)
        if not isinstance(a, np.ndarray):
            return f"input {n} is a {type(a).__name__} (sequence/optional), not a tensor"
        feeds[n] = a
    try:
        net = dlnet.Net(ctx).load_onnx(model)
    except dlnet.DlnetError as e:
        return "load: " + str(e).replace("\n", " ")[:300]
    try:
        try:
            got = list(net.run(feeds).values())
        except dlnet.DlnetError as e:
            return "run: " + str(e).replace("\n", " ")[:300]
        for k, (y, ref) in enumerate(zip(got, expected)):
            if isinstance(ref, np.generic):
                ref = np.asarray(ref)
            if isinstance(ref, onnx.TensorProto):
                if not _numpy_held(ref):
                    return (f"output {k} is {onnx.TensorProto.DataType.Name(ref.data_type)}, which numpy and dlnet "
                            "do not hold")
                ref = onnx.numpy_helper.to_array(ref)
            if not isinstance(ref, np.ndarray):
                return f"output {k} is a {type(ref).__name__}, not a tensor"
            if y.dtype != ref.dtype:
                return f"output {k}: dtype {y.dtype}, expected {ref.dtype}"
            if y.shape != ref.shape:
                return f"output {k}: shape {list(y.shape)}, expected {list(ref.shape)}"
            if ref.dtype.kind in "fc":
                if not np.allclose(y, ref, rtol=rtol, atol=atol, equal_nan=True):
                    err = np.max(np.abs(y.astype(np.float64) - ref))
                    return f"output {k}: max abs error {err:.3g} (rtol={rtol}, atol={atol})"
            elif not np.array_equal(y, ref):
                return f"output {k}: values differ"
        return None
    finally:
        net.release()


def main():
    import dlnet
    ctx = dlnet.Context()
    xfail = read_xfail()
    only = sys.argv[1:]
    t0 = time.time()
    counts = {"core": [0, 0], "all": [0, 0]}
    lines = []
    for name, case, core in collect():
        if only and not any(s in name for s in only):
            continue
        t = time.time()
        if os.environ.get("NODE_TRACE"):
            print(name, file=sys.stderr, flush=True)
        try:
            why = run_case(ctx, case)
        except Exception as e:  # a bug in dlnet, not a user error: still one line
            why = f"crash: {type(e).__name__}: {str(e)[:200]}"
        dt = time.time() - t
        for g in (["core", "all"] if core else ["all"]):
            counts[g][0] += why is None
            counts[g][1] += 1
        if why is not None:
            lines.append(f"{name}: {why}")
        if dt > 2:
            print(f"slow {name} {dt:.1f}s", file=sys.stderr)
    for line in lines:
        print(line)
    release(ctx)
    print(f"core (opset<=13): {counts['core'][0]}/{counts['core'][1]} pass; all: {counts['all'][0]}/"
          f"{counts['all'][1]} pass; {time.time() - t0:.0f} s; xfail listed: {len(xfail)}", file=sys.stderr)


if __name__ == "__main__":
    main()
