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

A job across hosts: the ranks on other hosts than rank 0's reach the same
watcher over TCP (rank 0 shares its address, routed toward each host, and
a token the watcher wants before it counts a connection as a rank's). A
rank killed there closes its connection with a FIN that crosses the
network once; the launcher's kill of the others crosses it at least twice
(the dead rank's proxy tells mpiexec, mpiexec tells every proxy) and waits
for three processes to wake, so the first to close still names it. Before,
such a job had no watcher and ended on mpiexec's banner alone.

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


def start(rank: int, size: int, places, note: str = "", share=None) -> bool:
    """On every rank of a job, once ``places`` ((host, pid) of every rank) is
    known: rank 0 starts the watcher, every rank connects to it. A job across
    hosts needs ``share`` (every rank calls it at the same point; it returns
    rank 0's argument on every rank: a broadcast) to hand the ranks on other
    hosts the watcher's TCP address; without it that job gets none. False
    when this rank has no watcher."""
    hosts = {h for h, _ in places}
    if size <= 1 or not sys.platform.startswith("linux") or (len(hosts) > 1 and share is None):
        return False
    addr, here = _address(places), places[rank][0]
    job = {"size": size, "address": addr, "note": note}
    remote = None                           # (token, {host: (ip, port)}) for a job across hosts
    if rank == 0:
        tcp = _tcp_listener(places) if len(hosts) > 1 else None
        if tcp is not None:
            listener, remote = tcp
            job["token"], job["tcp_fd"] = remote[0], listener.fileno()
            if not _spawn(job, [listener.fileno()]):
                remote = None
            listener.close()                # the watcher holds it now
        elif len(hosts) == 1 and not _spawn(job, []):
            return False
    if len(hosts) > 1:
        remote = share(remote)              # collective: every rank, watcher or none
        if remote is None:
            return False
    sock = _connect(addr if here == places[0][0] else remote[1].get(here))
    if sock is None:
        return False
    try:
        sock.sendall(f"rank {rank}{'' if remote is None else ' ' + remote[0]}\n".encode())
    except OSError:
        sock.close()
        return False
    _state["sock"] = sock
    import atexit
    atexit.register(quiet)
    return True


def _spawn(job: dict, fds) -> bool:
    import subprocess
    try:
        subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__), json.dumps(job)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True,
                         pass_fds=fds)
    except OSError:
        return False
    return True


def _routed_from_here(host: str):
    """The address of this host on the route toward ``host`` (a UDP socket
    connected there sends nothing), or None when ``host`` does not resolve."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.connect((socket.gethostbyname(host), 9))
            return u.getsockname()[0]
    except OSError:
        return None


def _tcp_listener(places):
    """Rank 0 of a job across hosts: (listening TCP socket, (token, {host:
    (address, port)})) for the ranks on the other hosts, or None."""
    import secrets
    others = sorted({h for h, _ in places} - {places[0][0]})
    try:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("", 0))
        listener.listen(len(places))
    except OSError:
        return None
    port = listener.getsockname()[1]
    where = {h: (ip, port) for h in others if (ip := _routed_from_here(h)) is not None}
    return listener, (secrets.token_hex(16), where)


def _connect(addr):
    """A connection to the watcher at ``addr`` (an abstract Unix name, or
    (ip, port)), tried for CONNECT_S while it starts; None if none."""
    if addr is None:
        return None
    family = socket.AF_UNIX if isinstance(addr, str) else socket.AF_INET
    deadline = time.monotonic() + CONNECT_S
    while True:
        sock = socket.socket(family, socket.SOCK_STREAM)        # not inherited by children
        try:
            sock.connect(tuple(addr) if family == socket.AF_INET else addr)
            if family == socket.AF_INET:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)


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
    came within ``accept_s``). With ``job["token"]`` (a job across hosts) a
    connection counts as a rank's only once it said 'rank R TOKEN'."""
    listeners = []
    if listener is None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(job["address"])
        listener.listen(job["size"])
    listeners.append(listener)
    if job.get("tcp_fd") is not None:
        listeners.append(socket.socket(fileno=job["tcp_fd"]))
    token = job.get("token")
    poll = select.poll()
    for li in listeners:
        poll.register(li, select.POLLIN)
    conns = {}                              # fd -> [socket, rank or None, pending bytes]
    note, quiet, said, ranks = job.get("note", ""), False, False, 0
    deadline = time.monotonic() + accept_s
    while conns or (listeners and time.monotonic() < deadline):
        timeout = None if not listeners else max(0.0, deadline - time.monotonic()) * 1e3
        events = poll.poll(timeout)
        dead = []
        for fd, _ in events:
            li = next((li for li in listeners if li.fileno() == fd), None)
            if li is not None:
                try:
                    c, _ = li.accept()
                except OSError:
                    continue
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
                if entry[1] is None:        # its first line says whose it is
                    r, _, key = text[5:].partition(" ") if text.startswith("rank ") else ("", "", "")
                    if r.isdigit() and key == (token or ""):
                        entry[1], ranks = int(r), ranks + 1
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
        if listeners and (said or ranks >= job["size"]):     # no rank comes any more
            for li in listeners:
                poll.unregister(li)
                li.close()
            listeners = []
    return 0


if __name__ == "__main__":
    sys.exit(watch(json.loads(sys.argv[1])))
