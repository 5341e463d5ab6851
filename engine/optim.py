"""SGD with momentum and weight decay on the flat parameter vector.

SPEC's update value is ``-eta * grad`` with weight decay folded into grad;
one ``ops.sgd_update`` call does  v = nu*v - eta*(g + wd*w);  w += v  over
the whole vector.  Learning-rate schedules are small picklable callables
``lr(epoch_float)`` that describe themselves as a dict, so a checkpoint can
hold them and a resumed run recreates the same curve.
"""
from __future__ import annotations

import math


class Schedule:
    """A learning rate as a function of the (fractional) epoch, ``lr(epoch)``."""
    kind = "?"

    def __call__(self, epoch: float) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def to_dict(self) -> dict:
        d = {k: (v.to_dict() if isinstance(v, Schedule) else v) for k, v in vars(self).items()}
        d["kind"] = self.kind
        return d

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{self.kind}({args})"


class constant(Schedule):
    """The same lr at every epoch."""
    kind = "constant"

    def __init__(self, lr):
        self.lr = _positive("lr", lr)

    def __call__(self, epoch):
        return self.lr


class step(Schedule):
    """lr * gamma ** (number of milestones passed); ``every`` gives evenly spaced ones."""
    kind = "step"

    def __init__(self, lr, every=None, gamma=0.1, milestones=None):
        self.lr = _positive("lr", lr)
        if (every is None) == (milestones is None):
            raise ValueError("step schedule needs exactly one of every= or milestones=")
        if every is not None and every <= 0:
            raise ValueError(f"every must be > 0, got {every}")
        self.every = every
        self.milestones = sorted(float(m) for m in milestones) if milestones is not None else None
        self.gamma = float(gamma)

    def __call__(self, epoch):
        if self.every is not None:
            n = int(math.floor(epoch / self.every + 1e-9))
        else:
            n = sum(epoch >= m for m in self.milestones)
        return self.lr * self.gamma ** n


class cosine(Schedule):
    """Half cosine from lr at epoch 0 to final_lr at ``epochs``."""
    kind = "cosine"

    def __init__(self, lr, epochs, final_lr=0.0):
        self.lr = _positive("lr", lr)
        if epochs <= 0:
            raise ValueError(f"epochs must be > 0, got {epochs}")
        self.epochs = float(epochs)
        self.final_lr = float(final_lr)

    def __call__(self, epoch):
        t = min(max(epoch / self.epochs, 0.0), 1.0)
        return self.final_lr + 0.5 * (self.lr - self.final_lr) * (1.0 + math.cos(math.pi * t))


class warmup(Schedule):
    """``after`` scaled by a linear ramp from start_factor to 1 over the first
    ``epochs`` (a ramp, not a jump to after(epochs), so it also works when the
    warm-up is as long as the whole run)."""
    kind = "warmup"

    def __init__(self, after, epochs, start_factor=0.0):
        if not callable(after):
            raise TypeError("after must be a schedule")
        if epochs < 0:
            raise ValueError(f"epochs must be >= 0, got {epochs}")
        self.after = after
        self.epochs = float(epochs)
        self.start_factor = float(start_factor)

    def __call__(self, epoch):
        if self.epochs <= 0 or epoch >= self.epochs:
            return self.after(epoch)
        t = epoch / self.epochs
        return self.after(epoch) * (self.start_factor + (1.0 - self.start_factor) * t)


_KINDS = {c.kind: c for c in (constant, step, cosine, warmup)}


def schedule_from_dict(d: dict) -> Schedule:
    """The schedule that ``Schedule.to_dict`` described (checkpoints hold these)."""
    d = dict(d)
    kind = d.pop("kind", None)
    if kind not in _KINDS:
        raise ValueError(f"unknown schedule kind {kind!r}; known: {sorted(_KINDS)}")
    if kind == "warmup":
        d["after"] = schedule_from_dict(d["after"])
    return _KINDS[kind](**d)


def make_schedule(name: str, lr: float, epochs: float, warmup_epochs: float = 0.0,
                  gamma: float = 0.1, step_every=None) -> Schedule:
    """The schedule a TrainConfig names: constant | step | cosine, optionally warmed up."""
    if name == "constant":
        s = constant(lr)
    elif name == "step":
        s = step(lr, every=step_every or max(1.0, epochs / 3.0), gamma=gamma)
    elif name == "cosine":
        s = cosine(lr, epochs)
    else:
        raise ValueError(f"schedule must be constant, step or cosine, got {name!r}")
    return warmup(s, warmup_epochs) if warmup_epochs > 0 else s


