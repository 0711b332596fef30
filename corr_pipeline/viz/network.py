"""The lead-lag network picture of a snapshot (SPEC §6) as PNG bytes.

``lead_lag_network_png(pairs, symbols)``
    The ``top`` lead-lag pairs (SPEC §6) by improvement as a directed bipartite graph: leaders
    on the left, laggers on the right, an arrow leader → lagger labelled with the lag in days and
    the lagged correlation, red for a positive lagged correlation, blue for a negative one,
    thicker for a larger improvement; labels placed along their arrows, measured so that none
    overlaps another or is crossed by another arrow (a pair with no room on its arrow is listed
    on the right). A *two-way* pair (SPEC §6 "Direction": its reverse pair, lagger → leader,
    also has a q-value at most ``max_q_value``, the snapshot's parameter;
    :mod:`corr_pipeline.snapshot.direction`) is drawn with a head at both ends and its label
    starts with ``⇄``; a legend under the network says so. At most 7 inches high, so that the
    UI's picture dialog shows it whole. O(top²).

Drawn with :mod:`corr_pipeline.viz.figures`.
"""

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from corr_pipeline.snapshot import direction
from corr_pipeline.viz.figures import (
    DEFAULT_MAX_PNG_BYTES,
    figure_png,
    new_figure,
    quiet_drawing,
    set_title,
)
from corr_pipeline.viz.reductions import (
    finite_or,
    normalize_pairs,
)

__all__ = [
    "EDGE_LABEL_GID",
    "LEGEND_GID",
    "NODE_LABEL_GID",
    "lead_lag_network_figure",
    "lead_lag_network_png",
]


#: ``gid`` of the texts that label an edge of the lead-lag network (on its arrow, or a line of
#: the side list), and of its symbol names: what the layout keeps apart (and the tests measure).
EDGE_LABEL_GID = "lead-lag-edge-label"
NODE_LABEL_GID = "lead-lag-node-label"
#: ``gid`` of the legend under the network (one-way and two-way arrows).
LEGEND_GID = "lead-lag-legend"

_NETWORK_WIDTH_IN = 6.4
_LIST_WIDTH_IN = 3.0
_TITLE_IN = 0.8
_NETWORK_MAX_HEIGHT_IN = 7.0
"""The network's height at most (700 pixels at 100 dpi): it fits the UI's picture dialog."""
_LEGEND_IN = 0.3
"""The strip under the network that holds the legend."""
_LABEL_PAD_PX = 2.0
_X_LEADER, _X_LAGGER = 0.22, 0.78
_ONE_WAY_ARROW, _TWO_WAY_ARROW = "-|>", "<|-|>"
_LEGEND_COLOR = "#555555"


def _edge_label(row: dict[str, Any]) -> str:
    """``<lag>d <lagged corr>``, after ``⇄`` for a two-way pair (``row["two_way"]``)."""
    label = f"{row['lag']}d" if row.get("lag") is not None else ""
    if row.get("lagged_corr") is not None:
        label += f" {_fmt_float(row['lagged_corr'], '+.2f')}"
    if row.get("two_way"):
        label = f"{direction.TWO_WAY_MARK} {label}"
    return label.strip()


def _with_direction(rows: list[dict[str, Any]], max_q_value: float) -> list[dict[str, Any]]:
    """``rows`` with ``two_way`` set: whether the reverse pair has a best lag with a q-value
    at most ``max_q_value`` (:func:`corr_pipeline.snapshot.direction.is_two_way`; a row
    without the reverse fields is one-way)."""
    for r in rows:
        r["two_way"] = bool(
            direction.is_two_way(r.get("reverse_lag"), r.get("reverse_q_value"), max_q_value)
        )
    return rows


def _apart(box: Any, others: list[Any], pad: float) -> bool:
    """True when ``box`` (display pixels) is at least ``pad`` pixels from every box of
    ``others`` on one axis."""
    return all(
        box.x1 + pad <= o.x0 or o.x1 + pad <= box.x0 or box.y1 + pad <= o.y0 or o.y1 + pad <= box.y0
        for o in others
    )


