"""Synthetic equity universe with known structure (pure numpy: no database, no paths).

``generate_universe(n_symbols, n_days, seed)`` draws a daily close-price panel that looks like
a real equity universe *and* carries a known answer, so every stage of the pipeline can be
exercised end to end and its lead-lag output scored against the truth (SPEC §1, §2, §6).

Model (all draws from ``numpy.random.default_rng(seed)`` in a fixed order, so the same
arguments give bit-identical arrays):

* Dates: ``n_days`` weekdays (Mon-Fri; no holiday calendar) ending at ``end_date`` or, if that
  is a weekend, at the last weekday before it. Default ``end_date`` is :data:`DEFAULT_END_DATE`
  (2026-11-27, a Friday) so the default output does not depend on the day it is run.
* Log returns, ``T = n_days - 1`` of them per symbol, for ordinary symbols ``j``::

      r[t, j] = mu_j + sigma_j * (b_j m[t] + g_j f[t, s(j)] + w e[t, j]) / sqrt(b_j² + g_j² + w²)

  with a market factor ``m``, sector factors ``f`` (``n_sectors`` = clip(N // 480, 20, 50),
  capped at N), idiosyncratic ``e``, all Student-t with ``df = 4`` scaled to unit variance
  (fat tails); market loading ``b_j ~ U(0.3, 1.0)``, sector loading ``g_j ~ U(0.4, 1.1)``,
  idiosyncratic weight ``w = 1.2``, daily volatility ``sigma_j`` log-normal around 1.8 %
  (clipped to [0.4 %, 12 %]), small drift ``mu_j``. Synchronous correlation: ≈ 0.15 on
  average across sectors, ≈ 0.4 within one.
* Injected pure lead-lag pairs (``n_pairs = min(max(5, N // 200), N // 4)``, all 2·n_pairs
  symbols distinct): the leader ``L`` is purely idiosyncratic, i.i.d. over time
  (``r[t, L] = sigma_L · e_L[t]``, no factor, no drift, ``e_L`` standard normal), so its lagged
  returns are uncorrelated with its current ones. Its innovations are Gaussian, not Student-t:
  the pair then carries its lag every day, which the heteroskedasticity-robust test of SPEC §6
  certifies (with Student-t(4) innovations a few outlier days carry most of ``Σ a·b``, and a
  ρ = 0.7 pair's robust statistic over 299 days falls below 2.3 one time in a hundred, against
  7.4 with Gaussian ones: no test can tell such a pair from noise among millions). The lagger ``G`` with lag ``ℓ ∈ {1, 2, 3}`` is::

      r[t, G] = beta · r[t - ℓ, L] + sigma_G · sqrt(1 - rho²) · e_G[t],   beta = rho · sigma_G / sigma_L

  with ``rho ~ U(0.7, 0.9)`` (the population lagged correlation), the leader being simulated
  ``MAX_LAG`` extra days before the window so every lagger return is defined. Finally each
  lagger series is made exactly orthogonal (in sample, centred) to its leader's *synchronous*
  series, so over the full window ``sync corr == 0`` up to rounding, and
  ``|lagged corr| ≈ rho`` — the pair is invisible to a synchronous-correlation screen (SPEC §6).
  Pair symbols have complete, clean histories (none of the defects below).
* Prices: ``close[0, j] = P0_j`` (log-uniform in [2, 400]) and
  ``close[t + 1, j] = close[t, j] · exp(r[t, j])``.
* Defects, among the non-pair ("eligible") symbols, with exact counts:
  - listed late: ``round(0.12 · n_eligible)`` symbols whose rows start at ``first_row > 0``;
  - delisted early: ``round(0.07 · n_eligible)`` other symbols whose rows stop at
    ``end_row < n_days`` (exclusive);
  - every history keeps at least ``max(5, n_days // 5)`` rows;
  - single-day halts: ``round(0.05 · n_eligible)`` symbols miss exactly one weekday strictly
    inside their history (the rows before and after exist);
  - bad prints: ``min(max(4, N // 500), ...)`` other symbols each have one row whose close is
    bad, cycling through :data:`BAD_PRINT_KINDS`: ``0``, a negative value (``-close``), ``NaN``,
    ``+inf``. These rows *exist* in the table; SPEC §1 says they make touching returns NaN.

``close`` holds NaN where a symbol has no row; because a bad print may itself be NaN, the
``present`` mask (not ``isfinite(close)``) says which rows exist.

Memory at N = 24,000, T = 350: ``close`` 67 MB float64, ``present`` 8 MB, plus one
67 MB temporary for the idiosyncratic draws and ~12 MB per 4,096-column factor block.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np

DEFAULT_END_DATE = dt.date(2026, 11, 27)
"""Default last trading date (a Friday), fixed so that default output never depends on today."""

STUDENT_T_DF = 4.0
MAX_LAG = 3
IDIOSYNCRATIC_WEIGHT = 1.2
SHARE_LISTED_LATE = 0.12
SHARE_DELISTED_EARLY = 0.07
SHARE_HALTED = 0.05
BAD_PRINT_KINDS = ("zero", "negative", "nan", "inf")
MIN_SYMBOLS = 10
MIN_DAYS = 10

REALISTIC_TICKERS = (
    "A",
    "AAPL",
    "BF-A",
    "BF-B",
    "BFAM",
    "BRK.A",
    "BRK.B",
    "BRKR",
    "GOOG",
    "GOOGL",
    "MSFT",
    "T",
)
"""Ticker-shaped names mixed into universes of >= 100 symbols. They exercise code-point
ordering (``'BF-B' < 'BFAM'`` by code point, the reverse under en_US collation), punctuation
and one-letter symbols. The prices are synthetic like all the others."""

TRUTH_DTYPE = np.dtype(
    [
        ("leader", np.int32),
        ("lagger", np.int32),
        ("lag", np.int16),
        ("beta", np.float64),
        ("rho", np.float64),
    ]
)
HALT_DTYPE = np.dtype([("symbol", np.int32), ("row", np.int32)])
BAD_PRINT_DTYPE = np.dtype([("symbol", np.int32), ("row", np.int32), ("kind", "U8")])

_FACTOR_BLOCK_COLUMNS = 4096


@dataclass(frozen=True, eq=False)
class SyntheticUniverse:
    """A generated universe. Column ``j`` of every array is ``symbols[j]``; ``symbols`` is
    sorted ascending by code point, so column order equals the pipeline's column order (SPEC §2).

    Attributes:
        seed: the generator seed.
        symbols: ``(N,)`` unicode array of unique ASCII symbols, sorted.
        dates: ``(n_days,)`` ``datetime64[D]`` weekdays, ascending.
        close: ``(n_days, N)`` float64; NaN where the row does not exist; bad prints included.
        present: ``(n_days, N)`` bool, True where a ``prices`` row exists (bad ones included).
        first_row, end_row: ``(N,)`` int32, the symbol's rows span ``first_row <= t < end_row``
            (minus halts).
        sector: ``(N,)`` int32 sector of each symbol; ``-1`` for lead-lag pair symbols.
        halts: :data:`HALT_DTYPE` records (symbol index, row index of the missing weekday).
        bad_prints: :data:`BAD_PRINT_DTYPE` records (symbol index, row index, kind).
        truth: :data:`TRUTH_DTYPE` records of injected pairs (leader and lagger column indices,
            lag in days, beta, population lagged correlation rho), sorted by leader.
    """

    seed: int
    symbols: np.ndarray
    dates: np.ndarray
    close: np.ndarray
    present: np.ndarray
    first_row: np.ndarray
    end_row: np.ndarray
    sector: np.ndarray
    halts: np.ndarray
    bad_prints: np.ndarray
    truth: np.ndarray

    @property
    def n_symbols(self) -> int:
        return int(self.symbols.shape[0])

    @property
    def n_days(self) -> int:
        return int(self.dates.shape[0])

    @property
    def n_rows(self) -> int:
        """Number of ``prices`` rows (existing rows, bad prints included)."""
        return int(np.count_nonzero(self.present))

    @property
    def listed_late(self) -> np.ndarray:
        """Bool ``(N,)``: the symbol's first row is after the first window date."""
        return self.first_row > 0

    @property
    def delisted_early(self) -> np.ndarray:
        """Bool ``(N,)``: the symbol's last row is before the last window date."""
        return self.end_row < self.n_days

    def bad_print_counts(self) -> dict[str, int]:
        """Number of bad prints per kind, every kind of :data:`BAD_PRINT_KINDS` listed."""
        kinds = self.bad_prints["kind"]
        return {kind: int(np.count_nonzero(kinds == kind)) for kind in BAD_PRINT_KINDS}

    def truth_symbols(self) -> list[tuple[str, str, int]]:
        """Injected pairs as ``(leader symbol, lagger symbol, lag)``, sorted."""
        return sorted(
            (str(self.symbols[p["leader"]]), str(self.symbols[p["lagger"]]), int(p["lag"]))
            for p in self.truth
        )

    def log_returns(self) -> np.ndarray:
        """``(n_days - 1, N)`` float64 returns by the SPEC §2 rule:
        ``ln(close[t+1] / close[t])`` if both closes exist, are finite and > 0, else NaN."""
        valid = self.present & np.isfinite(self.close) & (self.close > 0)
        with np.errstate(invalid="ignore", divide="ignore"):
            returns = np.log(self.close[1:] / self.close[:-1])
        returns[~(valid[1:] & valid[:-1])] = np.nan
        return returns


