"""Asset checks: the verdicts of :mod:`corr_pipeline.snapshot.verify` as Dagster results.

The checks themselves are declared on their assets (``check_specs``); each asset computes its
verdicts right after its step and returns them with its materialization, so a failed blocking
check stops the run before anything downstream (publication included) runs.
"""

from __future__ import annotations

import dagster as dg

from corr_pipeline.snapshot.verify import Verdict


def check_result(
    verdict: Verdict,
    check_name: str,
    asset: str,
    *,
    severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR,
) -> dg.AssetCheckResult:
    """``AssetCheckResult`` of ``check_name`` on ``asset`` carrying the verdict's facts and, if
    any, its first 20 problems as a markdown list."""
    metadata = dict(verdict.metadata)
    if verdict.problems:
        metadata["problems"] = dg.MetadataValue.md(
            "\n".join(f"- {p}" for p in verdict.problems[:20])
        )
    return dg.AssetCheckResult(
        check_name=check_name,
        asset_key=dg.AssetKey(asset),
        passed=bool(verdict.passed),
        severity=severity,
        metadata=metadata,
    )
