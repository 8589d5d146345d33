"""Caps on what an untrusted model may ask for, each checked before anything is allocated, with its reason.

Sizes are computed with Python ints (no wrap-around) from the dims the model declares. The loader
(dlnet/onnx/validate.py) checks the model file and its tensors, graph.ir.Builder every value a node makes, the
constant folders (Builder, graph/passes/fold.py) what they compute on the host, and kernels/runtime.py the device
memory a plan needs.
"""
import math

# protobuf cannot parse one message of 2 GiB or more: a larger file is not an ONNX model (weights that large live in
# external data files, each tensor of which is capped by MAX_ELEMENTS)
MAX_MODEL_BYTES = 2**31 - 1
# nodes in the model, its subgraphs' included. The models dlnet runs have hundreds to a few thousand (light_resnet50:
# 415); a chain of 100k pointwise nodes loads in 14 s on one CPU core, so 200k bounds a load to under a minute
MAX_NODES = 200_000
# subgraphs inside subgraphs (If/Loop/Scan bodies): exporters nest two or three; the importer recurses per level
MAX_DEPTH = 16
# elements of one tensor: hand-written kernels index elements with 32-bit ints (`int c = get_global_id(0)`), and
# 2**31 - 1 elements are 8-16 GiB, more than one buffer may hold on most devices (CL_DEVICE_MAX_MEM_ALLOC_SIZE)
MAX_ELEMENTS = 2**31 - 1
# elements a node may fold to on the host at load: the largest real folds are weight transposes and casts (an LLM's
# embedding, 32000 x 4096 = 131M); a larger result is computed on the device, where planned memory is checked
MAX_FOLD_ELEMENTS = 2**28


def elements(shape):
    """The element count of `shape`, exact (Python ints)."""
    return math.prod(int(d) for d in shape)


def over_cap(shape, cap=MAX_ELEMENTS):
    """What is wrong with a tensor of `shape`, as a phrase ("has a negative dim", "has N elements, over dlnet's cap
    of M"), or None. Zero dims are left out of the count: strides and index arithmetic still reach that far."""
    dims = [int(d) for d in shape]
    if any(d < 0 for d in dims):
        return "has a negative dim"
    n = math.prod(max(d, 1) for d in dims)
    if n > cap:
        return f"has {n} elements{' (its zero dims left out)' if 0 in dims else ''}, over dlnet's cap of {cap}"
    return None
