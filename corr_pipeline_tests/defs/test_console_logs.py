"""A run whose run config names no logger (the launchpad's, the asset graph's Materialize, the
schedule's) logs to the console at INFO on the repository's instance: no Dagster DEBUG lines in
the terminal of ``dg dev`` / ``corr-pipeline ui``."""

from __future__ import annotations

import shutil

import dagster as dg

from corr_pipeline.defs.run import REPO_DAGSTER_YAML


@dg.asset
def tiny(context) -> int:
    context.log.info("tiny computed")
    return 1


def test_a_run_without_logger_config_prints_no_debug_lines(tmp_path, capfd):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copyfile(REPO_DAGSTER_YAML, home / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert dg.materialize([tiny], instance=instance).success
    printed = capfd.readouterr()
    lines = (printed.out + printed.err).splitlines()
    assert any(" - INFO - " in line and "tiny computed" in line for line in lines), lines
    assert not [line for line in lines if " - DEBUG - " in line]
    # the event log keeps every event (the DEBUG-level ones included) for the UI
    with dg.DagsterInstance.from_config(str(home)) as instance:
        (run,) = instance.get_runs()
        kinds = {
            e.dagster_event.event_type_value
            for e in instance.all_logs(run.run_id)
            if e.dagster_event
        }
    assert {"STEP_START", "ASSET_MATERIALIZATION", "STEP_SUCCESS"} <= kinds
