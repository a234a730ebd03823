"""The garbage collector is relaxed while rollout batches run, and restored after the last."""

from __future__ import annotations

import gc

from agentrl_sdk.rollout.collector_gc import YOUNG_THRESHOLD, relaxed_gc


def test_thresholds_raised_while_batches_run_and_restored_after_the_last():
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        with relaxed_gc():
            assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
            with relaxed_gc():  # a second batch at once
                assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
            assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
        assert gc.get_threshold() == (700, 10, 10)

        gc.set_threshold(0)  # collection turned off by the user: left alone
        with relaxed_gc():
            assert gc.get_threshold()[0] == 0
        assert gc.get_threshold()[0] == 0
    finally:
        gc.set_threshold(*before)
