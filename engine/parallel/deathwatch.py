"""The line for a rank that died without a word (kill -9, the kernel's
out-of-memory killer, a crash in C). MPICH's launcher answers such a death
by SIGKILLing every other rank of the job at once (hydra's proxy kills each
rank's process group), so no rank of the job is left to say anything:
before this module the job ended on mpiexec's 'BAD TERMINATION ... EXIT
CODE: 9' banner alone, naming a pid (not always the dead rank's).

A watcher process outside the ranks' process groups does it instead. Rank 0
starts it once the ranks of a job on one host know each other's pids (the
heartbeat watchdog's rank table); every rank holds a connection to it. A
rank's connection closes when the kernel releases the rank's files, the
same moment the launcher learns of the death through the rank's own pipes,
so the connection of the rank that died closes before the launcher can kill
any other: the first to close names it (several at once, on a host too
busy to wake the watcher in time: one of them). A rank that leaves on
purpose -- its line said, or a clean end -- says ``quiet`` first (the atexit
hook, ``say_before_abort``, MPI_Abort, the agreed exit) and the watcher
stays silent; rank 0 keeps it told what the run keeps (``saved``), which
the line ends with: '...; epoch 3 is saved: resume with: ...'.

(The pidfds of the ranks, tried first, order deaths by the end of their
teardown, which a big rank finishes after the launcher's victims: under
load the line named the wrong rank.)

This file runs as the watcher's script, so it imports only the standard
library at its top."""
from __future__ import annotations

import json
import os
import select
import socket
import sys
import time

_state = {"sock": None}
CONNECT_S = 5.0        # how long a rank tries to reach the watcher rank 0 started


def _address(places) -> str:
    """The watcher's socket (Linux's abstract namespace: no file to leave behind)."""
    host, pid = places[0]
    return f"\0sprint-deathwatch-{pid}-{host}"


def start(rank: int, size: int, places, note: str = "") -> bool:
    """On every rank of a job, once ``places`` ((host, pid) of every rank) is
    known: rank 0 starts the watcher, every rank connects to it. A job across
    hosts gets none (a connection closing on another host says nothing of
    the order of deaths). False when this rank has no watcher."""
    if size <= 1 or len({h for h, _ in places}) != 1 or not sys.platform.startswith("linux"):
        return False
    addr = _address(places)
    if rank == 0:
        import subprocess
        job = {"size": size, "address": addr, "note": note}
        try:
            subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__), json.dumps(job)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            return False
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)       # not inherited by children
    deadline = time.monotonic() + CONNECT_S
    while True:
        try:
            sock.connect(addr)
            sock.sendall(f"rank {rank}\n".encode())
            break
        except OSError:
            if time.monotonic() > deadline:
                sock.close()
                return False
            time.sleep(0.01)
    _state["sock"] = sock
    import atexit
    atexit.register(quiet)
    return True


def _send(text: str) -> None:
    sock = _state["sock"]
    if sock is not None:
        try:
            sock.sendall(text.encode("utf-8", "replace"))
        except OSError:
            _state["sock"] = None


def saved(note: str) -> None:
    """Rank 0: what the run keeps now ('; epoch 3 is saved: resume with: ...')."""
    _send("saved " + note.replace("\n", " ") + "\n")


def quiet() -> None:
    """This rank leaves on purpose (its line said, or none to say): the
    watcher stays silent."""
    _send("quiet\n")


HOW = "killed by a signal, e.g. kill -9 or the out-of-memory killer, or crashed"


def _line(dead, size, note) -> str:
    """``dead``: the ranks whose connection had closed when the watcher
    woke; more than one when the launcher's kill of the others came first."""
    if len(dead) == 1:
        what = f"rank {dead[0]} of {size} died without a word ({HOW})"
    else:
        what = (f"one of ranks {', '.join(map(str, dead))} of {size} died without a word ({HOW}) and mpiexec "
                f"killed the others")
    return f"sprint: error: {what}; the job ended{note}\n"


def watch(job: dict, listener=None, err=2, accept_s: float = 60.0) -> int:
    """The watcher's loop: until every rank that connected is gone (or none
    came within ``accept_s``)."""
    if listener is None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(job["address"])
        listener.listen(job["size"])
    poll = select.poll()
    poll.register(listener, select.POLLIN)
    conns = {}                              # fd -> [socket, rank or None, pending bytes]
    note, quiet, said, accepted = job.get("note", ""), False, False, 0
    deadline = time.monotonic() + accept_s
    while conns or (listener is not None and time.monotonic() < deadline):
        timeout = None if listener is None else max(0.0, deadline - time.monotonic()) * 1e3
        events = poll.poll(timeout)
        dead = []
        for fd, _ in events:
            if listener is not None and fd == listener.fileno():
                c, _ = listener.accept()
                c.setblocking(False)
                conns[c.fileno()] = [c, None, b""]
                poll.register(c, select.POLLIN)
                continue
            entry = conns.get(fd)
            if entry is None:
                continue
            closed = False
            while True:                     # what it said before it closed comes first
                try:
                    chunk = entry[0].recv(65536)
                except BlockingIOError:
                    break
                except OSError:
                    chunk = b""
                if not chunk:
                    closed = True
                    break
                entry[2] += chunk
            *lines, entry[2] = entry[2].split(b"\n")
            for ln in lines:
                text = ln.decode("utf-8", "replace")
                if text.startswith("rank "):
                    entry[1] = int(text[5:])
                elif text == "quiet":
                    quiet = True
                elif text.startswith("saved "):
                    note = text[6:]
            if closed:
                dead.append(entry[1])
                poll.unregister(fd)
                entry[0].close()
                del conns[fd]
        dead = sorted(r for r in dead if r is not None)
        if dead and not said:
            said = True                     # only the first closing tells the ranks apart
            if not quiet:
                os.write(err, _line(dead, job["size"], note).encode())
        accepted += sum(1 for fd, _ in events if listener is not None and fd == listener.fileno())
        if listener is not None and (said or accepted >= job["size"]):     # no rank comes any more
            poll.unregister(listener)
            listener.close()
            listener = None
    return 0


if __name__ == "__main__":
    sys.exit(watch(json.loads(sys.argv[1])))
