"""Distributed training: SPRINT asynchronous SGD and synchronous allreduce SGD.

``run(cfg)`` is what ``engine.train.train`` calls when ``cfg.parallel`` is
``'asgd'`` or ``'sync'``; the pieces (``comm``, ``asgd``, ``sync``,
``timers``) are generic over flat parameter vectors.
"""
from __future__ import annotations


def run(cfg):
    from .runner import run as _run
    return _run(cfg)


__all__ = ["run"]
