"""Layer-wise parallel execution of a plan (engine.perf.layerwise.Plan).

Every layer runs on the ranks its configuration ``(n, c, h, w)`` names;
rank ``k < n*c*h*w`` computes the block ``unravel(k, (n, c, h, w))`` of the
layer's output: its samples, its output channels (the matching rows of W
and b), its rows and columns. Between layers each rank sends every other
rank the part of its block that rank's next layer reads (its samples,
all input channels, its rows plus the kernel's halo): one ``Alltoallv`` of
packed numpy buffers per layer boundary, which is an allgather for data ->
model parallel, an alltoall for model -> data parallel and a halo exchange
between two spatial splits. Backward runs the same exchange in reverse and
sums what arrives (partial input gradients of a channel split, halo
gradients). Who sends what to whom depends only on the plan, so every
route is computed once, here, not per step.

Storage: a rank holds only the parameter slices of the layers it runs (its
channel block of W and b), in one local flat vector with its gradient, so
the ordinary SGD (and its momentum) works on slices too. The slices are
ordered by the set of ranks that hold the same slice (its replicas), so the
replicas' gradient sum is one allreduce per replica group over a contiguous
bucket, as DDP fuses small gradients into buckets. ``whole`` assembles a
whole flat vector from the first holder of each slice; ``take`` sets the
slices from one (initial weights, a checkpoint of any plan).
"""
from __future__ import annotations

import math

import numpy as np

from engine import spec as spec_mod
from engine.perf import layerwise as L

# Every collective here is non-blocking and waited for in Python (waits.wait): a
# rank blocked in MPI's C wait for a peer that Ctrl-C stopped never sees its own.
from . import waits


def _mpi_comm(comm=None):
    if comm is not None:
        return getattr(comm, "comm", comm)      # an engine.parallel.comm.MPIComm or a raw mpi4py comm
    from mpi4py import MPI
    return MPI.COMM_WORLD


def _sl(lo, hi):
    return tuple(slice(int(a), int(b)) for a, b in zip(lo, hi))


class _Route:
    """The packed Alltoallv of one redistribution ``src`` blocks -> ``dst``
    regions, for one rank. The part a rank keeps (its own block inside its
    own region) is copied directly, not through MPI; a route where no rank
    sends to another (data parallel into data parallel) makes no call at all,
    and one where my region is exactly my block hands the array on uncopied."""

    def __init__(self, src, dst, rank, size):
        (slo, shi), (dlo, dhi), r = src, dst, rank
        self.sends, self.recvs, self.own = [], [], None     # (box within my block/region, offset, count)
        scount, rcount = np.zeros(size, np.int64), np.zeros(size, np.int64)
        for q in range(size):
            lo, hi = np.maximum(slo[r], dlo[q]), np.minimum(shi[r], dhi[q])
            if (hi > lo).all():
                if q == r:
                    self.own = (_sl(lo - slo[r], hi - slo[r]), _sl(lo - dlo[r], hi - dlo[r]))
                    continue
                scount[q] = np.prod(hi - lo)
                self.sends.append((_sl(lo - slo[r], hi - slo[r]), q))
            lo, hi = np.maximum(slo[q], dlo[r]), np.minimum(shi[q], dhi[r])
            if q != r and (hi > lo).all():
                rcount[q] = np.prod(hi - lo)
                self.recvs.append((_sl(lo - dlo[r], hi - dlo[r]), tuple(hi - lo), q))
        sdisp, rdisp = np.concatenate([[0], np.cumsum(scount)]), np.concatenate([[0], np.cumsum(rcount)])
        self.sends = [(box, int(sdisp[q]), int(scount[q])) for box, q in self.sends]
        self.recvs = [(box, shape, int(rdisp[q]), int(rcount[q])) for box, shape, q in self.recvs]
        self.s_spec = (scount.astype(np.int32), sdisp[:-1].astype(np.int32))
        self.r_spec = (rcount.astype(np.int32), rdisp[:-1].astype(np.int32))
        self.n_send, self.n_recv = int(sdisp[-1]), int(rdisp[-1])
        self.shape = tuple(dhi[r] - dlo[r]) if (dhi[r] > dlo[r]).all() else None
        self.identity = (self.shape is not None and not self.recvs and (slo[r] == dlo[r]).all()
                         and (shi[r] == dhi[r]).all())
        # every rank's view of every other: does anyone send anything to anyone else?
        self.silent = True
        for p in range(size):
            lo = np.maximum(slo[p][None], dlo)
            hi = np.minimum(shi[p][None], dhi)
            moves = (hi > lo).all(axis=1)
            moves[p] = False
            if moves.any():
                self.silent = False
                break


