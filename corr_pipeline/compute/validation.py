"""Argument checks shared by the public compute functions: precise errors up front.

One convention for the whole package (numpy's): a wrong *type or dtype* (not a numpy array, a
float where an integer is needed, an array of the wrong dtype) raises ``TypeError``; a wrong
*shape or value* (not square, out of range, not finite, read-only) raises ``ValueError``. Every
message names the argument.
"""

from __future__ import annotations

import numbers

import numpy as np

_ABSTRACT_DTYPES: dict[type, str] = {
    np.integer: "an integer dtype",
    np.floating: "a floating dtype",
}


def _dtype_name(dtype: type[np.generic] | np.dtype) -> str:
    """``float32`` for a concrete dtype, ``an integer dtype`` for ``np.integer``."""
    if isinstance(dtype, type) and dtype in _ABSTRACT_DTYPES:
        return _ABSTRACT_DTYPES[dtype]
    return str(np.dtype(dtype))


def check_array(
    a: object,
    name: str,
    dtype: type[np.generic] | np.dtype,
    *,
    ndim: int | None = None,
    shape: tuple[int, ...] | None = None,
    contiguous: bool = False,
    writeable: bool = False,
) -> np.ndarray:
    """Return ``a`` after checking it is a numpy array (``TypeError``) with ``ndim`` dimensions
    or exactly ``shape`` (``ValueError``), of ``dtype`` (``TypeError``; an abstract type such as
    ``np.integer`` accepts any of its dtypes), and C-contiguous / writeable when asked
    (``ValueError``). ``np.memmap`` is an array."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(a).__name__}")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {a.shape}")
    if shape is not None and a.shape != shape:
        raise ValueError(f"{name} has shape {a.shape}, expected {shape}")
    if not np.issubdtype(a.dtype, dtype):
        raise TypeError(f"{name} has dtype {a.dtype}, expected {_dtype_name(dtype)}")
    if contiguous and not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if writeable and not a.flags.writeable:
        raise ValueError(f"{name} is read-only")
    return a


def check_returns(R: object) -> None:
    """``R`` must be a 2-D float32 array (T × N) with at least one row and column."""
    if not isinstance(R, np.ndarray):
        raise TypeError(f"R must be a numpy array, got {type(R).__name__}")
    if R.ndim != 2:
        raise ValueError(f"R must be 2-D (T × N), got shape {R.shape}")
    if R.dtype != np.float32:
        raise TypeError(f"R must be float32, got {R.dtype}; convert with R.astype(np.float32)")
    if R.shape[0] < 1 or R.shape[1] < 1:
        raise ValueError(f"R must have at least one row and one column, got shape {R.shape}")


def check_min_overlap(min_overlap: int, n_rows: int) -> None:
    """``2 <= min_overlap <= n_rows``."""
    if not isinstance(min_overlap, int | np.integer) or isinstance(min_overlap, bool):
        raise TypeError(f"min_overlap must be an integer, got {min_overlap!r}")
    if not 2 <= min_overlap <= n_rows:
        raise ValueError(f"min_overlap must be between 2 and T = {n_rows}, got {min_overlap}")


def check_positive_int(value: int, name: str, minimum: int = 1) -> None:
    """``value`` is an integer >= ``minimum``."""
    if not isinstance(value, int | np.integer) or isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def check_finite_number(value: object, name: str) -> float:
    """``float(value)`` after checking ``value`` is a real number (``TypeError`` otherwise,
    ``bool`` included) and finite (``ValueError``)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool | np.bool_):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not np.isfinite(float(value)):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def check_working_memory(working_memory_mb: float) -> None:
    """The block budget ``working_memory_mb`` (MiB) is a finite number > 0."""
    check_finite_number(working_memory_mb, "working_memory_mb")
    if not working_memory_mb > 0:
        raise ValueError(f"working_memory_mb must be > 0, got {working_memory_mb!r}")


def check_square_corr(corr: object, name: str = "corr") -> None:
    """A square float32 N × N matrix (SPEC §3), e.g. a read-only ``np.memmap``."""
    if not isinstance(corr, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(corr).__name__}")
    if corr.ndim != 2 or corr.shape[0] != corr.shape[1]:
        raise ValueError(f"{name} must be square N × N, got shape {corr.shape}")
    if corr.dtype != np.float32:
        raise TypeError(f"{name} must be float32 (SPEC §3), got {corr.dtype}")


def check_output(
    out: np.ndarray | None,
    name: str,
    shape: tuple[int, ...],
    dtype: np.dtype,
    *,
    contiguous: bool = False,
) -> np.ndarray:
    """Return ``out`` after checking shape, dtype, writability (and C-contiguity when asked),
    or a new empty array."""
    if out is None:
        return np.empty(shape, dtype=dtype)
    return check_array(out, name, dtype, shape=shape, contiguous=contiguous, writeable=True)
