"""The house rules, checked on the code as it is: a one-way import graph, graph/ free of kernels/, the line budget,
and every environment variable the code reads documented in the README's table."""
import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = {"dlnet": os.path.join(ROOT, "dlnet"), "dlnet.cli": os.path.join(ROOT, "cli")}
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
MAX_ENV_VARS = 15


def _modules():
    """{module name: path} of every Python file of dlnet and cli (installed as dlnet.cli)."""
    found = {}
    for package, folder in PACKAGES.items():
        for dirpath, _, files in os.walk(folder):
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(dirpath, f), folder)[:-3].replace(os.sep, ".")
                    name = package if rel == "__init__" else f"{package}.{rel.removesuffix('.__init__')}"
                    found[name] = os.path.join(dirpath, f)
    return found


MODULES = _modules()


def _imports(name, path):
    """The dlnet modules `name` imports (at module level or inside functions)."""
    tree = ast.parse(open(path).read(), path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for a in node.names:  # `from . import x` names a module where one exists
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base)
    return {m for m in out if m in MODULES and m != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _cycle():
    """One import cycle of the graph (a list of modules), or None (Tarjan's strongly connected components)."""
    index, low, stack, on, sccs = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                sccs.append(sorted(scc))
    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return sccs[0] if sccs else None


def test_the_checks_see_the_package():
    assert {"dlnet.net", "dlnet.kernels.lowering", "dlnet.graph.ir", "dlnet.cli.main"} <= set(MODULES)
    assert "dlnet.graph.ir" in GRAPH["dlnet.net"] or "dlnet.graph.memory" in GRAPH["dlnet.net"]


def test_no_import_cycles():
    assert _cycle() is None, f"import cycle among {_cycle()}"


def test_cycle_finder_finds_one():
    GRAPH["dlnet.graph.ir"] = GRAPH["dlnet.graph.ir"] | {"dlnet.net"}
    try:
        assert _cycle() is not None
    finally:
        GRAPH["dlnet.graph.ir"] = _imports("dlnet.graph.ir", MODULES["dlnet.graph.ir"])


def test_graph_imports_nothing_from_kernels():
    bad = {(m, i) for m, deps in GRAPH.items() if m.startswith("dlnet.graph") for i in deps
           if i.startswith("dlnet.kernels")}
    assert not bad, sorted(bad)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_line_budget(name):
    """No file over 600 lines and no function over 80."""
    text = open(MODULES[name]).read()
    assert text.count("\n") <= MAX_FILE_LINES, f"{MODULES[name]}: {text.count(chr(10))} lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            assert length <= MAX_FUNCTION_LINES, f"{MODULES[name]}:{node.lineno} {node.name}: {length} lines"


def _env_reads():
    names = set()
    for path in MODULES.values():
        names |= set(re.findall(r"[\"'](DLNET_[A-Z0-9_]+)[\"']", open(path).read()))
    return names


def test_environment_variables_are_documented():
    readme = open(os.path.join(ROOT, "README.md")).read()
    table = set(re.findall(r"^\|\s*`(DLNET_[A-Z0-9_]+)`", readme, re.M))
    used = _env_reads()
    assert used, "no DLNET_* name found: the scan is broken"
    assert len(used) <= MAX_ENV_VARS, sorted(used)
    assert used <= table, f"not in the README's table: {sorted(used - table)}"
    assert table <= used, f"documented but never read: {sorted(table - used)}"
