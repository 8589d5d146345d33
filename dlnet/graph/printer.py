"""The IR printer: one typed line per node, the debugging tool."""


def _fmt_attr(v):
    if hasattr(v, "ir_str"):
        return v.ir_str()
    if isinstance(v, (list, tuple)):
        if v and isinstance(v[0], tuple):  # fused activation (op, attrs)
            return str(v)
        return ",".join(_fmt_attr(x) for x in v)
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _ref(v):
    if v is None:
        return "_"
    return f"${v.id}" if v.const is not None else f"%{v.id}"


def format_node(node, plan=None):
    outs = ", ".join(f"%{v.id}: {v.type_str()}" for v in node.outputs)
    args = ", ".join(_ref(v) for v in node.inputs)
    attrs = dict(node.attrs)
    op = node.op
    if op == "Fused":
        op = "Fused[" + "+".join(n.op for n in attrs.pop("nodes")) + "]"
    if "prologue" in attrs:
        attrs["prologue"] = "+".join(n.op for n in attrs["prologue"])
    if "act" in attrs:
        act = attrs.pop("act")
        attrs["fused"] = "+".join((["bias"] if len(node.inputs) > 2 else []) +
                                  (["residual"] if len(node.inputs) > 3 else []) + ([act[0].lower()] if act else []))
    elif node.op == "Conv" and len(node.inputs) > 2:
        attrs["fused"] = "+".join(["bias"] + (["residual"] if len(node.inputs) > 3 else []))
    text = ", ".join(f"{k}={_fmt_attr(v)}" for k, v in attrs.items() if k not in ("in_shape",))
    line = f"{outs} = {op}({args})" + (f" {{{text}}}" if text else "")
    if plan is not None and node.outputs:
        v = node.outputs[0]
        rid, eoff = plan.alias_of.get(v.id, (v.id, 0))
        if rid in plan.act_offsets:
            off = plan.act_offsets[rid] + eoff * v.nbytes // max(v.size, 1)
            line += f"   # @ {off / 2**20:.2f} MiB" + (" (view)" if rid != v.id else "")
    if node.name:
        line += f"   # {node.name}" if plan is None else f" {node.name}"
    return line


def format_graph(graph, plan=None):
    ins = ", ".join(f"%{v.id}: {v.type_str()} \"{v.name}\"" for v in graph.inputs)
    lines = [f"graph {graph.name}({ins}) {{"]
    lines += [f"  # {note}" for note in graph.notes]
    consts = {}
    for n in graph.nodes:
        for v in n.inputs:
            if v is not None and v.const is not None:
                consts[v.id] = v
    if consts:
        total = sum(v.nbytes for v in consts.values())
        lines.append(f"  # {len(consts)} constants ${{...}}, {total / 2**20:.2f} MiB")
    for n in graph.nodes:
        lines.append("  " + format_node(n, plan))
    outs = ", ".join(f"{_ref(v)} \"{name}\"" for v, name in zip(graph.outputs, graph.output_names))
    lines.append(f"  return {outs}")
    lines.append("}")
    return "\n".join(lines)
