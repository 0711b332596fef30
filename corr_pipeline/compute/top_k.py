"""The running top-k of every selection in the package, as small compiled primitives inlined
into the kernels that keep one (the lead-lag scan's per-pair selections, the changes' largest
moves).

The order is total: larger value first, then smaller index (:func:`before`), so a top-k does
not depend on the order its candidates are offered in, and the top-k of a union of disjoint
sets is the top-k of the union of their top-k's.
"""

from __future__ import annotations

from numba import njit

__all__ = ["before", "insert_value", "offer"]


@njit(cache=True, nogil=True, inline="always")
def before(value, index, other_value, other_index):  # pragma: no cover - compiled
    """Whether ``(value, index)`` comes before ``(other_value, other_index)``: larger value
    first, then smaller index."""
    return value > other_value or (value == other_value and index < other_index)


@njit(cache=True, nogil=True, inline="always")
def offer(values, indices, m, value, index):  # pragma: no cover - compiled
    """Insert ``(value, index)`` into the top ``m`` (``values[:m]`` / ``indices[:m]``, in
    :func:`before` order) if it comes before the last, dropping the last. Empty places hold
    (−inf, −1): after every real candidate of a finite value."""
    if not before(value, index, values[m - 1], indices[m - 1]):
        return
    pos = m - 1
    while pos > 0 and before(value, index, values[pos - 1], indices[pos - 1]):
        values[pos] = values[pos - 1]
        indices[pos] = indices[pos - 1]
        pos -= 1
    values[pos] = value
    indices[pos] = index


@njit(cache=True, nogil=True)
def insert_value(values, value):  # pragma: no cover - compiled
    """Insert ``value`` into the descending list ``values`` if it is strictly larger than the
    last, dropping the last: ``values`` then holds the ``len(values)`` largest values offered
    (ties need no order: only the values are kept)."""
    k = values.shape[0]
    if not value > values[k - 1]:
        return
    pos = k - 1
    while pos > 0 and value > values[pos - 1]:
        values[pos] = values[pos - 1]
        pos -= 1
    values[pos] = value
