"""Layer-wise parallel execution of a plan (engine.perf.layerwise.Plan).

Every layer runs on the ranks its configuration ``(n, c, h, w)`` names;
rank ``k < n*c*h*w`` computes the block ``unravel(k, (n, c, h, w))`` of the
layer's output: its samples, its output channels (the matching rows of W
and b), its rows and columns. Between layers each rank sends every other
rank the part of its block that rank's next layer reads (its samples,
all input channels, its rows plus the kernel's halo): one alltoall per
layer boundary, which is an allgather for data -> model parallel, an
alltoall for model -> data parallel and a halo exchange between two
spatial splits. Backward runs the same exchange in reverse and sums what
arrives (partial input gradients of a channel split, halo gradients).
The replicas of a parameter slice (same channel block) allreduce its
gradient; then the ordinary SGD steps.

Storage: each rank keeps the full-size flat vectors of the net as the
backing store of its slices (one optimizer, one checkpoint format); only
the slices it owns are computed, communicated and kept current, and
``gather_params`` assembles the whole vector from their owners.
"""
from __future__ import annotations

import math

import numpy as np

from engine import spec as spec_mod
from engine.perf import layerwise as L


def _mpi_comm(comm=None):
    if comm is not None:
        return getattr(comm, "comm", comm)      # an engine.parallel.comm.MPIComm or a raw mpi4py comm
    from mpi4py import MPI
    return MPI.COMM_WORLD


def _sl(lo, hi):
    return tuple(slice(int(a), int(b)) for a, b in zip(lo, hi))


