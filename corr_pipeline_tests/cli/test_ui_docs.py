"""The UI as the docs and the demo describe it is the UI ``corr-pipeline ui`` serves: the menu
entries they name are those of the installed Dagster webserver's navigation, and each link to a
UI page (``http://127.0.0.1:3000/...``) is a route of that UI naming this project's code location
and asset group.

The webserver's pages are one JavaScript application, served for any path: a link's page exists
when the application's router has a route for it, which is read from its bundle.
"""

from __future__ import annotations

import re
from pathlib import Path

import dagster_webserver
import pytest
import yaml

from corr_pipeline.cli import demo
from corr_pipeline.definitions import defs
from corr_pipeline.defs.run import CODE_LOCATION_NAME
from corr_pipeline.defs.step_options import SNAPSHOT_GROUP

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BUNDLE = Path(dagster_webserver.__file__).parent / "webapp" / "build" / "_next" / "static"
#: The entries of the UI's main menu the docs and the demo name (Dagster 1.13).
MENU = ("Overview", "Runs", "Catalog", "Jobs", "Automation", "Lineage", "Deployment")
#: The menu entry of Dagster before 1.10, which the 1.13 menu no longer has.
OLD_MENU = re.compile(r"\*?Assets\*? (→|->)|-> Assets\b|→ \*?Assets\b")
UI_LINK = re.compile(r"http://127\.0\.0\.1:3000(/[^\s`)>\]]*)")


def _bundle() -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(BUNDLE.rglob("*.js")))


def _routes(bundle: str) -> list[re.Pattern[str]]:
    """The router's path patterns in ``bundle`` as regular expressions (``:name`` a segment,
    ``:name?`` an optional one)."""
    patterns = set(re.findall(r'"(/[a-z][A-Za-z0-9/:?_-]*)"', bundle))
    out = []
    for pattern in sorted(patterns):
        regex = re.sub(r"/:[A-Za-z]+\?", "(/[^/]+)?", pattern)
        regex = re.sub(r":[A-Za-z]+", "[^/]+", regex)
        out.append(re.compile(regex + "/?"))
    return out


def _documented_links() -> list[str]:
    links = []
    for path in DOCS:
        links += [m for m in UI_LINK.findall(path.read_text()) if not m.startswith("/?token")]
    return links


@pytest.fixture(scope="module")
def bundle() -> str:
    text = _bundle()
    assert text, f"no JavaScript under {BUNDLE}"
    return text


def test_the_named_menu_entries_are_the_uis(bundle: str) -> None:
    for entry in MENU:
        assert f'label:"{entry}"' in bundle, f"the UI's menu has no entry {entry!r}"
    sources = [*DOCS, Path(demo.__file__)]
    for path in sources:
        old = [line for line in path.read_text().splitlines() if OLD_MENU.search(line)]
        assert not old, f"{path.name} names the menu entry Assets, which the UI has no more: {old}"


def test_the_documented_ui_links_are_pages_of_the_project(bundle: str) -> None:
    # the code location as workspace.yaml names it, holding the group
    (entry,) = yaml.safe_load((REPO / "workspace.yaml").read_text())["load_from"]
    assert entry["python_module"]["location_name"] == CODE_LOCATION_NAME
    assert {spec.group_name for spec in defs.resolve_all_asset_specs()} == {SNAPSHOT_GROUP}
    links = _documented_links()
    group_page = f"/locations/{CODE_LOCATION_NAME}/asset-groups/{SNAPSHOT_GROUP}"
    assert group_page in links, links
    routes = _routes(bundle)
    for link in links:
        path = link.split("?", 1)[0]
        assert any(route.fullmatch(path) for route in routes), f"no page of the UI: {link}"
        location = re.match(r"/locations/([^/]+)", path)
        if location:  # the definitions' repository is __repository__: the location alone
            assert location.group(1) == CODE_LOCATION_NAME, link
        group = re.search(r"/asset-groups/([^/]+)", path)
        if group:
            assert group.group(1) == SNAPSHOT_GROUP, link
