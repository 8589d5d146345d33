"""The fuzz target, in a process of its own (tests/onnx/test_fuzz.py starts it): reads models from stdin (8-byte
little-endian length, then the bytes), loads and runs each, and answers one JSON line per model: what was raised.
A crash kills this process only; the test sees it and names the model.

On a CPU device its address space is capped at what it holds after start-up plus 3 GiB, so a model that plans
gigabytes meets the cap (a DeviceError, which the test accepts) rather than the machine's memory."""
import json
import resource
import struct
import sys
import traceback

import numpy as np

import dlnet
from tests.conftest import context

MAX_FEED = 1 << 20  # elements: larger inputs are loaded, not run


def _feeds(net, rng):
    feeds = {}
    for info in net.inputs:
        shape = tuple(net.bound.get(d, 2) if isinstance(d, str) else d for d in info.shape)
        if np.prod(shape, dtype=np.float64) > MAX_FEED:
            return None
        if info.dtype == "object":
            feeds[info.name] = np.array(rng.choice(["a", "bb", ""], size=shape), dtype=object)
        elif info.dtype == "bool":
            feeds[info.name] = rng.random(shape) < 0.5
        elif np.dtype(info.dtype).kind in "iu":
            feeds[info.name] = rng.integers(0, 3, size=shape).astype(info.dtype)
        else:
            feeds[info.name] = rng.standard_normal(shape).astype(info.dtype)
    return feeds


def check(ctx, data, rng):
    """{"ok": bool, "what": the exception's type or "ran", "msg": ...}: ok unless something not a DlnetError escaped
    load_onnx or run."""
    net = None
    try:
        net = dlnet.Net(ctx).load_onnx(data)
        feeds = _feeds(net, rng)
        if feeds is not None:
            net.run(feeds)
        return {"ok": True, "what": "ran" if feeds is not None else "loaded"}
    except dlnet.DlnetError as e:
        return {"ok": True, "what": type(e).__name__, "msg": str(e)[:200]}
    except Exception as e:
        return {"ok": False, "what": type(e).__name__, "msg": str(e)[:300], "tb": traceback.format_exc()[-4000:]}
    finally:
        if net is not None:
            net.release()


def main():
    ctx = context()
    ctx.queue  # (the device opened before the cap)
    if ctx.is_cpu:  # (a GPU driver maps more address space as it goes: no cap there)
        vm = int(next(line for line in open("/proc/self/status") if line.startswith("VmSize")).split()[1]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + (3 << 30), resource.RLIM_INFINITY))
    rng = np.random.default_rng(0)
    stdin = sys.stdin.buffer
    print(json.dumps({"ready": True}), flush=True)
    while True:
        head = stdin.read(8)
        if len(head) < 8:
            return
        data = stdin.read(struct.unpack("<Q", head)[0])
        print(json.dumps(check(ctx, data, rng)), flush=True)


if __name__ == "__main__":
    main()
