"""Stage measurement: the sampled peak of RssAnon sees memory freed before the stage ends."""

from __future__ import annotations

import time

import numpy as np

from corr_pipeline.snapshot.measure import PeakMemory, measure_stage


def test_peak_memory_sees_an_allocation_that_is_freed_before_exit() -> None:
    with PeakMemory(interval=0.001) as memory:
        block = np.ones(64 * 2**20 // 8)  # 64 MiB, touched
        time.sleep(0.05)  # let the sampler see it
        del block
    assert memory.above.anon_mib > 50
    assert memory.peak_rss >= memory.peak_anon > 0


def test_measure_stage_times_the_body_and_reads_its_memory() -> None:
    with measure_stage(sample_interval=0.001) as stats:
        block = np.ones(64 * 2**20 // 8)
        time.sleep(0.05)
        del block
    assert stats.seconds >= 0.05
    assert stats.peak_anon_mib is not None and stats.rss_anon_mib is not None
    assert stats.peak_anon_mib >= stats.rss_anon_mib + 50
    assert set(stats.metadata()) == {"stage_seconds", "peak_rss_mib", "rss_anon_mib"}
