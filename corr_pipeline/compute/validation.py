"""Argument checks shared by the public compute functions: precise errors up front."""

from __future__ import annotations

import numpy as np


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


def check_square_corr(corr: object, name: str = "corr") -> None:
    """A square float32 N × N matrix."""
    if not isinstance(corr, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(corr).__name__}")
    if corr.ndim != 2 or corr.shape[0] != corr.shape[1]:
        raise ValueError(f"{name} must be square N × N, got shape {corr.shape}")
    if corr.dtype != np.float32:
        raise TypeError(f"{name} must be float32, got {corr.dtype}")


def check_output(
    out: np.ndarray | None, name: str, shape: tuple[int, ...], dtype: np.dtype
) -> np.ndarray:
    """Return ``out`` after checking shape, dtype and writability, or a new empty array."""
    if out is None:
        return np.empty(shape, dtype=dtype)
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(out).__name__}")
    if out.shape != shape:
        raise ValueError(f"{name} has shape {out.shape}, expected {shape}")
    if out.dtype != dtype:
        raise TypeError(f"{name} has dtype {out.dtype}, expected {dtype}")
    if not out.flags.writeable:
        raise ValueError(f"{name} is read-only")
    return out
