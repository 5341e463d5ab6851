"""Train a TrainConfig (JSON argv[1]) and SIGKILL this process at the N-th
passage (argv[3]) of a write point (argv[2]) of engine.checkpoint.atomic_write:
'replace' (the temporary file is complete, the target not yet replaced) or
'fsync_dir' (the target replaced, the folder not yet synced). Exits 3 when the
point was never reached."""
import json
import os
import signal
import sys

from engine import checkpoint
from engine.session import TrainConfig
from engine.train import train

cfg, point, nth = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
seen = {"n": 0}


def _hit(real):
    def wrapper(*a, **kw):
        seen["n"] += 1
        if seen["n"] == nth:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*a, **kw)
    return wrapper


if point == "replace":
    checkpoint.os = type(sys)("os_with_kill")
    checkpoint.os.__dict__.update(os.__dict__)
    checkpoint.os.replace = _hit(os.replace)
else:
    checkpoint.fsync_dir = _hit(checkpoint.fsync_dir)
train(TrainConfig(**cfg))
sys.exit(3)
