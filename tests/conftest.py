"""Suite-wide hooks: a short account of the real-engine tests and of the scale tests' figures at
the end of every run."""

from __future__ import annotations

ENGINE_TESTS = "tests/engines/"
# A test's ``record_property(SCALE, line)`` lines are printed in the "scale" section.
SCALE = "scale"


def _scale_lines(terminalreporter) -> list[str]:
    """The ``SCALE`` lines the tests recorded (``record_property``), in test order."""
    lines = []
    for outcome in ("passed", "failed"):
        for report in terminalreporter.stats.get(outcome, []):
            if getattr(report, "when", None) != "call":
                continue
            lines += [str(value) for name, value in report.user_properties if name == SCALE]
    return lines


def pytest_terminal_summary(terminalreporter) -> None:
    """One line per engine test (Prism, Flink embedded and standalone) with its outcome, so a CI
    log shows which engines really ran and matched FnApiRunner, not only a count of passes; then
    the figures the scale tests measured (memory and grouping sizes in the number of crowds)."""
    lines = []
    for outcome in ("passed", "failed", "error", "skipped"):
        for report in terminalreporter.stats.get(outcome, []):
            nodeid = getattr(report, "nodeid", "")
            if not nodeid.startswith(ENGINE_TESTS) or (
                outcome == "passed" and report.when != "call"
            ):
                continue
            detail = f"{report.duration:.0f} s"
            if outcome == "skipped" and isinstance(report.longrepr, tuple):
                detail = report.longrepr[2].removeprefix("Skipped: ")
            lines.append(f"{outcome.upper():8} {nodeid.removeprefix(ENGINE_TESTS)} ({detail})")
    if lines:
        terminalreporter.section("real engines")
        for line in sorted(lines, key=lambda line: line.split(" ", 1)[1]):
            terminalreporter.write_line(line)
    scale = _scale_lines(terminalreporter)
    if scale:
        terminalreporter.section("scale")
        for line in scale:
            terminalreporter.write_line(line)