def _crosses_other_arrow(corners: np.ndarray, own: int, lines: list[tuple[float, float]]) -> bool:
    """True when an arrow other than ``lines[own]`` passes through the box whose data-space
    corners are ``corners`` (``[[x0, y0], [x1, y1]]``); arrows are the straight segments from
    ``(_X_LEADER, y0)`` to ``(_X_LAGGER, y1)``."""
    (bx0, by0), (bx1, by1) = corners
    lo, hi = max(bx0, _X_LEADER), min(bx1, _X_LAGGER)
    if lo > hi:
        return False
    for k, (y0, y1) in enumerate(lines):
        if k == own:
            continue
        ya = y0 + (lo - _X_LEADER) / (_X_LAGGER - _X_LEADER) * (y1 - y0)
        yb = y0 + (hi - _X_LEADER) / (_X_LAGGER - _X_LEADER) * (y1 - y0)
        if min(ya, yb) <= by1 and max(ya, yb) >= by0:
            return True
    return False


def _label_candidates(preferred: float) -> list[float]:
    """Positions along an arrow (0 = leader end, 1 = lagger end), nearest ``preferred`` first."""
    grid = [0.12 + 0.04 * i for i in range(20)]  # 0.12 .. 0.88
    return sorted(grid, key=lambda t: (abs(t - preferred), t))


def lead_lag_network_figure(
    pairs: Any,
    symbols: Sequence[str] | None = None,
    *,
    top: int = 30,
    title: str | None = None,
    max_q_value: float = 1.0,
) -> Any:
    """The matplotlib figure of :func:`lead_lag_network_png` (Agg canvas, fixed layout: render
    it with ``tight_layout`` off, as that function does).

    Edge labels never overlap one another nor a symbol name, and no other arrow crosses them.
    Each label is placed along its arrow, strongest pair first: at the first of the positions
    ``0.12, 0.16, ..., 0.88`` of the arrow (nearest its preferred one first: near the leader
    when the leader has one arrow, near the lagger when the lagger has one, else the middle)
    where its text, measured by the renderer, stays :data:`_LABEL_PAD_PX` pixels clear of every
    label already placed and of every symbol name and no other arrow passes within that distance
    of it. A pair
    whose label fits nowhere on its arrow is listed instead in a column to
    the right (``leader → lagger  <lag>d <lagged corr>``), one line each, spaced by more than the
    text's height, and the whole layout is drawn again with that column reserved (the arrows'
    room changes, so every label is placed anew). Sizes scale with the resolution together, so
    the PNG's lower-resolution retries keep the labels apart.
    """
    rows = _with_direction(normalize_pairs(pairs, symbols, top=top), max_q_value)
    height = min(2.0 + _LEGEND_IN + 0.17 * max(len(rows), 4), _NETWORK_MAX_HEIGHT_IN)
    if not rows:
        fig, ax = new_figure(_NETWORK_WIDTH_IN, height)
        ax.axis("off")
        ax.text(0.5, 0.5, "no lead-lag pairs", ha="center", va="center", parse_math=False)
        set_title(ax, title or "Lead-lag pairs", "")
        return fig
    with quiet_drawing():
        fig, unplaced = _draw_network(rows, height, title, max_q_value, with_list=False)
        if unplaced:  # the arrows keep their size in inches: the same labels are placed again
            fig.clear()
            fig, unplaced = _draw_network(rows, height, title, max_q_value, with_list=True)
    return fig


