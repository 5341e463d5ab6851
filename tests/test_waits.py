"""engine.parallel.waits: an MPI request completed by tests in Python (so
that Ctrl-C reaches a waiting rank), without the cost of a timed sleep
between the tests."""
import threading

import pytest

from engine.parallel import waits


class Request:
    """An mpi4py request stand-in that completes when ``done`` is set."""

    def __init__(self, done):
        self.done, self.tests = done, 0

    def Test(self):
        self.tests += 1
        return self.done.is_set()


def test_wait_without_a_pause_never_sleeps_on_a_timer_and_lets_other_threads_run(monkeypatch):
    """time.sleep(0) lasts the kernel's timer slack (about 70 us), and MPICH
    moves a non-blocking collective on only inside Test: it made the 2-rank
    sync step on digits 1.55x slower than MPI's own wait (bench/RESULTS.md
    section 3). The other thread here sets the event the request waits for."""
    def timed_sleep(s):
        raise AssertionError(f"time.sleep({s}) while waiting without a pause")

    monkeypatch.setattr(waits.time, "sleep", timed_sleep)
    done = threading.Event()
    req = Request(done)

    def other():            # Python code of another thread: it needs the interpreter while the wait runs
        while req.tests < 100:
            done.wait(1e-3)
        done.set()

    t = threading.Thread(target=other, daemon=True)
    t.start()
    waits.wait(req)
    t.join(10)
    assert done.is_set() and req.tests >= 100


@pytest.mark.parametrize("pause", [1e-4, 0.01])
def test_wait_with_a_pause_sleeps_that_long_between_tests(monkeypatch, pause):
    slept = []
    done = threading.Event()
    req = Request(done)

    def sleep(s):
        slept.append(s)
        if len(slept) == 3:
            done.set()

    monkeypatch.setattr(waits.time, "sleep", sleep)
    waits.wait(req, pause)
    assert slept == [pause] * 3 and req.tests == 4
