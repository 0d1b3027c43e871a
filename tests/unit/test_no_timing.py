"""The tests keep off the clock: no assertion bounds an elapsed time, and no fixed sleep
stands in for the event a test waits on.

A loaded machine stretches every interval, so a bound on elapsed time fails for the
machine, not the code (speed is measured in ``make bench``), and a sleep followed by
"nothing happened" passes while the thing that could have happened is still on its
way. Tests wait, bounded, for a positive signal: ``tests.drivers.servers.wait_until``,
``Cluster.wait_for``, ``Cluster.wait_settled``, ``Cluster.wait_sweeps``.

Read from the syntax tree of every module under tests/unit, tests/integration and
tests/support (the helpers they share):

- an ``assert`` whose expression subtracts from a reading of the ``time`` module's
  clocks (``time.monotonic() - started < 5``), or compares a name such as ``elapsed`` or
  ``took``: a bound on elapsed time. A deadline check in a polling loop
  (``assert time.monotonic() < deadline``) is not one.
- a ``time.sleep`` outside a ``while`` loop (a polling loop's interval is inside one):
  a fixed sleep. The duration of a fault a test injects (a process paused, a controller
  down) says so on its line with a comment holding ``fault's duration``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import ROOT

TREES = [ROOT / "tests" / "unit", ROOT / "tests" / "integration", ROOT / "tests" / "support"]
CLOCKS = frozenset({"monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns", "time",
                    "time_ns", "process_time", "thread_time"})
ELAPSED_NAMES = frozenset({"elapsed", "took", "latency", "duration", "spent"})
FAULT_DURATION = "fault's duration"


def _modules() -> Iterator[tuple[Path, ast.Module, list[str]]]:
    for tree in TREES:
        for path in sorted(tree.rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            yield path, ast.parse(text, str(path)), text.splitlines()


def _time_call(node: ast.AST, names: frozenset[str]) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr in names and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "time")


def _bounds_elapsed_time(test: ast.expr) -> bool:
    for node in ast.walk(test):
        if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub)
                and _time_call(node.left, CLOCKS)):
            return True
        if isinstance(node, ast.Compare) and any(
                isinstance(side, ast.Name) and side.id in ELAPSED_NAMES
                for side in (node.left, *node.comparators)):
            return True
    return False


def _fixed_sleeps(module: ast.Module) -> Iterator[ast.Call]:
    """``time.sleep`` calls with no ``while`` loop around them in their function."""
    def visit(node: ast.AST, in_while: bool) -> Iterator[ast.Call]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield from visit(child, False)
            elif isinstance(child, ast.While):
                yield from visit(child, True)
            else:
                if (not in_while and isinstance(child, ast.Call)
                        and _time_call(child, frozenset({"sleep"}))):
                    yield child
                yield from visit(child, in_while)
    yield from visit(module, False)


def test_no_assertion_bounds_elapsed_time() -> None:
    found = [f"{path.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}"
             for path, module, lines in _modules()
             for node in ast.walk(module)
             if isinstance(node, ast.Assert) and _bounds_elapsed_time(node.test)]
    assert found == [], "elapsed-time bounds (measure speed in make bench):\n" + "\n".join(found)


def test_no_fixed_sleep_outside_a_polling_loop() -> None:
    found = [f"{path.relative_to(ROOT)}:{call.lineno}: {lines[call.lineno - 1].strip()}"
             for path, module, lines in _modules()
             for call in _fixed_sleeps(module)
             if FAULT_DURATION not in lines[call.lineno - 1]]
    assert found == [], "fixed sleeps (wait for a positive signal instead):\n" + "\n".join(found)


def test_the_checks_see_what_they_are_for() -> None:
    """Each check finds the shape it is for, and passes over a polling loop's deadline."""
    bound = ast.parse("started = time.monotonic()\nassert time.monotonic() - started < 5\n"
                      "assert took < 2.0\n")
    asserts = [n for n in ast.walk(bound) if isinstance(n, ast.Assert)]
    assert [_bounds_elapsed_time(a.test) for a in asserts] == [True, True]
    deadline = ast.parse("while not done():\n    assert time.monotonic() < deadline\n"
                         "    time.sleep(0.1)\n")
    assert not any(_bounds_elapsed_time(n.test) for n in ast.walk(deadline)
                   if isinstance(n, ast.Assert))
    assert list(_fixed_sleeps(deadline)) == []
    fixed = ast.parse("def test():\n    fault()\n    time.sleep(3)\n    assert nothing()\n"
                      "    for _ in range(5):\n        time.sleep(0.3)\n")
    assert [call.lineno for call in _fixed_sleeps(fixed)] == [3, 6]
