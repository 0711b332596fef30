"""The text for humans of each answer: a heading line and fixed-width tables.

:func:`to_text` turns an :data:`~corr_pipeline.query.answers.Answer` into the text printed by
``corr-pipeline query ...``. Tables are laid out by ``rich`` (:class:`rich.table.Table` without
borders: columns two spaces apart, widths in terminal cells, East Asian wide and full-width
characters counting two, combining characters none), rendered to plain text (no colours, no
markup or emoji codes read from the data). Kept here: :func:`printable`, since rich would print a
symbol's newline or tab as such (breaking a row over lines) where we want it shown escaped, and
the stripping of the trailing spaces rich pads each row with. NaN prints as ``NaN``; a p- or
q-value as ``0.0123`` or ``3.2e-07``, and ``-`` where a pair has none. A lead-lag pair's
reverse direction shows ``-`` where the reverse pair has no best lag and ``?`` where the
snapshot did not record it (its direction ``unknown``).
"""

from __future__ import annotations

import datetime as dt
import io
import math
from collections.abc import Sequence
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from corr_pipeline.query.answers import (
    Answer,
    ChangesResult,
    ClusterResult,
    CorrResult,
    LeadLagResult,
    PeersResult,
    QualityResult,
    Snapshot,
    SnapshotsResult,
    SymbolChangesResult,
)
from corr_pipeline.snapshot import direction, display, session_gap

__all__ = ["display_width", "format_table", "printable", "to_text"]


def display_width(text: str) -> int:
    """Terminal columns of ``text`` (rich's cell length: East Asian wide/full-width characters
    count 2, combining characters 0)."""
    return cell_len(text)