def _draw_network(
    rows: list[dict[str, Any]],
    height: float,
    title: str | None,
    max_q_value: float,
    *,
    with_list: bool,
) -> tuple[Any, list[int]]:
    """Draw the network of ``rows`` (two-way ones double-headed) with the legend of
    :func:`_legend` under it; ``with_list``: widen the figure by a right-hand column and
    list there the pairs whose label fits on no position of its arrow. Returns the figure and
    the indices of the pairs not labelled on their arrow."""
    width = _NETWORK_WIDTH_IN + (_LIST_WIDTH_IN if with_list else 0.0)
    fig, ax = new_figure(width, height)
    top_frac = 1.0 - _TITLE_IN / height
    bottom_frac = (0.1 + _LEGEND_IN) / height
    ax.set_position((0.01, bottom_frac, (_NETWORK_WIDTH_IN - 0.13) / width, top_frac - bottom_frac))
    ax.axis("off")
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.01, 1.04)

    leaders, laggers, rows_of = _columns(rows)

    def y_of(index: int, count: int) -> float:
        """Rows of one column spread evenly over the full height."""
        return 1.0 - (index + 0.5) / count

    n_rows = max(len(leaders), len(laggers))
    y_leader = {name: y_of(i, len(leaders)) for i, name in enumerate(leaders)}
    y_lagger = {name: y_of(i, len(laggers)) for i, name in enumerate(laggers)}
    out_degree = {name: sum(1 for r in rows if r["leader"] == name) for name in leaders}
    in_degree = {name: len(rows_of[name]) for name in laggers}
    improvements = np.array([finite_or(r.get("improvement"), 0.0) for r in rows])
    low, span = float(improvements.min()), float(improvements.max() - improvements.min())
    fontsize = 8 if n_rows <= 30 else 6
    colors = []
    for r, imp in zip(rows, improvements, strict=True):
        y0, y1 = y_leader[r["leader"]], y_lagger[r["lagger"]]
        color = "#c44e52" if finite_or(r.get("lagged_corr"), 0.0) >= 0 else "#4c72b0"
        colors.append(color)
        ax.annotate(
            "",
            xy=(_X_LAGGER, y1),
            xytext=(_X_LEADER, y0),
            arrowprops={
                "arrowstyle": _TWO_WAY_ARROW if r["two_way"] else _ONE_WAY_ARROW,
                "color": color,
                "lw": 0.8 + (2.4 * (imp - low) / span if span > 0 else 1.2),
                "shrinkA": 2,
                "shrinkB": 2,
                "mutation_scale": 10,
            },
        )
    names = [
        ax.text(_X_LEADER - 0.02, y, _shorten(n, 18), fontsize=fontsize, ha="right", va="center")
        for n, y in y_leader.items()
    ] + [
        ax.text(_X_LAGGER + 0.02, y, _shorten(n, 18), fontsize=fontsize, ha="left", va="center")
        for n, y in y_lagger.items()
    ]
    names.append(ax.text(0.2, 1.0, "leader", fontsize=8, ha="right", va="bottom", weight="bold"))
    names.append(ax.text(0.8, 1.0, "lagger", fontsize=8, ha="left", va="bottom", weight="bold"))
    for text in names:
        text.set_parse_math(False)
        text.set_gid(NODE_LABEL_GID)
    sub = "arrows: lag in days and lagged corr (red +, blue -), width ~ improvement"
    if with_list:
        sub += "\npairs listed on the right: no room for their label on the arrow"
    set_title(ax, title or f"Strongest {len(rows)} lead-lag pairs by improvement", sub)

    taken = [t.get_window_extent(fig.canvas.get_renderer()) for t in names]
    ends = [(y_leader[r["leader"]], y_lagger[r["lagger"]]) for r in rows]
    preferred = [
        0.2 if out_degree[r["leader"]] == 1 else (0.8 if in_degree[r["lagger"]] == 1 else 0.5)
        for r in rows
    ]
    unplaced = _place_labels(fig, ax, rows, ends, preferred, colors, taken, fontsize - 1)
    if with_list and unplaced:
        _list_pairs(fig, rows, unplaced, colors, bottom_frac, top_frac, width)
    _legend(fig, max_q_value, height)
    return fig, unplaced


