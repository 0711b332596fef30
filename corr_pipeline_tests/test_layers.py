"""Layering: neither the package nor the benchmark scripts import the test suite, and only
``snapshot/`` calls the numerical core's entry points.

Every ``corr_pipeline/**/*.py`` and ``benchmarks/*.py`` is parsed with :mod:`ast`; an
``import corr_pipeline_tests…``, a ``from corr_pipeline_tests… import …`` or an
``importlib.import_module("corr_pipeline_tests…")`` / ``__import__("corr_pipeline_tests…")``
anywhere in the file (top level or inside a function) fails the test.

The entry points of ``compute/`` (the functions its packages export: ``pairwise_correlation``,
``top_k_neighbors``, ``hierarchical_clusters``, ``market_modes``, ``find_lead_lag_pairs``,
``correlation_changes`` …) are called by ``snapshot/`` alone, where the session's chain is
written once (``snapshot/chain.py``, over ``snapshot/steps.py``); ``defs/``, ``bench/`` and the
rest of the package go through it. A module outside ``compute/`` and ``snapshot/`` that imports
one of them from ``corr_pipeline.compute…``, or reaches one as an attribute of a module imported
from there, fails the test. The layer contracts between the package's own subpackages are
import-linter's (pyproject.toml).
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import corr_pipeline.compute
import corr_pipeline.compute.changes

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


# --------------------------------------------------------------------------------------------
# the compute entry points: called from snapshot/ only
# --------------------------------------------------------------------------------------------

COMPUTE = "corr_pipeline.compute"

#: The functions the compute packages export: the algorithms' entry points.
ENTRY_POINTS = frozenset(
    name
    for package in (corr_pipeline.compute, corr_pipeline.compute.changes)
    for name in package.__all__
    if inspect.isfunction(getattr(package, name))
)

#: The package's modules allowed to call them: the core itself and the one snapshot.
CALLERS = ("compute", "snapshot")

PACKAGE_SOURCES = [
    path
    for path in SOURCES
    if path.is_relative_to(ROOT / "corr_pipeline")
    and path.relative_to(ROOT / "corr_pipeline").parts[0] not in CALLERS
]


def _is_compute(module: str | None) -> bool:
    return module is not None and (module == COMPUTE or module.startswith(COMPUTE + "."))


def _entry_point_uses(tree: ast.AST) -> list[str]:
    """``line: code`` of every import of a compute entry point in ``tree``, and of every
    attribute access ``module.entry_point`` on a name bound by an import from
    ``corr_pipeline.compute…`` (``import corr_pipeline.compute…`` binds ``corr_pipeline``)."""
    found = []
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and _is_compute(node.module):
            for alias in node.names:
                if alias.name in ENTRY_POINTS:
                    found.append(f"{node.lineno}: {ast.unparse(node)}")
                else:
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _is_compute(alias.name):
                    modules.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ENTRY_POINTS:
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in modules:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_entry_points_are_found() -> None:
    assert {
        "pairwise_correlation",
        "top_k_neighbors",
        "hierarchical_clusters",
        "market_modes",
        "market_residuals",
        "find_lead_lag_pairs",
        "correlation_changes",
    } <= ENTRY_POINTS
    assert "Neighbors" not in ENTRY_POINTS and "LEAD_LAG_DTYPE" not in ENTRY_POINTS
    assert ROOT / "corr_pipeline" / "defs" / "assets.py" in PACKAGE_SOURCES
    assert ROOT / "corr_pipeline" / "bench" / "pipeline.py" in PACKAGE_SOURCES
    assert not any("snapshot" in path.parts for path in PACKAGE_SOURCES)
    steps = (ROOT / "corr_pipeline" / "snapshot" / "steps.py").read_text(encoding="utf-8")
    assert _entry_point_uses(ast.parse(steps))  # the snapshot's steps do call them


@pytest.mark.parametrize("path", PACKAGE_SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_snapshot_calls_the_compute_entry_points(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = _entry_point_uses(tree)
    assert not found, (
        f"{path.relative_to(ROOT)} calls the compute entry points (go through "
        "corr_pipeline.snapshot): " + "; ".join(found)
    )


@pytest.mark.parametrize(
    ("source", "flagged"),
    [
        ("from corr_pipeline.compute import pairwise_correlation", True),
        ("from corr_pipeline.compute.market_modes import market_modes as strongest", True),
        ("from corr_pipeline.compute import neighbors\nneighbors.top_k_neighbors(corr, k=3)", True),
        ("import corr_pipeline.compute.clusters as cl\ncl.hierarchical_clusters(corr)", True),
        ("import corr_pipeline.compute\ncorr_pipeline.compute.find_lead_lag_pairs(R)", True),
        ("def f():\n    from corr_pipeline.compute.changes import correlation_changes", True),
        ("from corr_pipeline.compute.neighbors import Neighbors", False),
        ("from corr_pipeline.compute.tiling import overlap_dtype", False),
        ("from corr_pipeline.snapshot import steps\nsteps.market_modes(corr, params)", False),
    ],
)
def test_the_entry_point_check_sees_every_form(source: str, flagged: bool) -> None:
    assert bool(_entry_point_uses(ast.parse(source))) == flagged, source
