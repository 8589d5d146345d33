"""The ONNX backend node cases (onnx 1.23.2, generated locally) against dlnet, compared with each case's rtol/atol.

Every case in scope passes or is listed, with its reason, in node_xfail.txt (strict: a listed case that starts to
pass fails the run, so the list stays true). The terminal summary prints the pass counts of both groups.
"""
import pytest

import dlnet

from . import node_cases

CASES = node_cases.collect()
XFAIL = node_cases.read_xfail()
RESULTS = {}  # name -> (core, passed); read by the terminal-summary hook in conftest.py


@pytest.fixture(scope="module")
def ctx():
    return dlnet.Context()


def test_xfail_list_names_real_cases():
    names = {name for name, _, _ in CASES}
    stale = sorted(set(XFAIL) - names)
    assert not stale, f"node_xfail.txt lists cases that are not in scope: {stale[:5]}"
    assert all(XFAIL.values()), "every node_xfail.txt line needs a reason"


# the cases of op-set 14 and later are slow (opt-in, CI runs them once): about 250 s of a 2-core default run's 770,
# most of it their kernels' first builds; the op-set <= 13 core stays in every run
@pytest.mark.parametrize("name,case,core", [c if c[2] else pytest.param(*c, marks=pytest.mark.slow) for c in CASES],
                         ids=[c[0] for c in CASES])
def test_node_case(ctx, name, case, core):
    why = node_cases.run_case(ctx, case)
    RESULTS[name] = (core, why is None)
    if name in XFAIL:
        if why is None:
            pytest.fail(f"{name} passes now: remove it from node_xfail.txt ({XFAIL[name]})")
        pytest.xfail(XFAIL[name])
    assert why is None, why