def _validate(n_symbols: int, n_days: int, seed: int) -> None:
    for name, value, minimum in (
        ("n_symbols", n_symbols, MIN_SYMBOLS),
        ("n_days", n_days, MIN_DAYS),
        ("seed", seed, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise TypeError(f"{name} must be an integer, got {value!r}")
        if value < minimum:
            raise ValueError(f"{name} must be >= {minimum}, got {value}")


def _to_date(end_date: dt.date | str | None) -> np.datetime64:
    if end_date is None:
        end_date = DEFAULT_END_DATE
    if isinstance(end_date, str):
        try:
            end_date = dt.date.fromisoformat(end_date)
        except ValueError as exc:
            raise ValueError(f"end_date must be YYYY-MM-DD, got {end_date!r}") from exc
    if isinstance(end_date, dt.datetime):
        end_date = end_date.date()
    if not isinstance(end_date, dt.date):
        raise TypeError(f"end_date must be a date, an ISO string or None, got {end_date!r}")
    return np.datetime64(end_date, "D")


def weekday_dates(n_days: int, end_date: dt.date | str | None = None) -> np.ndarray:
    """The ``n_days`` weekdays ending at ``end_date`` (rolled back to a weekday), ascending."""
    end = np.busday_offset(_to_date(end_date), 0, roll="backward")
    return np.busday_offset(end, np.arange(-(n_days - 1), 1), roll="backward")


def make_symbols(n_symbols: int) -> np.ndarray:
    """``n_symbols`` unique ASCII symbols sorted by code point: ``S00001``, ``S00002``, ...
    (zero-padded so code-point order is numeric order), with :data:`REALISTIC_TICKERS`
    taking the place of the last few when ``n_symbols >= 100``."""
    n_tickers = len(REALISTIC_TICKERS) if n_symbols >= 100 else 0
    n_generic = n_symbols - n_tickers
    width = max(5, len(str(n_generic)))
    generic = np.char.add("S", np.char.zfill(np.arange(1, n_generic + 1).astype(str), width))
    names = np.concatenate([generic, np.array(REALISTIC_TICKERS[:n_tickers], dtype=str)])
    return np.sort(names.astype(f"U{max(len(n) for n in names)}"))


def _student_t(rng: np.random.Generator, size: int | tuple[int, ...]) -> np.ndarray:
    """Student-t(df = STUDENT_T_DF) draws scaled to unit variance."""
    draws = rng.standard_t(STUDENT_T_DF, size=size)
    draws *= 1.0 / np.sqrt(STUDENT_T_DF / (STUDENT_T_DF - 2.0))
    return draws


def generate_universe(
    n_symbols: int,
    n_days: int,
    seed: int,
    end_date: dt.date | str | None = None,
) -> SyntheticUniverse:
    """Generate a synthetic universe (see the module docstring for the exact model).

    Args:
        n_symbols: number of symbols ``N`` (>= 10).
        n_days: number of trading dates (>= 10); there are ``n_days - 1`` returns.
        seed: non-negative integer; the same arguments give bit-identical output.
        end_date: last date (``date`` or ``'YYYY-MM-DD'``), rolled back to a weekday;
            default :data:`DEFAULT_END_DATE`.

    Fully vectorised: N = 24,000 × 350 days takes a few seconds.
    """
    _validate(n_symbols, n_days, seed)
    rng = np.random.default_rng(seed)
    n_returns = n_days - 1
    dates = weekday_dates(n_days, end_date)
    symbols = make_symbols(n_symbols)

    # --- per-symbol parameters -------------------------------------------------------------
    n_sectors = min(n_symbols, int(np.clip(n_symbols // 480, 20, 50)))
    sector = rng.integers(0, n_sectors, size=n_symbols).astype(np.int32)
    market_loading = rng.uniform(0.3, 1.0, size=n_symbols)
    sector_loading = rng.uniform(0.4, 1.1, size=n_symbols)
    volatility = np.clip(np.exp(rng.normal(np.log(0.018), 0.45, size=n_symbols)), 0.004, 0.12)
    drift = rng.normal(0.0002, 0.0003, size=n_symbols)
    start_price = np.exp(rng.uniform(np.log(2.0), np.log(400.0), size=n_symbols))
    scale = volatility / np.sqrt(market_loading**2 + sector_loading**2 + IDIOSYNCRATIC_WEIGHT**2)

    # --- factor model log returns, written straight into rows 1.. of the price buffer ------
    log_price = np.empty((n_days, n_symbols), dtype=np.float64)
    returns = log_price[1:]  # view: returns[t] is the return from date t to date t + 1
    returns[...] = _student_t(rng, (n_returns, n_symbols))  # idiosyncratic, weight applied below
    market = _student_t(rng, n_returns)
    sector_factors = _student_t(rng, (n_returns, n_sectors))
    for c0 in range(0, n_symbols, _FACTOR_BLOCK_COLUMNS):
        cols = slice(c0, min(c0 + _FACTOR_BLOCK_COLUMNS, n_symbols))
        block = returns[:, cols]
        block *= IDIOSYNCRATIC_WEIGHT
        block += np.outer(market, market_loading[cols])
        block += sector_factors[:, sector[cols]] * sector_loading[cols]
        block *= scale[cols]
        block += drift[cols]

    # --- injected pure lead-lag pairs -------------------------------------------------------
    truth, pair_symbols = _inject_pairs(rng, returns, volatility, n_symbols, n_returns)
    sector[pair_symbols] = -1

    # --- prices -----------------------------------------------------------------------------
    log_price[0] = 0.0
    np.cumsum(log_price, axis=0, out=log_price)
    log_price += np.log(start_price)
    close = np.exp(log_price, out=log_price)

    # --- ragged histories, halts, bad prints (non-pair symbols only) -------------------------
    is_pair = np.zeros(n_symbols, dtype=bool)
    is_pair[pair_symbols] = True
    eligible = rng.permutation(np.flatnonzero(~is_pair))
    n_eligible = eligible.shape[0]
    min_rows = max(5, n_days // 5)
    n_listed = int(round(SHARE_LISTED_LATE * n_eligible))
    n_delisted = int(round(SHARE_DELISTED_EARLY * n_eligible))
    first_row = np.zeros(n_symbols, dtype=np.int32)
    end_row = np.full(n_symbols, n_days, dtype=np.int32)
    listed = eligible[:n_listed]
    delisted = eligible[n_listed : n_listed + n_delisted]
    first_row[listed] = rng.integers(1, n_days - min_rows + 1, size=n_listed)
    end_row[delisted] = rng.integers(min_rows, n_days, size=n_delisted)
    row_index = np.arange(n_days, dtype=np.int32)[:, None]
    present = (row_index >= first_row) & (row_index < end_row)

    n_halted = int(round(SHARE_HALTED * n_eligible))
    halted_order = rng.permutation(eligible)
    halted = np.sort(halted_order[:n_halted])
    life = end_row[halted] - first_row[halted]  # >= min_rows >= 5
    halt_rows = first_row[halted] + 1 + rng.integers(0, life - 2)  # in [first + 1, end - 2]
    present[halt_rows, halted] = False

    bad_prints = _bad_prints(rng, close, present, first_row, end_row, halted_order, n_halted)

    halts = np.empty(n_halted, dtype=HALT_DTYPE)
    halts["symbol"], halts["row"] = halted, halt_rows

    return SyntheticUniverse(
        seed=int(seed),
        symbols=symbols,
        dates=dates,
        close=close,
        present=present,
        first_row=first_row,
        end_row=end_row,
        sector=sector,
        halts=halts,
        bad_prints=bad_prints,
        truth=truth,
    )


def _inject_pairs(
    rng: np.random.Generator,
    returns: np.ndarray,
    volatility: np.ndarray,
    n_symbols: int,
    n_returns: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Overwrite the returns of ``max(5, N // 200)`` (at most N // 4) leader/lagger pairs with
    pure lead-lag pairs (module docstring); their truth (sorted by leader) and the symbols of
    every pair."""
    n_pairs = min(max(5, n_symbols // 200), n_symbols // 4)
    pair_symbols = rng.choice(n_symbols, size=2 * n_pairs, replace=False)
    leaders, laggers = pair_symbols[:n_pairs], pair_symbols[n_pairs:]
    lags = rng.integers(1, MAX_LAG + 1, size=n_pairs)
    rho = rng.uniform(0.7, 0.9, size=n_pairs)
    leader_vol, lagger_vol = volatility[leaders], volatility[laggers]
    beta = rho * lagger_vol / leader_vol
    # leader simulated MAX_LAG days before the window so that every lagger return is defined
    leader_ext = rng.standard_normal((n_returns + MAX_LAG, n_pairs)) * leader_vol
    leader_returns = leader_ext[MAX_LAG:]
    source_rows = MAX_LAG + np.arange(n_returns)[:, None] - lags[None, :]
    lagged_leader = np.take_along_axis(leader_ext, source_rows, axis=0)
    lagger_returns = beta * lagged_leader
    lagger_returns += _student_t(rng, (n_returns, n_pairs)) * (lagger_vol * np.sqrt(1 - rho**2))
    # remove the (sample) synchronous component: exact zero sync corr over the full window
    leader_centred = leader_returns - leader_returns.mean(axis=0)
    lagger_centred = lagger_returns - lagger_returns.mean(axis=0)
    projection = (leader_centred * lagger_centred).sum(axis=0) / (leader_centred**2).sum(axis=0)
    lagger_returns -= projection * leader_centred
    returns[:, leaders] = leader_returns
    returns[:, laggers] = lagger_returns
    truth = np.empty(n_pairs, dtype=TRUTH_DTYPE)
    truth["leader"], truth["lagger"], truth["lag"] = leaders, laggers, lags
    truth["beta"], truth["rho"] = beta, rho
    truth.sort(order="leader")
    return truth, pair_symbols


def _bad_prints(
    rng: np.random.Generator,
    close: np.ndarray,
    present: np.ndarray,
    first_row: np.ndarray,
    end_row: np.ndarray,
    halted_order: np.ndarray,
    n_halted: int,
) -> np.ndarray:
    """Blank the closes of absent rows, then write ``max(4, N // 500)`` bad prints (zero,
    negative, NaN, infinite in turn) on symbols that are neither pairs nor halted; their
    records."""
    n_symbols = close.shape[1]
    n_bad = min(max(4, n_symbols // 500), halted_order.shape[0] - n_halted)
    bad_symbols = np.sort(halted_order[n_halted : n_halted + n_bad])
    bad_rows = first_row[bad_symbols] + rng.integers(
        0, end_row[bad_symbols] - first_row[bad_symbols]
    )
    bad_kinds = np.array(BAD_PRINT_KINDS)[np.arange(n_bad) % len(BAD_PRINT_KINDS)]
    close[~present] = np.nan
    bad_values = {
        "zero": np.zeros(n_bad),
        "negative": -close[bad_rows, bad_symbols],
        "nan": np.full(n_bad, np.nan),
        "inf": np.full(n_bad, np.inf),
    }
    close[bad_rows, bad_symbols] = np.select(
        [bad_kinds == kind for kind in BAD_PRINT_KINDS],
        [bad_values[kind] for kind in BAD_PRINT_KINDS],
    )
    bad_prints = np.empty(n_bad, dtype=BAD_PRINT_DTYPE)
    bad_prints["symbol"], bad_prints["row"], bad_prints["kind"] = bad_symbols, bad_rows, bad_kinds
    return bad_prints
