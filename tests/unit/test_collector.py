import gc

from tidegate.collector import RUN_THRESHOLDS, fewer_collections


def test_a_run_raises_the_collector_thresholds_and_puts_them_back():
    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        with fewer_collections():
            assert gc.get_threshold() == RUN_THRESHOLDS
        assert gc.get_threshold() == (700, 10, 10)
        gc.set_threshold(100_000, 5, 500)  # a higher setting of the host stays as it is
        with fewer_collections():
            assert gc.get_threshold() == (100_000, 20, 500)
        assert gc.get_threshold() == (100_000, 5, 500)
    finally:
        gc.set_threshold(*saved)
