"""The layer-wise search equals brute force on every graph small enough to
enumerate: chains, diamonds, an inception-like block and a graph that is not
series-parallel (so the final DP does real work), all with random costs."""
import numpy as np
import pytest

from engine.perf.layerwise_search import CostGraph, brute_force, search


def _graph(rng, sizes, edges, scale=10.0):
    g = CostGraph({v: rng.random(k) * scale for v, k in sizes.items()})
    for u, w in edges:
        g.add_edge(u, w, rng.random((sizes[u], sizes[w])) * scale)
    return g


def _check(g):
    res = search(g)
    ref_cost, ref_choice = brute_force(g)
    assert res.cost == pytest.approx(ref_cost, rel=1e-12, abs=1e-12)
    # the configuration it returns really costs what it claims
    assert g.cost(res.choice) == pytest.approx(res.cost, rel=1e-12, abs=1e-12)
    assert set(res.choice) == set(g.nodes)
    return res


@pytest.mark.parametrize("seed", range(6))
def test_chain(seed):
    rng = np.random.default_rng(seed)
    n = 2 + seed % 4
    sizes = {f"l{i}": int(rng.integers(1, 5)) for i in range(n)}
    res = _check(_graph(rng, sizes, [(f"l{i}", f"l{i + 1}") for i in range(n - 1)]))
    assert res.remaining == min(n, 2)          # a chain reduces to its two ends


@pytest.mark.parametrize("seed", range(6))
def test_diamond(seed):
    rng = np.random.default_rng(100 + seed)
    sizes = {v: int(rng.integers(2, 5)) for v in "abcd"}
    res = _check(_graph(rng, sizes, [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")]))
    assert res.eliminated_nodes == 2 and res.eliminated_edges >= 1 and res.remaining == 2


@pytest.mark.parametrize("seed", range(4))
def test_inception_block(seed):
    # stem -> {1x1, 1x1->3x3, 1x1->5x5, pool->1x1, direct} -> concat -> head
    rng = np.random.default_rng(200 + seed)
    names = ["stem", "b1", "b2a", "b2b", "b3a", "b3b", "b4a", "b4b", "cat", "head"]
    sizes = {v: int(rng.integers(2, 4)) for v in names}
    edges = [("stem", "b1"), ("b1", "cat"), ("stem", "b2a"), ("b2a", "b2b"), ("b2b", "cat"),
             ("stem", "b3a"), ("b3a", "b3b"), ("b3b", "cat"), ("stem", "b4a"), ("b4a", "b4b"),
             ("b4b", "cat"), ("stem", "cat"), ("cat", "head")]
    res = _check(_graph(rng, sizes, edges))
    assert res.remaining == 2


@pytest.mark.parametrize("seed", range(4))
def test_not_series_parallel(seed):
    # a->b, a->c, b->c, b->d, c->d: no node has one producer and one consumer
    rng = np.random.default_rng(300 + seed)
    sizes = {v: int(rng.integers(2, 5)) for v in "abcd"}
    res = _check(_graph(rng, sizes, [("a", "b"), ("a", "c"), ("b", "c"), ("b", "d"), ("c", "d")]))
    assert res.eliminated_nodes == 0 and res.remaining == 4


def test_elimination_keeps_the_optimum_with_ties_and_single_configs():
    rng = np.random.default_rng(7)
    sizes = {"a": 1, "b": 3, "c": 1, "d": 2}
    g = _graph(rng, sizes, [("a", "b"), ("b", "c"), ("c", "d")])
    g.nodes["b"][:] = 1.0                       # ties everywhere in b
    _check(g)


def test_single_node_and_bad_matrix():
    g = CostGraph({"x": np.array([3.0, 1.0, 2.0])})
    assert search(g).choice == {"x": 1}
    with pytest.raises(ValueError, match="does not match"):
        CostGraph({"a": np.ones(2), "b": np.ones(3)}).add_edge("a", "b", np.ones((3, 2)))
