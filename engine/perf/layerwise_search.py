"""Optimal per-layer configurations on a computation DAG (OptCNN's search).

The problem: every node ``v`` picks one of its configurations ``x_v``; the
cost of a choice is ``sum_v node[v][x_v] + sum_(u,w) edge[u,w][x_u, x_w]``
(compute + sync on the nodes, redistribution on the edges). The search
returns the cheapest choice, exactly.

1. Edge elimination: parallel edges between the same two nodes are one edge
   whose matrix is their sum.
2. Node elimination: a node with one producer ``u`` and one consumer ``w``
   becomes the edge ``u -> w`` with ``M[a, c] = min_b E1[a, b] + t[b] + E2[b, c]``
   (its best ``b`` kept for every ``(a, c)``). Both steps keep the optimum:
   the eliminated node's choice only ever depends on its two neighbours.
3. What is left (two nodes for a chain or a series-parallel block; more for
   other graphs) is solved by dynamic programming over its variables
   (min-sum variable elimination, the lowest-degree variable first), then
   the eliminated nodes are filled back in the reverse order.

Nothing here knows about layers: tests drive it with random costs and
compare with brute force; engine.perf.layerwise supplies real ones.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

MAX_FACTOR = 50_000_000     # table entries the final DP may build before giving up


@dataclass
class CostGraph:
    """``nodes``: name -> cost vector (one entry per configuration);
    ``edges``: list of (producer, consumer, matrix[len(producer), len(consumer)])."""
    nodes: dict
    edges: list = field(default_factory=list)

    def add_edge(self, u, w, matrix):
        m = np.asarray(matrix, float)
        if m.shape != (len(self.nodes[u]), len(self.nodes[w])):
            raise ValueError(f"edge {u}->{w}: matrix {m.shape} does not match the nodes' "
                             f"{len(self.nodes[u])} x {len(self.nodes[w])} configurations")
        self.edges.append((u, w, m))

    def cost(self, choice: dict) -> float:
        """Total cost of one choice {node: configuration index}."""
        return float(sum(self.nodes[v][choice[v]] for v in self.nodes)
                     + sum(m[choice[u], choice[w]] for u, w, m in self.edges))


@dataclass
class SearchResult:
    cost: float
    choice: dict                 # node -> configuration index
    eliminated_nodes: int
    eliminated_edges: int
    remaining: int               # nodes left for the DP


def _merge_parallel(edges):
    merged, count = {}, 0
    for u, w, m in edges:
        if (u, w) in merged:
            merged[(u, w)] = merged[(u, w)] + m
            count += 1
        else:
            merged[(u, w)] = m
    return merged, count


def search(graph: CostGraph) -> SearchResult:
    nodes = {v: np.asarray(c, float) for v, c in graph.nodes.items()}
    for v, c in nodes.items():
        if c.ndim != 1 or len(c) == 0:
            raise ValueError(f"node {v!r} needs a non-empty cost vector")
    edges, n_edge = _merge_parallel(graph.edges)
    trail, n_node = [], 0
    while True:
        ins, outs = {v: [] for v in nodes}, {v: [] for v in nodes}
        for (u, w) in edges:
            outs[u].append(w)
            ins[w].append(u)
        v = next((v for v in nodes if len(ins[v]) == 1 and len(outs[v]) == 1 and ins[v][0] != outs[v][0]), None)
        if v is None:
            break
        u, w = ins[v][0], outs[v][0]
        # (a, b, c): producer a, eliminated b, consumer c
        tot = edges.pop((u, v))[:, :, None] + nodes.pop(v)[None, :, None] + edges.pop((v, w))[None, :, :]
        arg = tot.argmin(axis=1)
        new = np.take_along_axis(tot, arg[:, None, :], axis=1)[:, 0, :]
        trail.append((v, u, w, arg))
        n_node += 1
        if (u, w) in edges:
            edges[(u, w)] = edges[(u, w)] + new
            n_edge += 1
        else:
            edges[(u, w)] = new
    cost, choice = _dp(nodes, edges)
    for v, u, w, arg in reversed(trail):
        choice[v] = int(arg[choice[u], choice[w]])
    return SearchResult(cost, choice, n_node, n_edge, len(nodes))


def _dp(nodes, edges):
    """Exact min-sum over the remaining graph by variable elimination."""
    factors = [((v,), c) for v, c in nodes.items()] + [((u, w), m) for (u, w), m in edges.items()]
    order_trail = []
    remaining = set(nodes)
    while remaining:
        nbrs = {v: set() for v in remaining}
        for vs, _ in factors:
            for a in vs:
                nbrs[a].update(b for b in vs if b != a)
        v = min(remaining, key=lambda x: (len(nbrs[x]), str(x)))
        scope = [v] + sorted(nbrs[v], key=str)
        size = int(np.prod([len(nodes[x]) for x in scope]))
        if size > MAX_FACTOR:
            raise ValueError(f"the graph left after elimination is too entangled for the DP "
                             f"({size:,} table entries at node {v!r})")
        total = np.zeros([len(nodes[x]) for x in scope])
        keep = []
        for vs, f in factors:
            if v not in vs:
                keep.append((vs, f))
                continue
            # put f's axes in scope order, broadcast over the rest
            perm = sorted(range(len(vs)), key=lambda i: scope.index(vs[i]))
            f = np.transpose(f, perm)
            shape = [len(nodes[x]) if x in vs else 1 for x in scope]
            total = total + f.reshape(shape)
        arg = total.argmin(axis=0)
        keep.append((tuple(scope[1:]), total.min(axis=0)))
        order_trail.append((v, tuple(scope[1:]), arg))
        factors = keep
        remaining.discard(v)
    cost = float(sum(np.asarray(f).sum() for vs, f in factors if not vs))
    choice = {}
    for v, scope, arg in reversed(order_trail):
        choice[v] = int(arg[tuple(choice[x] for x in scope)])
    return cost, choice


def brute_force(graph: CostGraph):
    """(cost, choice) by trying every combination: the reference for tests."""
    names = list(graph.nodes)
    best = (np.inf, None)
    for combo in itertools.product(*(range(len(graph.nodes[v])) for v in names)):
        ch = dict(zip(names, combo))
        c = graph.cost(ch)
        if c < best[0]:
            best = (c, ch)
    return best