def _legend(fig: Any, max_q_value: float, fig_height: float) -> None:
    """The legend in the strip under the network (:data:`_LEGEND_IN` high, of a figure
    ``fig_height`` inches high): a one-headed arrow is a one-way pair, a double-headed one
    (label ``⇄ ...``) a two-way pair, whose reverse pair (lagger → leader) has a q-value at most
    ``max_q_value``."""
    from matplotlib.legend_handler import HandlerPatch
    from matplotlib.patches import FancyArrowPatch

    def arrow(
        legend: Any,
        orig_handle: Any,
        xdescent: float,
        ydescent: float,
        width: float,
        height: float,
        fontsize: float,
    ) -> Any:
        y = height / 2 - ydescent
        return FancyArrowPatch(
            (-xdescent, y),
            (width - xdescent, y),
            arrowstyle=orig_handle.get_arrowstyle(),
            mutation_scale=fontsize,
            color=_LEGEND_COLOR,
            lw=1.2,
        )

    handles = [
        FancyArrowPatch((0, 0), (1, 0), arrowstyle=style)
        for style in (_ONE_WAY_ARROW, _TWO_WAY_ARROW)
    ]
    labels = [
        "one-way: the reverse pair (lagger → leader) is not significant",
        f"{direction.TWO_WAY_MARK} two-way: the reverse pair has q ≤ {max_q_value:g} too",
    ]
    legend = fig.legend(
        handles,
        labels,
        handler_map={FancyArrowPatch: HandlerPatch(patch_func=arrow)},
        loc="lower left",
        bbox_to_anchor=(0.01, 0.04 / fig_height),
        ncol=1,
        fontsize=6.5,
        frameon=False,
        handlelength=3.5,
        borderaxespad=0.0,
        labelspacing=0.3,
    )
    legend.set_gid(LEGEND_GID)
    for text in legend.get_texts():
        text.set_parse_math(False)


def _columns(rows: list[dict[str, Any]]) -> tuple[list[str], list[str], dict[str, list[int]]]:
    """The leaders in order of first appearance; the laggers ordered by the mean row of their
    leaders (then first appearance), so that arrows cross little; each lagger's leader rows."""
    leaders: list[str] = []
    for r in rows:
        if r["leader"] not in leaders:
            leaders.append(r["leader"])
    leader_row = {name: i for i, name in enumerate(leaders)}
    first_seen: dict[str, int] = {}
    rows_of: dict[str, list[int]] = {}
    for k, r in enumerate(rows):
        first_seen.setdefault(r["lagger"], k)
        rows_of.setdefault(r["lagger"], []).append(leader_row[r["leader"]])
    laggers = sorted(rows_of, key=lambda name: (np.mean(rows_of[name]), first_seen[name]))
    return leaders, laggers, rows_of


def _place_labels(
    fig: Any,
    ax: Any,
    rows: list[dict[str, Any]],
    ends: list[tuple[float, float]],
    preferred: list[float],
    colors: list[str],
    taken: list[Any],
    fontsize: float,
) -> list[int]:
    """Label each pair's arrow (``ends``: its leader's and lagger's heights) at the first
    position from ``preferred`` clear of the labels ``taken`` where no other arrow crosses the
    label (so it reads as its own arrow's); returns the pairs with no such position."""
    renderer = fig.canvas.get_renderer()
    unplaced: list[int] = []
    for k, r in enumerate(rows):
        y0, y1 = ends[k]
        label = ax.text(
            0,
            0,
            _edge_label(r),
            fontsize=fontsize,
            ha="center",
            va="center",
            color=colors[k],
            parse_math=False,
            gid=EDGE_LABEL_GID,
            bbox={"boxstyle": "square,pad=0.05", "facecolor": "white", "edgecolor": "none"},
        )
        spot = None
        for t in _label_candidates(preferred[k]):
            label.set_position((_X_LEADER + t * (_X_LAGGER - _X_LEADER), y0 + t * (y1 - y0)))
            box = label.get_window_extent(renderer)
            if _apart(box, taken, _LABEL_PAD_PX) and not _crosses_other_arrow(
                ax.transData.inverted().transform(box.padded(_LABEL_PAD_PX)), k, ends
            ):
                spot = (t, box)
                break
        if spot is None:
            label.remove()
            unplaced.append(k)
        else:
            t, box = spot
            label.set_position((_X_LEADER + t * (_X_LAGGER - _X_LEADER), y0 + t * (y1 - y0)))
            taken.append(box)
    return unplaced


