"""Inputs for the picture tests: correlation matrices with clusters, memory maps, lead-lag pairs,
and a PNG decoder."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from corr_pipeline.compute.lead_lag import LEAD_LAG_DTYPE

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def decode(png: bytes) -> np.ndarray:
    """RGB pixels of ``png`` (asserting it is a PNG)."""
    assert png[:8] == PNG_MAGIC
    with Image.open(io.BytesIO(png)) as image:
        image.load()
        assert image.format == "PNG"
        return np.asarray(image.convert("RGB"))


def corr_with_clusters(
    n: int, n_groups: int, seed: int, t: int = 120
) -> tuple[np.ndarray, np.ndarray]:
    """float32 correlation of a factor model (groups = true clusters), NaN rows/cols sprinkled."""
    rng = np.random.default_rng(seed)
    groups = rng.integers(0, n_groups, n)
    factors = rng.standard_normal((t, n_groups))
    returns = factors[:, groups] + rng.standard_normal((t, n))
    corr = np.atleast_2d(np.corrcoef(returns.T)).astype(np.float32)
    bad = rng.choice(n, size=max(1, n // 50), replace=False)
    corr[bad, :] = np.nan
    corr[:, bad] = np.nan
    corr[bad, bad] = 1.0
    return corr, groups


def memmap_of(tmp_path, array: np.ndarray) -> np.memmap:
    """``array`` written to ``tmp_path / "corr.npy"`` and opened read-only as a memory map."""
    path = tmp_path / "corr.npy"
    out = np.lib.format.open_memmap(path, mode="w+", dtype=array.dtype, shape=array.shape)
    out[...] = array
    out.flush()
    del out
    return np.load(path, mmap_mode="r")


def lead_lag_pairs(n_pairs: int, n_symbols: int, seed: int = 0) -> np.ndarray:
    """Random lead-lag pairs (LEAD_LAG_DTYPE, column indices, unsorted), some sync_corr NaN."""
    rng = np.random.default_rng(seed)
    pairs = np.zeros(n_pairs, dtype=LEAD_LAG_DTYPE)
    pairs["leader"] = rng.integers(0, n_symbols, n_pairs)
    pairs["lagger"] = (pairs["leader"] + 1 + rng.integers(0, n_symbols - 1, n_pairs)) % n_symbols
    pairs["lag"] = rng.integers(1, 6, n_pairs)
    pairs["lagged_corr"] = rng.uniform(-0.6, 0.6, n_pairs)
    pairs["sync_corr"] = np.where(rng.random(n_pairs) < 0.1, np.nan, 0.05)
    pairs["improvement"] = rng.uniform(0, 0.5, n_pairs)
    pairs["overlap"] = 240
    return pairs