class LayerwiseExecutor:
    """One rank's part of a layer-wise plan over a Net (``step`` = forward,
    backward and the replicas' gradient allreduce; ``opt.step`` follows)."""

    def __init__(self, net, plan: L.Plan, comm=None):
        self.net, self.plan = net, plan
        self.comm = _mpi_comm(comm)
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        L.check_plan(plan, net.spec, ranks=self.size)
        self.nodes = L.graph_nodes(net.spec)
        from engine import layers as _layers
        # layer objects of our own: spatial blocks run them unpadded, net.forward keeps its own
        self.layers = {lay.name: lay for lay in _layers.build(net.geoms, net.ops)}
        B, sp = plan.batch, net.spec
        self.cfg = [plan.layers[v.name] for v in self.nodes]
        # per node: block of its output each rank owns, region of its input each rank reads
        self.blocks, self.needed, self.unclipped = [], [], []
        in4 = (B, sp.m0, sp.x0, sp.x0)
        for v, cfg in zip(self.nodes, self.cfg):
            self.blocks.append(L._blocks(cfg, (B,) + tuple(v.out), self.size))
            self.needed.append(L._needed(v, cfg, in4, self.size))
            self.unclipped.append(self._unclipped(v, cfg, in4))
            in4 = (B,) + tuple(v.out)
        self.groups = [self._replica_group(v, cfg) for v, cfg in zip(self.nodes, self.cfg)]

    # ---- layout --------------------------------------------------------------
    def _active(self, i):
        return self.rank < math.prod(self.cfg[i])

    def _idx(self, i):
        return np.unravel_index(self.rank, self.cfg[i])

    def _unclipped(self, v, cfg, in4):
        """Rows/columns a conv block reads before clipping to the image (its zero padding)."""
        if v.kind != "conv" or self.rank >= math.prod(cfg):
            return None
        lo, hi = L._blocks(cfg, (in4[0],) + tuple(v.out), self.size)
        p, pad = v.geom.pool, (v.geom.w_shape[2] - 1) // 2
        return lo[self.rank, 2:] * p - pad, hi[self.rank, 2:] * p + pad

    def _channels(self, i):
        v, (_, c, _, _) = self.nodes[i], self.cfg[i]
        m = v.out[0] // c
        k = int(self._idx(i)[1])
        return k * m, (k + 1) * m

    def _replica_group(self, v, cfg):
        """Sub-communicator of the ranks holding the same parameter slice (None: alone)."""
        if v.kind == "softmax":
            return None
        from mpi4py import MPI
        d = math.prod(cfg)
        color = int(np.unravel_index(self.rank, cfg)[1]) if self.rank < d else MPI.UNDEFINED
        g = self.comm.Split(color, self.rank)
        if g == MPI.COMM_NULL:
            return None
        if g.Get_size() == 1:
            g.Free()
            return None
        return g

    # ---- redistribution ------------------------------------------------------
    def _exchange(self, data, src, dst, accumulate=False):
        """Send each rank the part of my ``src`` block its ``dst`` region
        holds; return my ``dst`` region (summing overlaps when ``accumulate``)."""
        (slo, shi), (dlo, dhi), r = src, dst, self.rank
        send = [None] * self.size
        if data is not None:
            for q in range(self.size):
                lo, hi = np.maximum(slo[r], dlo[q]), np.minimum(shi[r], dhi[q])
                if (hi > lo).all():
                    send[q] = np.ascontiguousarray(data[_sl(lo - slo[r], hi - slo[r])])
        recv = self.comm.alltoall(send)
        if not (dhi[r] > dlo[r]).all():
            return None
        out = np.zeros(tuple(dhi[r] - dlo[r]), self.net.dtype)
        for p, piece in enumerate(recv):
            if piece is None:
                continue
            lo, hi = np.maximum(slo[p], dlo[r]), np.minimum(shi[p], dhi[r])
            region = _sl(lo - dlo[r], hi - dlo[r])
            if accumulate:
                out[region] += piece
            else:
                out[region] = piece
        return out

    # ---- one layer on my block -------------------------------------------------
    def _pads(self, i):
        lo_u, hi_u = self.unclipped[i]
        nlo, nhi = self.needed[i][0][self.rank, 2:], self.needed[i][1][self.rank, 2:]
        return nlo - lo_u, hi_u - nhi        # zero rows/cols before and after, per side

    def _forward(self, i, x, train):
        v = self.nodes[i]
        lay = self.layers[v.name]
        c0, c1 = self._channels(i)
        w, b = self.net.views[(v.name, "W")][c0:c1], self.net.views[(v.name, "b")][c0:c1]
        if v.kind == "conv":
            before, after = self._pads(i)
            x = np.pad(x, ((0, 0), (0, 0), (before[0], after[0]), (before[1], after[1])))
            lay.pad = 0                      # the halo and the image border are in x already
            return lay.forward(np.ascontiguousarray(x), w, b, train)
        y = lay.forward(np.ascontiguousarray(x), w, b, train)
        return y.reshape(y.shape + (1, 1))

    def _backward(self, i, dy):
        v = self.nodes[i]
        lay = self.layers[v.name]
        c0, c1 = self._channels(i)
        gw, gb = self.net.grad_views[(v.name, "W")][c0:c1], self.net.grad_views[(v.name, "b")][c0:c1]
        if v.kind == "fc":
            dy = dy.reshape(dy.shape[:2])
        dx = lay.backward(np.ascontiguousarray(dy), gw, gb, need_dx=i > 0)
        if dx is None or v.kind != "conv":
            return dx
        before, after = self._pads(i)
        H, W = dx.shape[2:]
        return dx[:, :, before[0]:H - after[0], before[1]:W - after[1]]

    # ---- a training step ---------------------------------------------------------
    def step(self, x, y):
        """Forward and backward of the global batch ``x`` (every rank passes
        the same batch); the owned gradient slices, summed over replicas, land
        in ``net.grads``. Returns (mean loss, number right) over the batch."""
        net, B = self.net, self.plan.batch
        if len(x) != B:
            raise ValueError(f"the plan is for batch {B}, got a batch of {len(x)}")
        x = np.asarray(x, net.dtype)
        y = np.asarray(y)
        net.grads[...] = 0
        n = len(self.nodes)
        lo, hi = self.needed[0][0][self.rank], self.needed[0][1][self.rank]
        h = x[_sl(lo, hi)] if self._active(0) else None
        outs = []
        for i in range(n - 1):
            if i > 0:
                h = self._exchange(outs[-1], self.blocks[i - 1], self.needed[i])
            outs.append(self._forward(i, h, True) if self._active(i) else None)
        logits = self._exchange(outs[-1], self.blocks[n - 2], self.needed[n - 1])
        loss_sum, right, d = 0.0, 0, None
        if self._active(n - 1):
            s0, s1 = self.needed[n - 1][0][self.rank, 0], self.needed[n - 1][1][self.rank, 0]
            lg = np.ascontiguousarray(logits.reshape(logits.shape[:2]))
            ys = y[s0:s1]
            loss, dl, _ = net.ops.softmax_xent(lg, ys)
            loss_sum = float(loss) * len(ys)
            right = int((lg.argmax(axis=1) == ys).sum())
            d = (dl * (len(ys) / B)).reshape(dl.shape + (1, 1))    # gradient of the global mean
        for i in range(n - 1, 0, -1):
            g = self._exchange(d, self.needed[i], self.blocks[i - 1], accumulate=True)
            d = self._backward(i - 1, g) if self._active(i - 1) else None
        for i, grp in enumerate(self.groups):
            if grp is not None:
                c0, c1 = self._channels(i)
                name = self.nodes[i].name
                for part in ("W", "b"):
                    grp.Allreduce(_in_place(), net.grad_views[(name, part)][c0:c1])
        tot = np.array([loss_sum, right], np.float64)
        self.comm.Allreduce(_in_place(), tot)
        return float(tot[0]) / B, int(round(tot[1]))

    # ---- whole vectors ------------------------------------------------------------
    def _owned(self, vec_views):
        """(layer, c0, c1, W rows, b rows) of the slices this rank is the first holder of."""
        out = []
        for i, v in enumerate(self.nodes):
            if v.kind == "softmax" or not self._active(i):
                continue
            idx = self._idx(i)
            if idx[0] == idx[2] == idx[3] == 0:
                c0, c1 = self._channels(i)
                out.append((v.name, c0, c1, np.array(vec_views[(v.name, "W")][c0:c1]),
                            np.array(vec_views[(v.name, "b")][c0:c1])))
        return out

    def _assemble(self, views, into):
        for pieces in self.comm.allgather(self._owned(views)):
            for name, c0, c1, w, b in pieces:
                into[(name, "W")][c0:c1] = w
                into[(name, "b")][c0:c1] = b

    def _views(self, flat):
        return {(name, part): flat[off:off + math.prod(shape)].reshape(shape)
                for name, part, shape, off in spec_mod.param_layout(self.net.spec)}

    def sync_vector(self, flat):
        """Make a whole flat vector (parameters, velocity) current on every
        rank from the owners of each slice, in place."""
        v = self._views(flat)
        self._assemble(v, v)

    def gather_params(self):
        """Make every rank's whole parameter vector current (from the owners)."""
        self.sync_vector(self.net.params)

    def gather_grads(self) -> np.ndarray:
        """The whole gradient vector of the last step (a copy, on every rank)."""
        full = np.zeros_like(self.net.grads)
        self._assemble(self.net.grad_views, self._views(full))
        return full


def _in_place():
    from mpi4py import MPI
    return MPI.IN_PLACE
