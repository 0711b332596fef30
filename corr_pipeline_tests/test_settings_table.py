"""The settings are one table (:data:`corr_pipeline.settings.VARIABLES`) read by one function:
every variable parses, checks its range naming itself, and falls back to its default; and the
README's and the user guide's environment tables list exactly those variables with those
defaults, so the docs cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from corr_pipeline import settings

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md", ROOT / "docs" / "user_guide.md")


def _environment_rows(path: Path) -> dict[str, str]:
    """``{variable: default cell}`` of the rows of ``path``'s tables whose first cell names
    variables in backticks (``CORR_PIPELINE_*``, ``DAGSTER_HOME``); backticks dropped."""
    rows: dict[str, str] = {}
    for line in path.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("| `") or len(cells) != 3:
            continue
        names = re.findall(r"`((?:CORR_PIPELINE_|DAGSTER_HOME)\w*)`", cells[0])
        if not names or re.sub(r"`\w+`|,|\s", "", cells[0]):
            continue  # not a row of variables (a command, a parameter)
        for name in names:
            assert name not in rows, f"{path.name}: {name} listed twice"
            rows[name] = cells[2].replace("`", "")
    return rows


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_the_docs_tables_list_every_variable_with_its_default(path: Path) -> None:
    rows = _environment_rows(path)
    assert set(rows) == set(settings.BY_NAME), (
        f"{path.name}: missing {sorted(set(settings.BY_NAME) - set(rows))}, "
        f"unknown {sorted(set(rows) - set(settings.BY_NAME))}"
    )
    for variable in settings.VARIABLES:
        shown = settings.shown_default(variable)
        pattern = r"(?<![\w.])" + re.escape(shown) + r"(?![\w.])"
        assert re.search(pattern, rows[variable.name]), (path.name, variable.name, shown)


def test_every_variable_reads_its_default_when_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in settings.VARIABLES:
        monkeypatch.setenv(variable.name, "  ")  # blank is unset
        expected = variable.default
        if variable.kind == "date":
            expected = settings.dt.date.fromisoformat(variable.default)
        assert settings.read(variable.name) == expected, variable.name


CHECKED = [v for v in settings.VARIABLES if v.kind in ("int", "float", "date")]


@pytest.mark.parametrize("variable", CHECKED, ids=lambda v: v.name)
def test_a_number_out_of_range_is_refused_naming_the_variable(
    variable: settings.Variable, monkeypatch: pytest.MonkeyPatch
) -> None:
    bad = ["not-a-number"]
    if variable.low is not None:
        bad.append(str(variable.low if variable.low_open else variable.low - 1))
    if variable.high is not None:
        bad.append(str(variable.high + 1))
    for raw in bad:
        monkeypatch.setenv(variable.name, raw)
        with pytest.raises(ValueError, match=re.escape(f"{variable.name}={raw!r}")):
            settings.read(variable.name)
    if variable.kind != "date":
        good = variable.high if variable.high is not None else variable.low
        monkeypatch.setenv(variable.name, str(int(good) if variable.kind == "int" else good))
        assert settings.read(variable.name) == good
