"""The prefetching Loader stops its data thread whenever its consumer stops:
close(), an early break, an exception in the consumer, garbage collection,
and an error in the thread itself -- each in bounded time."""
import gc
import threading
import time

import numpy as np
import pytest

from engine.data import Loader, load_dataset


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits")[0]


def _loader_threads():
    return [t for t in threading.enumerate() if t.name == "sprint-loader"]


def _settled(limit=5.0):
    t = time.monotonic()
    while _loader_threads() and time.monotonic() - t < limit:
        time.sleep(0.01)
    return not _loader_threads()


def test_close_after_one_batch_returns_at_once(digits):
    t = time.monotonic()
    it = iter(Loader(digits, 256, shuffle=False, prefetch=1))
    next(it)
    it.close()
    assert time.monotonic() - t < 5 and not _loader_threads()
    with pytest.raises(StopIteration):
        next(it)
    it.close()       # twice is fine


def test_early_break_and_consumer_exception_stop_the_thread(digits):
    for _ in range(3):
        for i, _ in enumerate(Loader(digits, 8, prefetch=1)):
            if i == 2:
                break
        assert _settled()
    with pytest.raises(ZeroDivisionError):
        for x, y in Loader(digits, 8, prefetch=2):
            1 / 0
    assert _settled()


def test_dropped_iterator_is_collected_and_stops(digits):
    it = iter(Loader(digits, 8, prefetch=1))
    next(it)
    del it
    gc.collect()
    assert _settled()


def test_error_in_the_data_thread_reaches_the_consumer(digits):
    ld = Loader(digits, 8, prefetch=1)
    calls = {"n": 0}
    real = ld.load

    def flaky(idx):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk gone")
        return real(idx)
    ld.load = flaky
    got = []
    with pytest.raises(OSError, match="disk gone"):
        for x, y in ld:
            got.append(len(y))
    assert got == [8, 8] and _settled()


def test_a_full_epoch_still_yields_every_batch_in_order(digits):
    ld = Loader(digits, 100, shuffle=False, prefetch=1)
    ys = np.concatenate([np.asarray(y) for _, y in ld])
    assert np.array_equal(ys, np.asarray(digits.y)) and _settled()