class LayerwiseExecutor:
    """One rank's part of a layer-wise plan (``step`` = forward, backward and
    the replicas' gradient allreduce; an SGD on ``params``/``grads`` follows).
    ``net`` gives the network and the initial weights; no reference to its
    whole vectors is kept."""

    def __init__(self, net, plan: L.Plan, comm=None):
        self.plan = plan
        self.comm = _mpi_comm(comm)
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        L.check_plan(plan, net.spec, ranks=self.size)
        self.spec, self.dtype, self.ops, self.n_params = net.spec, net.dtype, net.ops, net.n_params
        self.nodes = L.graph_nodes(net.spec)
        from engine import layers as _layers
        # layer objects of our own: spatial blocks run them unpadded
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
        # a block whose zero border is the same on both sides of each axis (no
        # spatial split) lets the convolution pad it; others get their halo and
        # border in the input and convolve unpadded
        self.conv_pads_itself = [False] * len(self.nodes)
        for i, v in enumerate(self.nodes):
            if v.kind == "conv" and self._active(i):
                before, after = self._pads(i)
                self.conv_pads_itself[i] = bool((before == after).all())
                self.layers[v.name].pad = (int(before[0]), int(before[1])) if self.conv_pads_itself[i] else 0
        n = len(self.nodes)
        self.fwd = [None] + [_Route(self.blocks[i - 1], self.needed[i], self.rank, self.size) for i in range(1, n)]
        self.bwd = [None] + [_Route(self.needed[i], self.blocks[i - 1], self.rank, self.size) for i in range(1, n)]
        self._layout(net.params)

    # ---- layout --------------------------------------------------------------
    def _active(self, i):
        return self.rank < math.prod(self.cfg[i])

    def _unclipped(self, v, cfg, in4):
        """Rows/columns a conv block reads before clipping to the image (its zero padding)."""
        if v.kind != "conv" or self.rank >= math.prod(cfg):
            return None
        lo, hi = L._blocks(cfg, (in4[0],) + tuple(v.out), self.size)
        p, pad = v.geom.pool, (v.geom.w_shape[2] - 1) // 2
        return lo[self.rank, 2:] * p - pad, hi[self.rank, 2:] * p + pad

    def _held(self, q):
        """The parameter slices rank ``q`` holds, in its local order:
        (replica ranks, layer, part, whole-vector lo, hi, slice shape).
        Grouped by replica set (first appearance), so each group is one
        contiguous bucket; the first rank of a set is the slice's owner."""
        offs = {(name, part): (off, shape) for name, part, shape, off in spec_mod.param_layout(self.spec)}
        out = []
        for v, cfg in zip(self.nodes, self.cfg):
            d = math.prod(cfg)
            if v.kind == "softmax" or q >= d:
                continue
            k = np.unravel_index(q, cfg)[1]
            members = tuple(p for p in range(d) if np.unravel_index(p, cfg)[1] == k)
            m = v.out[0] // cfg[1]
            for part in ("W", "b"):
                off, shape = offs[(v.name, part)]
                row = math.prod(shape[1:])
                out.append((members, v.name, part, off + k * m * row, off + (k + 1) * m * row,
                            (m,) + tuple(shape[1:])))
        first = {}
        for e in out:
            first.setdefault(e[0], len(first))
        return sorted(out, key=lambda e: first[e[0]])

    def _layout(self, whole):
        held = self._held(self.rank)
        self.params = np.zeros(sum(e[4] - e[3] for e in held), self.dtype)
        self.grads = np.zeros_like(self.params)
        self.w, self.gw, self._map = {}, {}, []
        buckets, at = {}, 0
        for members, name, part, lo, hi, shape in held:
            self._map.append((at, at + hi - lo, lo, hi))
            self.w[(name, part)] = self.params[at:at + hi - lo].reshape(shape)
            self.gw[(name, part)] = self.grads[at:at + hi - lo].reshape(shape)
            b = buckets.setdefault(members, [at, at])
            b[1] = at = at + hi - lo
        self.take(whole)
        # owners' pieces, in each rank's local order: what `whole` gathers from whom
        self._owned = [[(lo, hi) for members, _, _, lo, hi, _ in self._held(q) if members[0] == q]
                       for q in range(self.size)]
        self._mine = [(a, b) for (a, b, lo, hi), e in zip(self._map, held) if e[0][0] == self.rank]
        comms = self._replica_comms()
        self.buckets = [(comms[m], lo, hi) for m, (lo, hi) in buckets.items() if len(m) > 1]

    def _replica_comms(self):
        """One communicator per distinct replica set of size > 1 (collective:
        every rank walks the same layers in the same order)."""
        from mpi4py import MPI
        made = {}
        for cfg in self.cfg:
            d = math.prod(cfg)
            sets = [tuple(p for p in range(d) if np.unravel_index(p, cfg)[1] == k) for k in range(cfg[1])]
            new = [s for s in sets if len(s) > 1 and s not in made]
            if not new:
                continue
            mine = [j for j, s in enumerate(new) if self.rank in s]
            g = self.comm.Split(mine[0] if mine else MPI.UNDEFINED, self.rank)
            for j, s in enumerate(new):
                made[s] = g if mine and mine[0] == j else None
        return made

    # ---- whole vectors ---------------------------------------------------------
    def take(self, whole):
        """Set my slices from a whole flat vector (any plan's checkpoint)."""
        whole = np.asarray(whole)
        if whole.shape != (self.n_params,):
            raise ValueError(f"expected a whole vector of {self.n_params} values, got shape {whole.shape}")
        for a, b, lo, hi in self._map:
            self.params[a:b] = whole[lo:hi]

    def take_into(self, local, whole):
        """Like ``take`` for another local vector of my layout (the optimizer's velocity)."""
        for a, b, lo, hi in self._map:
            local[a:b] = whole[lo:hi]

    def whole(self, local, root=None):
        """The whole flat vector of a local one (``params``, ``grads``, the
        velocity) from the owners of each slice: on every rank (root None)
        or on ``root`` only (None elsewhere)."""
        send = np.concatenate([local[a:b] for a, b in self._mine]) if self._mine else local[:0].copy()
        counts = np.array([sum(hi - lo for lo, hi in o) for o in self._owned], np.int32)
        disp = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)
        packed = np.empty(int(counts.sum()), local.dtype) if root in (None, self.rank) else None
        if root is None:
            waits.wait(self.comm.Iallgatherv(send, [packed, (counts, disp)]))
        else:
            waits.wait(self.comm.Igatherv(send, [packed, (counts, disp)] if packed is not None else None, root=root))
            if packed is None:
                return None
        out = np.empty(self.n_params, local.dtype)
        at = 0
        for pieces in self._owned:
            for lo, hi in pieces:
                out[lo:hi] = packed[at:at + hi - lo]
                at += hi - lo
        return out

    # ---- redistribution ------------------------------------------------------
    def _exchange(self, data, route: _Route, accumulate=False):
        """Send each rank the part of my block its region holds; return my
        region (summing overlaps when ``accumulate``), None when I have none."""
        if not route.silent:
            send = np.empty(route.n_send, self.dtype)
            for box, at, n in route.sends:
                send[at:at + n] = data[box].ravel()
            recv = np.empty(route.n_recv, self.dtype)
            waits.wait(self.comm.Ialltoallv([send, route.s_spec], [recv, route.r_spec]))
        if route.shape is None:
            return None
        if route.identity:
            return data
        # forward: the producers' blocks tile my region exactly; backward: halos overlap and add
        out = np.zeros(route.shape, self.dtype) if accumulate else np.empty(route.shape, self.dtype)
        if route.own is not None:
            out[route.own[1]] = data[route.own[0]]
        for box, shape, at, n in route.recvs:
            if accumulate:
                out[box] += recv[at:at + n].reshape(shape)
            else:
                out[box] = recv[at:at + n].reshape(shape)
        return out

    # ---- one layer on my block -------------------------------------------------
    def _pads(self, i):
        lo_u, hi_u = self.unclipped[i]
        nlo, nhi = self.needed[i][0][self.rank, 2:], self.needed[i][1][self.rank, 2:]
        return nlo - lo_u, hi_u - nhi        # zero rows/cols before and after, per side

    def _forward(self, i, x, train):
        v = self.nodes[i]
        lay = self.layers[v.name]
        w, b = self.w[(v.name, "W")], self.w[(v.name, "b")]
        if v.kind == "conv":
            if not self.conv_pads_itself[i]:
                before, after = self._pads(i)
                x = np.pad(x, ((0, 0), (0, 0), (before[0], after[0]), (before[1], after[1])))
            return lay.forward(np.ascontiguousarray(x), w, b, train)
        y = lay.forward(np.ascontiguousarray(x), w, b, train)
        return y.reshape(y.shape + (1, 1))

    def _backward(self, i, dy):
        v = self.nodes[i]
        lay = self.layers[v.name]
        gw, gb = self.gw[(v.name, "W")], self.gw[(v.name, "b")]
        if v.kind == "fc":
            dy = dy.reshape(dy.shape[:2])
        dx = lay.backward(np.ascontiguousarray(dy), gw, gb, need_dx=i > 0)
        if dx is None or v.kind != "conv" or self.conv_pads_itself[i]:
            return dx
        before, after = self._pads(i)
        H, W = dx.shape[2:]
        return dx[:, :, before[0]:H - after[0], before[1]:W - after[1]]

    # ---- a training step ---------------------------------------------------------
    def step(self, x, y):
        """Forward and backward of the global batch ``x`` (every rank passes
        the same batch); my gradient slices, summed over their replicas, land
        in ``grads``. Returns (mean loss, number right) over the batch."""
        B = self.plan.batch
        if len(x) != B:
            raise ValueError(f"the plan is for batch {B}, got a batch of {len(x)}")
        x = np.asarray(x, self.dtype)
        y = np.asarray(y)
        self.grads[...] = 0
        n = len(self.nodes)
        lo, hi = self.needed[0][0][self.rank], self.needed[0][1][self.rank]
        h = x[_sl(lo, hi)] if self._active(0) else None
        outs = []
        for i in range(n - 1):
            if i > 0:
                h = self._exchange(outs[-1], self.fwd[i])
            outs.append(self._forward(i, h, True) if self._active(i) else None)
        logits = self._exchange(outs[-1], self.fwd[n - 1])
        loss_sum, right, d = 0.0, 0, None
        if self._active(n - 1):
            s0, s1 = self.needed[n - 1][0][self.rank, 0], self.needed[n - 1][1][self.rank, 0]
            lg = np.ascontiguousarray(logits.reshape(logits.shape[:2]))
            ys = y[s0:s1]
            loss, dl, _ = self.ops.softmax_xent(lg, ys)
            loss_sum = float(loss) * len(ys)
            right = int((lg.argmax(axis=1) == ys).sum())
            d = (dl * (len(ys) / B)).reshape(dl.shape + (1, 1))    # gradient of the global mean
        for i in range(n - 1, 0, -1):
            g = self._exchange(d, self.bwd[i], accumulate=True)
            d = self._backward(i - 1, g) if self._active(i - 1) else None
        for grp, a, b in self.buckets:
            waits.wait(grp.Iallreduce(_in_place(), self.grads[a:b]))
        tot = np.array([loss_sum, right], np.float64)
        waits.wait(self.comm.Iallreduce(_in_place(), tot))
        return float(tot[0]) / B, int(round(tot[1]))


def _in_place():
    from mpi4py import MPI
    return MPI.IN_PLACE
