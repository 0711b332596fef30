"""The snapshot parameters are declared once (the fields of
:class:`corr_pipeline.snapshot.params.SnapshotParameters`) and everything else follows them: the
launchpad resource's fields, each step's record, what ``snapshots.params`` and the bundles
record, each field's range check, and the user guide's parameter table, so none of them can
drift from the declarations."""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from pathlib import Path

import pytest

from corr_pipeline.defs.resources import SnapshotParams
from corr_pipeline.snapshot.parameter import Parameter
from corr_pipeline.snapshot.params import (
    BY_NAME,
    DEFAULTS,
    PARAMETERS,
    ClustersParameters,
    CorrelationParameters,
    LeadLagParameters,
    NeighborsParameters,
    SnapshotParameters,
    bundle_params,
    parameter_table,
    step_parameters,
)

ROOT = Path(__file__).resolve().parents[2]
USER_GUIDE = ROOT / "docs" / "user_guide.md"
RECORDS = (CorrelationParameters, NeighborsParameters, ClustersParameters, LeadLagParameters)


def _declared_type(p: Parameter) -> object:
    return p.kind | None if p.optional else p.kind


def test_the_user_guide_holds_the_generated_table() -> None:
    table = parameter_table()
    assert table in USER_GUIDE.read_text(), (
        "docs/user_guide.md §6 must hold the snapshot parameters' table exactly as "
        f"corr_pipeline.snapshot.params.parameter_table() gives it:\n{table}"
    )


def test_the_resource_has_a_field_per_launchpad_parameter_as_declared() -> None:
    launchpad = [p for p in PARAMETERS if p.launchpad]
    fields = SnapshotParams.model_fields
    assert list(fields) == [p.name for p in launchpad]
    for p in launchpad:
        field = fields[p.name]
        assert field.annotation == _declared_type(p), p.name
        assert field.default == p.default, p.name
        assert field.description == p.help, p.name


def test_each_step_record_holds_the_parameters_declared_for_its_step() -> None:
    for record in RECORDS:
        declared = step_parameters(record.STEP)
        hints = typing.get_type_hints(record)
        fields = [f.name for f in dataclasses.fields(record)]
        assert sorted(fields) == sorted(declared), record.STEP
        for name, p in declared.items():
            assert hints[name] == _declared_type(p), (record.STEP, name)
    stepped = {p.name for p in PARAMETERS if p.steps}
    assert stepped == {p.name for r in RECORDS for p in step_parameters(r.STEP).values()}


def test_the_lead_lag_record() -> None:
    params = SnapshotParameters(lead_lag_market_modes=2, max_q_value=0.5, k_leaders=3)
    # max_lag, k_leaders, k_laggers, min_overlap, min_improvement, max_q_value, market_modes,
    # working_memory_mb
    assert dataclasses.astuple(params.lead_lag) == (5, 3, 10, 60, 0.0, 0.5, 2, 512)
    assert isinstance(params.lead_lag, LeadLagParameters)
    assert params.clusters.memory_mb == params.clusters_memory_mb


def test_snapshots_params_records_the_same_keys_and_values() -> None:
    """The published ``snapshots.params`` of the defaults, key by key in order."""
    names = """lookback_days min_history_days min_overlap k_neighbors max_lag k_leaders k_laggers
        min_improvement max_q_value lead_lag_market_modes linkage_method distance_threshold
        n_clusters market_modes_removed max_zero_return_share max_abs_return drop_suspect
        working_memory_mb""".split()
    values = (252, 126, 60, 10, 5, 10, 10, 0.0, 0.05, 1, "average", 1.2, None, 0, 0.25, 0.5)
    expected = dict(zip(names, (*values, False, 512.0), strict=True))
    recorded = DEFAULTS.as_dict()
    assert list(recorded.items()) == list(expected.items())
    assert [type(v) for v in recorded.values()] == [type(v) for v in expected.values()]
    given = SnapshotParameters(working_memory_mb=16, n_clusters=7, distance_threshold=None)
    assert type(given.as_dict()["working_memory_mb"]) is float
    assert given.as_dict()["n_clusters"] == 7 and given.as_dict()["distance_threshold"] is None


def test_the_bundles_record_their_steps_result_parameters() -> None:
    assert list(bundle_params(DEFAULTS.correlation)) == ["min_overlap"]
    assert list(bundle_params(DEFAULTS.clusters)) == [
        "linkage_method",
        "distance_threshold",
        "n_clusters",
        "market_modes_removed",
    ]
    lead_lag = bundle_params(DEFAULTS.lead_lag)
    selection = "max_lag k_leaders k_laggers min_overlap min_improvement max_q_value".split()
    assert list(lead_lag) == [*selection, "lead_lag_market_modes"]
    assert list(lead_lag.values()) == [5, 10, 10, 60, 0.0, 0.05, 1]


def _outside(p: Parameter) -> list[float]:
    """Values just outside ``p``'s range."""
    bad: list[float] = []
    if p.low is not None:
        bad.append(p.low if p.low_open else p.low - 1)
    if p.high is not None:
        bad.append(p.high + 1)
    if p.finite:
        bad += [math.nan, math.inf]
    return bad


RANGED = [p for p in PARAMETERS if _outside(p)]


@pytest.mark.parametrize("declared", RANGED, ids=lambda p: p.name)
def test_a_value_out_of_range_is_refused_naming_the_field(declared: Parameter) -> None:
    for value in _outside(declared):
        given = declared.kind(value) if math.isfinite(value) else value
        with pytest.raises(
            ValueError, match=rf"{declared.name} must .*\(got {re.escape(str(given))}\)"
        ):
            SnapshotParameters(**{declared.name: given})
        with pytest.raises(ValueError, match=f"{declared.name} must"):
            SnapshotParams(**{declared.name: given})


def test_a_refused_text_is_not_repeated() -> None:
    secret = "postgresql://user:secret@host/db"
    for name in ("linkage_method", "dask_scheduler"):
        with pytest.raises(ValueError, match=f"{name} must be") as refused:
            SnapshotParameters(**{name: secret})
        assert "secret" not in str(refused.value)
    assert BY_NAME["dask_scheduler"].problem("tls://host:8786") is None
