"""How a number or a dtype is shown to a reader: the one place that rounds what the Dagster UI
(metadata, check results, markdown previews) and the demo's summary show.

A float keeps only the digits a reader can use; the value stays a float (the UI plots float
metadata across partitions). The rules, by kind of quantity:

=================  =========================================================  ================
kind               examples                                                   rounded to
=================  =========================================================  ================
:func:`corr`       correlations, their means, quantiles, lead-lag             4 decimals
                   improvements (all in [-1, 1])                              (``0.1916``)
:func:`share`      fractions in [0, 1]: fill rate, defined-pair share,        4 significant
                   missing-return share, recall, NaN share                    digits
                                                                              (``0.9877``,
                                                                              ``0.0001234``)
:func:`seconds`    durations                                                  0.01 s
:func:`mib`        memory in MiB                                              0.1 MiB
:func:`mean_count` means of counts (mean overlap, in days)                    0.1
=================  =========================================================  ================

``round(x, d)`` is Python's correctly rounded decimal rounding (ties to even on the binary
value), so ``repr`` of the result has at most ``d`` decimals. A value that is not finite
(NaN, ±inf) becomes NaN, which the UI shows as a gap. :func:`corr_text` is the text form of
:func:`corr` for tables. :func:`dtype_text` names a dtype as a reader would (``float32``,
``str[12]``, ``leader: int32, lag: int8``) rather than numpy's ``repr``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = [
    "CORR_DECIMALS",
    "MEAN_COUNT_DECIMALS",
    "MIB_DECIMALS",
    "SECONDS_DECIMALS",
    "SHARE_DIGITS",
    "corr",
    "corr_text",
    "dtype_text",
    "figure_text",
    "mean_count",
    "mib",
    "seconds",
    "share",
]

CORR_DECIMALS = 4
SHARE_DIGITS = 4
SECONDS_DECIMALS = 2
MIB_DECIMALS = 1
MEAN_COUNT_DECIMALS = 1


def _finite(value: Any) -> float | None:
    x = float(value)
    return x if math.isfinite(x) else None


def _decimals(value: Any, decimals: int) -> float:
    x = _finite(value)
    return float("nan") if x is None else round(x, decimals) + 0.0  # + 0.0: no -0.0


def corr(value: Any) -> float:
    """A correlation-like value in [-1, 1], to :data:`CORR_DECIMALS` decimals."""
    return _decimals(value, CORR_DECIMALS)


def share(value: Any) -> float:
    """A fraction in [0, 1], to :data:`SHARE_DIGITS` significant digits (small shares keep
    theirs: ``0.0001234``)."""
    x = _finite(value)
    return float("nan") if x is None else float(f"{x:.{SHARE_DIGITS}g}") + 0.0


def seconds(value: Any) -> float:
    """A duration in seconds, to :data:`SECONDS_DECIMALS` decimals (0.01 s)."""
    return _decimals(value, SECONDS_DECIMALS)


def mib(value: Any) -> float:
    """Memory in MiB, to :data:`MIB_DECIMALS` decimal (0.1 MiB)."""
    return _decimals(value, MIB_DECIMALS)


def mean_count(value: Any) -> float:
    """A mean of counts (days of overlap), to :data:`MEAN_COUNT_DECIMALS` decimal."""
    return _decimals(value, MEAN_COUNT_DECIMALS)


def corr_text(value: Any, *, signed: bool = True) -> str:
    """:func:`corr` as text with exactly :data:`CORR_DECIMALS` decimals (``+0.7240``; ``NaN``)."""
    x = corr(value)
    if math.isnan(x):
        return "NaN"
    return f"{x:+.{CORR_DECIMALS}f}" if signed else f"{x:.{CORR_DECIMALS}f}"


def figure_text(value: Any) -> str:
    """A suspect-price figure (a zero-return share, a largest |log return|) as text with
    exactly four decimals (``0.3016``, ``1.1000``; ``NaN``)."""
    x = _decimals(value, 4)
    return "NaN" if math.isnan(x) else f"{x:.4f}"


def probability_text(value: Any) -> str:
    """A p- or q-value: four decimals from 0.001 up (``0.0123``, ``1.0000``), two significant
    digits in scientific notation below (``3.2e-07``), ``0`` for zero, ``-`` for none (NULL or
    NaN: a pair published before the values were recorded)."""
    if value is None or math.isnan(float(value)):
        return "-"
    value = float(value)
    if value == 0.0:
        return "0"
    return format(value, ".4f") if value >= 1e-3 else format(value, ".1e")


def dtype_text(dtype: Any) -> str:
    """``dtype`` as a reader names it: ``float32``, ``int16``, ``bool``, ``str[12]`` (numpy
    ``<U12``), ``bytes[8]`` (``|S8``), ``float32[3]`` for a sub-array, and a structured dtype as
    its fields ``leader: int32, lagger: int32, lag: int8`` (nested ones in braces). Byte order
    is left out (native on every machine this runs on)."""
    dt = np.dtype(dtype)
    if dt.fields is not None and dt.names:
        parts = []
        for name in dt.names:
            field = dt.fields[name][0]
            text = dtype_text(field)
            parts.append(f"{name}: {{{text}}}" if field.names else f"{name}: {text}")
        return ", ".join(parts)
    if dt.subdtype is not None:
        base, shape = dt.subdtype
        return f"{dtype_text(base)}[{', '.join(str(s) for s in shape)}]"
    if dt.kind == "U":
        return f"str[{dt.itemsize // 4}]"
    if dt.kind == "S":
        return f"bytes[{dt.itemsize}]"
    if dt.kind in "mM":
        return dt.name  # datetime64[D], timedelta64[s]
    return dt.name
