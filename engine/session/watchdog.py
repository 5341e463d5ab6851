"""A watchdog for MPI runs, like the timeout of PyTorch DDP: every rank's
thread sends a heartbeat to every other rank about once a second, on a
communicator of its own. A rank that sends none for ``timeout`` seconds --
frozen (SIGSTOP), swapping, wedged in a driver -- has stopped answering: the
lowest rank still answering prints one line naming it, silent ranks on the
same host are killed (a stopped process would ignore the launcher's
SIGTERM) and the whole job ends (MPI_Abort).

Heartbeats come from a thread, so a long computation, a slow checkpoint or a
rank waiting in a collective still beats; only a process that cannot run at
all falls silent. A rank whose main thread hangs while its threads run is
not detected (its peers wait in the next collective).
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

_TAG = 7431


class Watchdog:
    def __init__(self, comm, timeout: float, interval: float | None = None):
        self.comm = comm
        self.timeout = float(timeout)
        self.interval = interval or max(0.05, min(1.0, self.timeout / 5))
        self.active = False
        self.roles: dict = {}
        self.saved = lambda: ""      # what the run keeps, said after "ending the job" (Session)
        self._stop = threading.Event()
        self._th = None
        self._watch = False          # inside progress(): the main thread promises ticks
        self._tick = time.monotonic()
        if comm.size <= 1 or not hasattr(comm, "comm"):
            return
        MPI = comm.MPI
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
            # the heartbeat thread would call MPI beside the trainer's thread
            print(f"sprint: rank {comm.rank}: MPI gives no THREAD_MULTIPLE: no watchdog (--timeout)",
                  file=sys.stderr, flush=True)
            return
        self.MPI = MPI
        from engine.parallel import waits
        # collective: every rank creates its watchdog at the same point. Waited
        # for in Python (waits): a Ctrl-C that stopped a peer before it got
        # here reaches this rank too, which in MPI's C Dup it never saw (the
        # job then ended in MPI_Abort)
        self.mc, req = comm.comm.Idup()
        waits.wait(req, pause=0.001)
        self.rank, self.size = self.mc.Get_rank(), self.mc.Get_size()
        self.peers = [r for r in range(self.size) if r != self.rank]
        import socket
        self.places = waits.allgather_obj(self.mc, (socket.gethostname(), os.getpid()), pause=0.001)
        from engine.parallel import deathwatch
        # a rank killed outright: its line (a job across hosts: the watcher's address, from rank 0)
        deathwatch.start(self.rank, self.size, self.places,
                         share=lambda obj: waits.bcast_obj(self.mc, obj, pause=0.001))
        self.active = True
        self._th = threading.Thread(target=self._loop, name="sprint-watchdog", daemon=True)
        self._th.start()

    def _loop(self):
        MPI, mc = self.MPI, self.mc
        out = bytearray(1)
        inbox = bytearray(1)
        sends = {r: None for r in self.peers}
        last = {r: time.monotonic() for r in self.peers}
        status = MPI.Status()
        while not self._stop.is_set():
            for r in self.peers:
                # one byte goes eagerly: the send completes at once, and a
                # frozen peer holds at most timeout / interval of them
                if sends[r] is None or sends[r].Test():
                    sends[r] = mc.Isend([out, MPI.BYTE], dest=r, tag=_TAG)
            while mc.Iprobe(source=MPI.ANY_SOURCE, tag=_TAG, status=status):
                src = status.Get_source()
                mc.Recv([inbox, MPI.BYTE], source=src, tag=_TAG)
                last[src] = time.monotonic()
            now = time.monotonic()
            if self._watch and now - self._tick > self.timeout and not self._stop.is_set():
                self._fire_stuck(now - self._tick)
                return
            # While this rank's own loop is stalled it judges nobody: peers'
            # heartbeats to it can queue behind their messages it no longer
            # receives (one transport per pair of ranks), so they would look
            # silent to it alone; the others still judge them.
            stalled = self._watch and now - self._tick > 2 * self.interval
            silent = [] if stalled else sorted(r for r in self.peers if now - last[r] > self.timeout)
            if silent and not self._stop.is_set():
                self._fire(silent, now - min(last[r] for r in silent))
                return
            self._stop.wait(self.interval)

    def _fire(self, silent, quiet_for):
        answering = [r for r in range(self.size) if r not in silent]
        who = self._name(silent)
        if self.rank == answering[0]:
            from engine.parallel.abort import say_before_abort
            say_before_abort(f"sprint: error: {who} stopped answering (no heartbeat for "
                             f"{quiet_for:.0f} s; --timeout {self.timeout:g}); ending the job"
                             f"{self.saved()}\n")
            time.sleep(0.5)
        else:
            time.sleep(2.0)     # let the reporter's line out first
        self._kill_local(silent)
        try:
            self.comm.abort_world(1)
        finally:
            os._exit(1)

    def _name(self, ranks) -> str:
        """'rank 2 of 3 (replica 1)', 'ranks 1, 2 of 3 (server 1, replica 0)'."""
        roles = [self.roles[r] for r in ranks if r in self.roles]
        return (f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} of {self.size}"
                + (f" ({', '.join(roles)})" if roles else ""))

    def _fire_stuck(self, quiet_for):
        """This rank's main thread stopped ticking while its process runs:
        only this rank knows, so it names itself (its peers still see its
        heartbeats and stay quiet) and ends the job."""
        from engine.parallel.abort import say_before_abort
        say_before_abort(f"sprint: error: {self._name([self.rank])} made no progress for "
                         f"{quiet_for:.0f} s although its process runs (its main loop is stuck; --timeout "
                         f"{self.timeout:g}); ending the job{self.saved()}\n")
        time.sleep(0.5)
        try:
            self.comm.abort_world(1)
        finally:
            os._exit(1)

    def tick(self):
        """The main thread's sign of life inside :meth:`progress`."""
        self._tick = time.monotonic()

    @contextlib.contextmanager
    def progress(self):
        """Within: the main thread runs a loop that calls ``tick()`` at least
        every few seconds (waits included); ``timeout`` seconds without one
        end the job naming this rank. Leave it before any blocking
        collective, where a rank legitimately waits without ticking."""
        self._tick = time.monotonic()
        self._watch = self.active
        try:
            yield self
        finally:
            self._watch = False

    def _kill_local(self, silent):
        """A frozen process ignores the launcher's SIGTERM until continued:
        SIGKILL the silent ranks of this host so none is left behind."""
        import signal
        import socket
        host = socket.gethostname()
        for r in silent:
            h, pid = self.places[r]
            if h == host:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    def close(self, ok: bool = True):
        """Stop beating. After a normal end (``ok``), first wait until every
        rank got here, beating meanwhile, so a rank that finishes early is not
        taken for a silent one."""
        if not self.active:
            return
        self.active = False
        if ok:
            req = self.mc.Ibarrier()
            while not req.Test():
                time.sleep(0.01)
        self._stop.set()
        self._th.join(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close(ok=exc_type is None)
        return False