def _positive(name, v):
    v = float(v)
    if not v > 0:
        raise ValueError(f"{name} must be > 0, got {v}")
    return v


class SGD:
    """Momentum SGD on a flat vector: ``v = momentum*v - lr*(g + weight_decay*w); w += v``.

    ``SGD(net, lr=...)`` takes the net's ``params``/``grads``;
    ``SGD(params, grads, lr=...)`` works on any pair of equal flat vectors.
    ``schedule`` is a callable ``lr(epoch)`` (``make_schedule``, ``cosine``,
    ...) that overrides ``lr``; ``step(epoch)`` uses it at that (fractional) epoch.
    """

    def __init__(self, net_or_params, grads=None, lr=0.01, momentum=0.9, weight_decay=0.0,
                 schedule=None, ops=None):
        if hasattr(net_or_params, "params") and hasattr(net_or_params, "grads"):
            if grads is not None:
                raise TypeError("grads must be omitted when a Net is given")
            params, grads = net_or_params.params, net_or_params.grads
        else:
            params = net_or_params
        if grads is None:
            raise TypeError("grads is required with a bare parameter vector")
        if params.shape != grads.shape or params.ndim != 1:
            raise ValueError(f"params and grads must be equal flat vectors, got {params.shape} and {grads.shape}")
        if not 0 <= momentum < 1:       # 1 and above: the velocity never decays, the run diverges
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        if not 0 <= weight_decay < math.inf:
            raise ValueError(f"weight_decay must be finite and >= 0, got {weight_decay}")
        if schedule is not None and not callable(schedule):
            raise TypeError("schedule must be callable lr(epoch)")
        self.params, self.grads = params, grads
        self.lr = _positive("lr", lr)
        self.momentum = float(momentum)
        self.weight_decay = float(weight_decay)
        self.schedule = schedule
        if ops is None:
            from engine import ops
        self.ops = ops
        self.velocity = params.copy()
        self.velocity[...] = 0
        self.steps = 0
        self.epoch = 0.0

    def lr_at(self, epoch=None) -> float:
        """The learning rate at ``epoch`` (default: the last epoch given to ``step``)."""
        e = self.epoch if epoch is None else epoch
        return float(self.schedule(e)) if self.schedule is not None else self.lr

    def step(self, epoch=None):
        """Apply one update from the current ``grads``; returns the learning rate used."""
        if epoch is not None:
            self.epoch = float(epoch)
        lr = self.lr_at()
        self.ops.sgd_update(self.params, self.velocity, self.grads, lr, self.momentum,
                            self.weight_decay)
        self.steps += 1
        return lr

    def state_dict(self) -> dict:
        """Velocity (host copy), step count, epoch, hyper-parameters and schedule."""
        from engine import backend
        return {"velocity": backend.to_host(self.velocity).copy(), "steps": self.steps,
                "epoch": self.epoch, "lr": self.lr, "momentum": self.momentum,
                "weight_decay": self.weight_decay,
                "schedule": self.schedule.to_dict() if isinstance(self.schedule, Schedule) else None}

    def load_state_dict(self, state: dict):
        """Restore what ``state_dict`` returned (a resumed run continues exactly)."""
        v = state["velocity"]
        if tuple(v.shape) != tuple(self.velocity.shape):
            raise ValueError(f"velocity shape {tuple(v.shape)} does not match {tuple(self.velocity.shape)}")
        self.velocity[...] = _like(self.velocity, v)
        self.steps = int(state["steps"])
        self.epoch = float(state["epoch"])
        self.lr = float(state["lr"])
        self.momentum = float(state["momentum"])
        self.weight_decay = float(state["weight_decay"])
        if state.get("schedule"):
            self.schedule = schedule_from_dict(state["schedule"])


    def __repr__(self):
        sched = f", schedule={self.schedule!r}" if self.schedule is not None else ""
        return (f"SGD(lr={self.lr:g}, momentum={self.momentum:g}, weight_decay={self.weight_decay:g}"
                f"{sched}, n={self.params.shape[0]:,}, steps={self.steps})")


def _like(ref, v):
    from engine import backend
    return backend.get_backend().xp.asarray(v, dtype=ref.dtype)
