def pytest_terminal_summary(terminalreporter):
    from .test_node_cases import RESULTS
    if not RESULTS:
        return
    core = [ok for c, ok in RESULTS.values() if c]
    every = [ok for _, ok in RESULTS.values()]
    terminalreporter.write_line(f"ONNX node cases: core (opset<=13): {sum(core)}/{len(core)} pass; "
                                f"all: {sum(every)}/{len(every)} pass")
