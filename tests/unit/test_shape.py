"""The code keeps the shape issue 30 gave it, so the next feature does not grow a god class.

Read from the syntax tree of every module under ``sn_monitor/`` (and radon's cyclomatic
complexity, the measure ``radon cc`` prints):

- no class over :data:`CLASS_LINES` lines, no function over :data:`FUNCTION_LINES` lines,
  no function or method of cyclomatic complexity over :data:`COMPLEXITY`; a thing long or
  branchy by design says why in its docstring, on a line starting with ``Long by design:``
  (the fake NVML mirrors pynvml's API, one method per NVML call);
- ``sn_monitor/controller/`` holds at most :data:`CONTROLLER_TOP_MODULES` modules at its
  top: its parts live in folders that name them;
- every container contract in ``.importlinter`` is ``exhaustive``: a new module must be
  placed in a layer, so the tree and the contract say the same;
- the tests share their helpers through ``tests/support/``: no test module imports
  another, and ``free_port`` is defined once.
"""

from __future__ import annotations

import ast
import configparser
import re
from collections.abc import Iterator
from pathlib import Path

from radon.complexity import cc_visit

from tests.conftest import ROOT

PACKAGE = ROOT / "sn_monitor"
CLASS_LINES = 400
FUNCTION_LINES = 80
COMPLEXITY = 20
CONTROLLER_TOP_MODULES = 6
EXEMPT = "Long by design:"


def _modules() -> Iterator[tuple[Path, str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        yield path.relative_to(ROOT), text, ast.parse(text, str(path))


def _exempt(node: ast.AST, enclosing: list[ast.AST]) -> bool:
    """Whether ``node`` or a class around it says in its docstring why it is long."""
    for each in [node, *enclosing]:
        if isinstance(each, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(each) or ""
            if any(line.strip().startswith(EXEMPT) for line in doc.splitlines()):
                return True
    return False


def _definitions(tree: ast.Module) -> Iterator[tuple[ast.AST, list[ast.AST]]]:
    """Every class and function, with the classes and functions around it."""
    def walk(node: ast.AST, enclosing: list[ast.AST]) -> Iterator[tuple[ast.AST, list[ast.AST]]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                yield child, enclosing
                yield from walk(child, [child, *enclosing])
            else:
                yield from walk(child, enclosing)
    yield from walk(tree, [])


def _length(node: ast.AST) -> int:
    assert isinstance(node, ast.stmt)
    assert node.end_lineno is not None
    return node.end_lineno - node.lineno + 1


def test_no_class_or_function_is_over_its_bound() -> None:
    over: list[str] = []
    for path, _, tree in _modules():
        for node, enclosing in _definitions(tree):
            bound = CLASS_LINES if isinstance(node, ast.ClassDef) else FUNCTION_LINES
            name = getattr(node, "name", "?")
            if _length(node) > bound and not _exempt(node, enclosing):
                over.append(f"{path}:{getattr(node, 'lineno', 0)} {name}: "
                            f"{_length(node)} lines (bound {bound})")
    assert not over, "split these by responsibility (or say why not):\n" + "\n".join(over)


def test_no_function_is_over_the_complexity_bound() -> None:
    over: list[str] = []
    for path, text, tree in _modules():
        exempt_lines = {getattr(node, "lineno", 0) for node, enclosing in _definitions(tree)
                        if _exempt(node, enclosing)}
        for block in cc_visit(text):
            if block.complexity > COMPLEXITY and block.lineno not in exempt_lines:
                over.append(f"{path}:{block.lineno} {block.fullname}: CC {block.complexity}")
    assert not over, "name the decisions in smaller steps (or say why not):\n" + "\n".join(over)


def test_the_controller_keeps_its_parts_in_folders() -> None:
    top = sorted(p.name for p in (PACKAGE / "controller").glob("*.py"))
    assert len(top) <= CONTROLLER_TOP_MODULES, f"modules at the controller's top: {top}"


def test_every_layered_container_is_exhaustive() -> None:
    contracts = configparser.ConfigParser()
    contracts.read(ROOT / ".importlinter", encoding="utf-8")
    containered = [name for name in contracts.sections()
                   if contracts[name].get("containers", "").strip()]
    assert containered, "no container contract read from .importlinter"
    loose = [name for name in containered
             if contracts[name].get("exhaustive", "false").strip().lower() != "true"]
    assert not loose, f"container contracts without exhaustive = true: {loose}"


def _test_modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted((ROOT / "tests").rglob("*.py")):
        yield path.relative_to(ROOT), ast.parse(path.read_text(encoding="utf-8"), str(path))


def _imported(tree: ast.Module) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def test_no_test_module_imports_another() -> None:
    test_module = re.compile(r"(^|\.)test_\w+$")
    found = [f"{path} imports {name}" for path, tree in _test_modules()
             for name in _imported(tree) if name.startswith("tests.") and test_module.search(name)]
    assert not found, "move shared helpers into tests/support/:\n" + "\n".join(found)


def test_free_port_is_defined_once() -> None:
    defined = [str(path) for path, tree in _test_modules() for node in ast.walk(tree)
               if isinstance(node, ast.FunctionDef) and node.name == "free_port"]
    assert defined == ["tests/support/ports.py"], defined