def _list_pairs(
    fig: Any,
    rows: list[dict[str, Any]],
    which: list[int],
    colors: list[str],
    bottom_frac: float,
    top_frac: float,
    width: float,
) -> None:
    """The pairs ``which`` as lines ``leader → lagger  <lag>d <corr>`` in the right-hand column,
    spaced 1.4 times the font size (more than a line of text is high), the font shrunk until
    they all fit, in two sub-columns (names shortened to 10 characters) when one would need a font below 4.5
    points."""
    axes = fig.add_axes(
        (
            _NETWORK_WIDTH_IN / width,
            bottom_frac,
            (_LIST_WIDTH_IN - 0.1) / width,
            top_frac - bottom_frac,
        )
    )
    axes.axis("off")
    axes.set_xlim(0, 1)
    axes.set_ylim(0, 1)
    height_pt = (top_frac - bottom_frac) * fig.get_figheight() * 72.0
    columns = 1 if height_pt / (1.4 * (len(which) + 1)) >= 4.5 else 2
    limit = 12 if columns == 1 else 10
    per_column = -(-len(which) // columns)
    size = min(7.0, height_pt / (1.4 * (per_column + 1)))
    step = 1.4 * size / height_pt
    head = axes.text(0, 1, "pairs labelled here", fontsize=size, weight="bold", va="top")
    head.set_gid(NODE_LABEL_GID)
    for i, k in enumerate(which):
        r = rows[k]
        axes.text(
            (i // per_column) / columns,
            1 - (i % per_column + 1) * step,
            f"{_shorten(r['leader'], limit)} → {_shorten(r['lagger'], limit)}  {_edge_label(r)}",
            fontsize=size,
            va="top",
            color=colors[k],
            parse_math=False,
            gid=EDGE_LABEL_GID,
        )


def lead_lag_network_png(
    pairs: Any,
    symbols: Sequence[str] | None = None,
    *,
    top: int = 30,
    title: str | None = None,
    max_bytes: int = DEFAULT_MAX_PNG_BYTES,
    max_q_value: float = 1.0,
) -> bytes:
    """PNG of the ``top`` lead-lag pairs by improvement as a directed bipartite graph
    (:func:`lead_lag_network_figure`).

    Leaders form the left column (strongest pair first), laggers the right column (ordered by
    the mean row of their leaders, which keeps arrows short and mostly horizontal); a symbol
    that both leads and lags appears in both columns. Each arrow goes leader → lagger and is
    labelled ``<lag>d <lagged corr>``: red for a positive lagged correlation, blue for a
    negative one, thicker for a larger improvement. A two-way pair (its reverse pair has a
    q-value at most ``max_q_value``, the snapshot's parameter) has a head at both ends and its
    label starts with ``⇄``; the legend under the network says which is which. No two labels
    overlap: a label with no room on its arrow goes to a list on the right. Symbol names are
    drawn verbatim (no mathtext), shortened to 18 characters.
    """
    fig = lead_lag_network_figure(pairs, symbols, top=top, title=title, max_q_value=max_q_value)
    return figure_png(fig, max_bytes=max_bytes, tight=False)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _fmt_float(value: Any, spec: str) -> str:
    if value is None:
        return "NaN"
    value = float(value)
    return "NaN" if math.isnan(value) else format(value, spec)
