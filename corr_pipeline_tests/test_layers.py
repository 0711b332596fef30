"""Layering: neither the package nor the benchmark scripts import the test suite.

Every ``corr_pipeline/**/*.py`` and ``benchmarks/*.py`` is parsed with :mod:`ast`; an
``import corr_pipeline_tests…``, a ``from corr_pipeline_tests… import …`` or an
``importlib.import_module("corr_pipeline_tests…")`` / ``__import__("corr_pipeline_tests…")``
anywhere in the file (top level or inside a function) fails the test. The layer contracts between
the package's own subpackages are import-linter's (pyproject.toml).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = "corr_pipeline_tests"
SOURCES = sorted(ROOT.glob("corr_pipeline/**/*.py")) + sorted(ROOT.glob("benchmarks/*.py"))


def _is_tests(module: str | None) -> bool:
    return module is not None and (module == TESTS or module.startswith(TESTS + "."))


def _test_suite_imports(tree: ast.AST) -> list[str]:
    """``line: statement`` of every import of the test suite in ``tree``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module] if node.level == 0 else []
        elif (
            isinstance(node, ast.Call)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (
                    isinstance(node.func, ast.Name)
                    and node.func.id in ("import_module", "__import__")
                )
            )
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        else:
            continue
        if any(_is_tests(name) for name in names):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_sources_are_found() -> None:
    assert (ROOT / "corr_pipeline" / "__init__.py") in SOURCES
    assert any(path.parent.name == "benchmarks" for path in SOURCES)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_does_not_import_the_tests(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = _test_suite_imports(tree)
    assert not found, f"{path.relative_to(ROOT)} imports {TESTS}: " + "; ".join(found)


def test_the_check_sees_every_form() -> None:
    source = (
        "import corr_pipeline_tests\n"
        "import os, corr_pipeline_tests.compute.reference as ref\n"
        "def f():\n"
        "    from corr_pipeline_tests.compute import universes\n"
        "    importlib.import_module('corr_pipeline_tests.db')\n"
        "    __import__('corr_pipeline_tests')\n"
        "from corr_pipeline.compute import pairwise_correlation\n"
        "import corr_pipeline_testsuite\n"
        "from . import corr_pipeline_tests\n"
    )
    assert [line.split(":")[0] for line in _test_suite_imports(ast.parse(source))] == [
        "1", "2", "4", "5", "6",
    ]  # fmt: skip