def printable(text: str) -> str:
    """Control characters (newline, tab, ...) shown escaped so a table stays one line per row."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode() for ch in text)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str) -> str:
    """Fixed-width table: ``align`` has one ``l``/``r`` per column; two spaces between columns.

    Cells are ``str()``-ed and shown verbatim (control characters escaped); widths count
    wide characters as two columns.
    """
    table = Table(box=None, pad_edge=False, padding=(0, 1), header_style="", show_edge=False)
    for header, side in zip(headers, align, strict=True):
        table.add_column(Text(header), justify="right" if side == "r" else "left", no_wrap=True)
    widths = [display_width(h) for h in headers]
    for row in rows:
        cells = [Text(printable(str(c))) for c in row]
        widths = [max(w, c.cell_len) for w, c in zip(widths, cells, strict=True)]
        table.add_row(*cells)
    out = io.StringIO()
    console = Console(
        file=out,
        width=sum(widths) + 2 * len(widths) + 1,  # the natural width: rich never wraps a cell
        color_system=None,
        force_terminal=False,
        force_jupyter=False,
        highlight=False,
        markup=False,
        emoji=False,
        legacy_windows=False,
    )
    console.print(table)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())


def _fmt(value: Any, spec: str = "+.4f") -> str:
    if value is None:
        return "NaN"
    value = float(value)
    return "NaN" if math.isnan(value) else format(value, spec)


def _describe(snapshot: Snapshot) -> str:
    return (
        f"snapshot {snapshot.snapshot_date} (as of {snapshot.as_of_trade_date}, "
        f"{snapshot.n_symbols:,} symbols, {snapshot.lookback_days}-day window)"
    )


def to_text(result: Answer) -> str:
    """The text of ``result`` for a terminal (no trailing newline)."""
    if isinstance(result, SnapshotsResult):
        return _render_snapshots(result)
    if isinstance(result, PeersResult):
        return _render_peers(result)
    if isinstance(result, ClusterResult):
        return _render_cluster(result)
    if isinstance(result, LeadLagResult):
        return _render_lead_lag(result)
    if isinstance(result, CorrResult):
        return _render_corr(result)
    if isinstance(result, ChangesResult):
        return _render_changes(result)
    if isinstance(result, SymbolChangesResult):
        return _render_symbol_changes(result)
    if isinstance(result, QualityResult):
        return _render_quality(result)
    raise TypeError(f"not a query answer: {type(result).__name__}")


def _render_snapshots(result: SnapshotsResult) -> str:
    if not result.snapshots:
        return "no snapshot has been published yet"
    head = f"{result.total:,} snapshot(s) published" + (
        f", newest {len(result.snapshots)} shown" if result.total > len(result.snapshots) else ""
    )
    table = format_table(
        ["snapshot_date", "as_of_trade_date", "symbols", "dropped", "lookback", "created_at"],
        [
            [
                s.snapshot_date,
                s.as_of_trade_date,
                f"{s.n_symbols:,}",
                f"{s.n_dropped:,}",
                s.lookback_days,
                s.created_at.strftime("%Y-%m-%d %H:%M") if s.created_at else "",
            ]
            for s in result.snapshots
        ],
        "llrrrl",
    )
    return head + "\n" + table


def _render_peers(result: PeersResult) -> str:
    head = f"peers of {printable(result.symbol)} in {_describe(result.snapshot)}"
    if not result.peers:
        return head + "\n(no neighbor with a defined correlation)"
    rows = [
        [
            p["rank"],
            p["neighbor"],
            _fmt(p["corr"]),
            p["overlap"],
            "-"
            if result.cluster_id is None
            else ("yes" if p["neighbor_cluster_id"] == result.cluster_id else "no"),
        ]
        for p in result.peers
    ]
    return (
        head
        + "\n"
        + format_table(["rank", "neighbor", "corr", "overlap", "same cluster"], rows, "rlrrl")
    )


def _render_cluster(result: ClusterResult) -> str:
    lines = [
        f"cluster of {printable(result.symbol)} in {_describe(result.snapshot)}",
        f"cluster id {result.cluster_id} of {result.n_clusters:,}: {result.size:,} member(s)",
    ]
    if result.peers_in_cluster:
        lines.append("its nearest peers in the same cluster:")
        lines.append(
            format_table(
                ["rank", "neighbor", "corr"],
                [[p["rank"], p["neighbor"], _fmt(p["corr"])] for p in result.peers_in_cluster],
                "rlr",
            )
        )
    shown = len(result.members)
    label = "members" if shown == result.size else f"members (first {shown:,}, by symbol)"
    lines.append(f"{label}:")
    lines.extend(f"  {printable(m)}" for m in result.members)
    return "\n".join(lines)


def _render_lead_lag(result: LeadLagResult) -> str:
    within = "" if result.max_q is None else f" with q_value <= {result.max_q:g}"
    if result.one_way:
        within += f"{' and' if within else ' with'} a one-way direction"
    two_way = f", {result.n_two_way} two-way" if result.n_two_way else ""
    head = (
        f"lead-lag pairs of {printable(result.symbol)} in {_describe(result.snapshot)}: "
        f"leads {result.n_leads}, lags {result.n_lags}{within}{two_way}"
    )
    if result.n_without_q:
        head += f"\n({result.n_without_q} pair(s) without a q-value left out)"
    if result.n_unknown_direction:
        head += (
            f"\n({result.n_unknown_direction} pair(s) of unknown direction left out: the snapshot "
            "was published before the reverse direction was recorded)"
        )
    if not result.pairs:
        return head + f"\n(no lead-lag pair{within} involves this symbol)"
    rows = [
        [
            result.role(p),
            p["leader"],
            p["lagger"],
            p["lag"],
            _fmt(p["lagged_corr"]),
            _fmt(p["sync_corr"]),
            _fmt(p["improvement"], ".4f"),
            p["overlap"],
            display.probability_text(p["p_value"]),
            display.probability_text(p["q_value"]),
            *_reverse_cells(result, p),
        ]
        for p in result.pairs
    ]
    return (
        head
        + "\n"
        + format_table(
            [
                "role",
                "leader",
                "lagger",
                "lag",
                "lagged_corr",
                "sync_corr",
                "improvement",
                "overlap",
                "p_value",
                "q_value",
                "rev_lag",
                "rev_corr",
                "rev_q",
                "direction",
            ],
            rows,
            "lllrrrrrrrrrrl",
        )
        + "\n(leader's return on day t vs lagger's on day t + lag)"
        + "\n(p_value: the best lag's, Šidák over the lags; q_value: Benjamini–Hochberg over all "
        "ordered pairs)"
        + _reverse_legend(result)
        + (
            f"\nshowing the {len(result.pairs)} strongest of {result.n_leads + result.n_lags} "
            "pairs; --limit 0 lists all"
            if result.truncated
            else ""
        )
    )


def _reverse_legend(result: LeadLagResult) -> str:
    """The footnote of the reverse columns: what they are and when a pair is two-way, or that
    the snapshot did not record them."""
    if not result.direction_recorded:
        return (
            "\n(rev_lag, rev_corr, rev_q: the reverse pair's, lagger before leader; unknown (?): "
            "the snapshot was published before the reverse direction was recorded)"
        )
    source = "--max-q" if result.max_q is not None else "the snapshot's max_q_value"
    return (
        "\n(rev_lag, rev_corr, rev_q: the reverse pair's, lagger before leader; "
        f"{direction.TWO_WAY_MARK} two-way: rev_q <= {result.two_way_max_q:g}, {source}; "
        "-: it has no best lag)"
    )


def _reverse_cells(result: LeadLagResult, pair: dict[str, Any]) -> list[str]:
    """The reverse pair's lag, lagged correlation and q-value and the pair's direction
    (``⇄ two-way``, ``one-way``; ``-`` for a reverse pair without a best lag; ``?`` and
    ``unknown`` where the snapshot did not record the direction)."""
    two_way = result.two_way(pair)
    if two_way is None:
        return ["?", "?", "?", "unknown"]
    mark = f"{direction.TWO_WAY_MARK} two-way" if two_way else "one-way"
    if pair["reverse_lag"] is None:
        return ["-", "-", "-", mark]
    return [
        str(pair["reverse_lag"]),
        _fmt(pair["reverse_lagged_corr"]),
        display.probability_text(pair["reverse_q_value"]),
        mark,
    ]


def _render_corr(result: CorrResult) -> str:
    value = _fmt(result.corr, "+.6f")
    lines = [
        f"corr({printable(result.a)}, {printable(result.b)}) = {value} on "
        f"{result.overlap if result.overlap is not None else '?'} common returns "
        f"(snapshot {result.snapshot_date}, {result.n_symbols:,} symbols)"
    ]
    if result.reason:
        lines.append(f"undefined: {result.reason}")
    if not result.published:
        lines.append(
            "note: this snapshot's matrices exist in the store but the snapshot is not "
            "published in the database (its later steps did not complete)"
        )
    return "\n".join(lines)


def _names(names: list[str], limit: int = 20) -> str:
    shown = ", ".join(printable(n) for n in names[:limit])
    return shown + (f" ... ({len(names) - limit} more)" if len(names) > limit else "") or "none"


def _stale_lines(reasons: list[str], day: dt.date) -> list[str]:
    """The warning of changes recorded from publications that were replaced since."""
    if not reasons:
        return []
    return [f"STALE: {reason}" for reason in reasons] + [
        f"(these changes are out of date: materialize snapshot_changes for {day.isoformat()})"
    ]


def _gap_lines(previous: dt.date, sessions_between: int | None) -> list[str]:
    """The line saying the changes are not overnight (SPEC §7 "Ranges"): none when the two
    dates are consecutive sessions."""
    if session_gap.is_overnight(sessions_between):
        return []
    return [session_gap.compared_with(previous, sessions_between)]


def _render_changes(result: ChangesResult) -> str:
    s, c = result.summary, result.counts
    if s is None or result.previous_date is None:
        return (
            f"no changes in {_describe(result.snapshot)}: no snapshot before it is published, "
            "so there is nothing to compare it with"
        )
    lines = [
        f"changes in {_describe(result.snapshot)} since {result.previous_date}",
        *_gap_lines(result.previous_date, result.sessions_between),
        *_stale_lines(result.stale, result.snapshot.snapshot_date),
        f"symbols: {s['n_common']:,} in both, {len(result.entered):,} entered, "
        f"{len(result.left):,} left",
    ]
    if s["n_pairs"] is None:
        lines.append(
            "market drift: skipped (" + "; ".join(sorted(set(s["skipped"].values()))) + ")"
        )
    elif s["n_pairs"] == 0:
        lines.append(
            "market drift: nothing to compare (no pair of symbols of both sessions with enough "
            "common returns on both days)"
        )
    else:
        q = s["quantiles"] or {}
        median = q.get("levels", []).index(0.5) if 0.5 in q.get("levels", []) else None
        rows = [
            ["mean corr", _fmt(s["previous_mean_corr"]), _fmt(s["mean_corr"])],
            ["mean |corr|", _fmt(s["previous_mean_abs_corr"]), _fmt(s["mean_abs_corr"])],
        ]
        if median is not None:
            rows.append(
                ["median corr", _fmt(q["corr_previous"][median]), _fmt(q["corr_today"][median])]
            )
        lines.append(
            f"market drift over {s['n_pairs']:,} pairs on both days: mean |change| "
            f"{_fmt(s['mean_abs_change'], '.4f')}, mean change {_fmt(s['mean_change'])}"
        )
        day = str(result.snapshot.snapshot_date)
        lines.append(format_table(["", str(result.previous_date), day], rows, "lrr"))
    lines.append(
        f"clusters: {c['moved_symbols']:,} symbol(s) moved, {c['clusters_split']} split, "
        f"{c['clusters_merged']} merged, {c['clusters_appeared']} appeared, "
        f"{c['clusters_vanished']} vanished"
    )
    lines.append(
        f"lead-lag pairs: {c['lead_lag_appeared']:,} appeared, {c['lead_lag_vanished']:,} "
        f"vanished, {c['lead_lag_lag_changed']:,} changed lag"
    )
    lines.append(f"entered: {_names(result.entered)}")
    lines.append(f"left: {_names(result.left)}")
    if result.moves:
        lines.append("largest correlation moves:")
        lines.append(
            format_table(
                [
                    "rank",
                    "symbol a",
                    "symbol b",
                    str(result.previous_date),
                    str(result.snapshot.snapshot_date),
                    "change",
                ],
                [
                    [
                        m["rank"],
                        m["symbol_a"],
                        m["symbol_b"],
                        _fmt(m["previous_corr"]),
                        _fmt(m["corr"]),
                        _fmt(m["change"]),
                    ]
                    for m in result.moves
                ],  # fmt: skip
                "rllrrr",
            )
        )
    return "\n".join(lines)


#: The kinds of lead-lag change (SPEC §10.5), in the order the answer lists them.
LEAD_LAG_CHANGES = ("appeared", "lag_changed", "vanished")
#: Lead-lag changes of one symbol shown in the terminal (all with ``--json``).
LEAD_LAG_SHOWN = 10


def _render_symbol_changes(result: SymbolChangesResult) -> str:
    who = printable(result.symbol)
    if result.previous_date is None:
        return (
            f"no changes of {who} in {_describe(result.snapshot)}: no snapshot before it is "
            "published, so there is nothing to compare it with"
        )
    lines = [
        f"changes of {who} in {_describe(result.snapshot)} since {result.previous_date}",
        *_gap_lines(result.previous_date, result.sessions_between),
        *_stale_lines(result.stale, result.snapshot.snapshot_date),
    ]
    if result.status == "entered":
        lines.append(f"{who} entered the universe (cluster {result.cluster_id})")
    elif result.status == "left":
        lines.append(f"{who} left the universe (it was in cluster {result.previous_cluster_id})")
    else:
        now = result.previous_cluster_now
        fate = "vanished" if now is None else f"continues as cluster {now}"
        lines.append(
            f"cluster: {result.previous_cluster_id} -> {result.cluster_id}"
            + (" (moved" if result.moved else " (stayed")
            + f"; its previous cluster {fate})"
        )
        lines.append(
            f"neighbors: {len(result.new_neighbors)} of {result.n_neighbors} new: "
            f"{_names(result.new_neighbors)}; dropped: {_names(result.dropped_neighbors)}"
        )
    if result.lead_lag:
        counts = {c: sum(r["change"] == c for r in result.lead_lag) for c in LEAD_LAG_CHANGES}
        lines.append(
            "lead-lag changes: "
            + ", ".join(f"{n} {c.replace('_', ' ')}" for c, n in counts.items() if n)
        )
        shown = result.lead_lag[:LEAD_LAG_SHOWN]
        lines.append(
            format_table(
                ["change", "leader", "lagger", "lag", "previous lag"],
                [
                    [r["change"], r["leader"], r["lagger"], r["lag"] or "", r["previous_lag"] or ""]
                    for r in shown
                ],
                "lllrr",
            )
        )
        if len(shown) < len(result.lead_lag):
            lines.append(f"({len(result.lead_lag) - len(shown)} more with --json)")
    else:
        lines.append("lead-lag changes: none")
    if result.moves:
        source = (
            ""
            if result.moves_source == "matrices"
            else " (among the market's top moves only: "
            "the matrices of a day are no longer in the store)"
        )
        lines.append(f"largest correlation moves{source}:")
        lines.append(
            format_table(
                [
                    "with",
                    str(result.previous_date),
                    str(result.snapshot.snapshot_date),
                    "change",
                ],
                [
                    [m["other"], _fmt(m["previous_corr"]), _fmt(m["corr"]), _fmt(m["change"])]
                    for m in result.moves
                ],
                "lrrr",
            )
        )
    return "\n".join(lines)


def _render_quality(result: QualityResult) -> str:
    share, largest = f"{result.max_zero_return_share:g}", f"{result.max_abs_return:g}"
    kept = "dropped from" if result.drop_suspect else "kept in"
    lines = [
        f"suspect prices in {_describe(result.snapshot)}",
        f"screen: zero-return share > {share} (stale closes) or largest |log return| > "
        f"{largest} (price error); suspect symbols {kept} the universe "
        f"(drop_suspect={'true' if result.drop_suspect else 'false'})",
    ]
    if not result.suspects:
        lines.append(
            f"no suspect prices: every symbol's zero-return share is at most {share} and its "
            f"largest |log return| at most {largest}"
        )
        return "\n".join(lines)
    lines.append(f"{len(result.suspects):,} suspect symbol(s):")
    rows = [
        [
            s["symbol"],
            display.figure_text(s["zero_return_share"]),
            display.figure_text(s["max_abs_return"]),
            "dropped" if s["dropped"] else "kept",
            s["reason"],
        ]
        for s in result.suspects
    ]
    table = format_table(
        ["symbol", "zero-return share", "max |log return|", "universe", "reason"], rows, "lrrll"
    )
    return "\n".join(lines) + "\n" + table
