"""The line for a rank that died without a word (kill -9, the kernel's
out-of-memory killer, a crash in C). MPICH's launcher answers such a death
by SIGKILLing every other rank of the job at once (hydra's proxy kills each
rank's process group), so no rank of the job is left to say anything:
before this module the job ended on mpiexec's 'BAD TERMINATION ... EXIT
CODE: 9' banner alone, naming a pid (not always the dead rank's).

A watcher process outside the ranks' process groups does it instead. Rank 0
starts it once the ranks of a job on one host know each other's pids (the
heartbeat watchdog's rank table); it holds a pidfd of every rank and rank
0's stderr. The first rank whose process ends is the one that died (the
launcher kills the others only after it); when no rank said its last words
first -- every rank that leaves on purpose marks the job's quiet file
(``quiet``: the atexit hook, ``say_before_abort``, MPI_Abort, the agreed
exit) -- the watcher prints one ``sprint: error:`` line naming that rank,
the epoch the run keeps and how to resume (rank 0 keeps it told,
``saved``).

This file runs as the watcher's script, so it imports only the standard
library at its top."""
from __future__ import annotations

import json
import os
import select
import sys

_state = {"mark": None, "pipe": None, "proc": None}


def _mark_path(host_pid) -> str:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else __import__("tempfile").gettempdir()
    return os.path.join(base, f"sprint-quiet-{host_pid[1]}")


def start(rank: int, size: int, places, note: str = "") -> bool:
    """On every rank of a job, after ``places`` ((host, pid) of every rank)
    is known: the quiet file's path and the hook that marks it on a normal
    exit; rank 0 starts the watcher. A job across hosts gets none (only a
    rank's own host can watch its process). False when there is no watcher."""
    if size <= 1 or len({h for h, _ in places}) != 1 or not hasattr(os, "pidfd_open"):
        return False
    import atexit
    _state["mark"] = _mark_path(places[0])
    atexit.register(quiet)
    if rank != 0:
        return True
    import subprocess
    job = {"pids": [p for _, p in places], "mark": _state["mark"], "note": note}
    try:
        os.unlink(_state["mark"])         # a pid's leftover from an earlier job
    except OSError:
        pass
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__), json.dumps(job)],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        return False
    _state["pipe"], _state["proc"] = proc.stdin, proc
    return True


def saved(note: str) -> None:
    """Rank 0: what the run keeps now ('; epoch 3 is saved: resume with: ...')."""
    pipe = _state["pipe"]
    if pipe is not None:
        try:
            pipe.write((note.replace("\n", " ") + "\n").encode())
            pipe.flush()
        except (OSError, ValueError):
            _state["pipe"] = None


def quiet() -> None:
    """This rank leaves on purpose (its line said, or none to say): the
    watcher stays silent."""
    path = _state["mark"]
    if path:
        try:
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        except OSError:
            pass


HOW = "killed by a signal, e.g. kill -9 or the out-of-memory killer, or crashed"


def _line(dead, size, note) -> str:
    """``dead``: the ranks gone when the watcher woke; more than one when the
    launcher's kill of the others came first (a loaded host): one of them died."""
    if len(dead) == 1:
        what = f"rank {dead[0]} of {size} died without a word ({HOW})"
    else:
        what = (f"one of ranks {', '.join(map(str, dead))} of {size} died without a word ({HOW}) and mpiexec "
                f"killed the others")
    return f"sprint: error: {what}; the job ended{note}\n"


def watch(job: dict, stdin=0, err=2) -> int:
    """The watcher's loop: until every rank is gone."""
    fds = {}
    for rank, pid in enumerate(job["pids"]):
        try:
            fds[os.pidfd_open(pid)] = rank
        except OSError:                   # gone already: not the first to die of a live job
            pass
    poll = select.poll()
    for fd in fds:
        poll.register(fd, select.POLLIN)
    poll.register(stdin, select.POLLIN)
    note, said, buf = job.get("note", ""), False, b""
    size = len(job["pids"])
    while fds:
        events = poll.poll()
        if any(fd == stdin for fd, _ in events):
            chunk = os.read(stdin, 65536)
            if chunk:
                buf += chunk
                *lines, buf = buf.split(b"\n")
                if lines:
                    note = lines[-1].decode("utf-8", "replace")
            else:
                poll.unregister(stdin)
        dead = sorted(fds[fd] for fd, _ in events if fd in fds)
        for fd, _ in events:
            if fd in fds:
                poll.unregister(fd)
                os.close(fd)
                del fds[fd]
        if dead and not said:
            said = True                   # only the first death can be told apart
            if not os.path.exists(job["mark"]):
                os.write(err, _line(dead, size, note).encode())
    try:
        os.unlink(job["mark"])            # the job's ranks are all gone
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(watch(json.loads(sys.argv[1])))
