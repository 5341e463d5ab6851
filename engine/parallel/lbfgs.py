"""L-BFGS split between parameter shards and a coordinator (Sandblaster).

The two-loop recursion needs dot products of whole vectors. The shards hold
their slices of the current gradient ``g`` and of the last ``m`` pairs
``s_i = x_{i+1} - x_i``, ``y_i = g_{i+1} - g_i``; each reports the Gram
matrix of its slice of the basis ``[s_0..s_{k-1}, y_0..y_{k-1}, g]``; their
sum is the global Gram matrix, on which the coordinator runs the recursion
with coefficient vectors instead of vectors ("vector-free" L-BFGS, Chen et
al., NIPS 2014). It sends back the coefficients and every shard forms its
slice of the direction ``d = sum_j c_j b_j``: one reduction per iteration
instead of 2k sequential ones, and the same direction as the textbook
recursion (see the unit test).

Line search (coordinator): backtracking under the Armijo condition
``f(x + t d) <= f(x) + c1 t g.d`` with quadratic interpolation between
trials (clamped to [0.1 t, 0.5 t]), starting from t = 1 (t = 1/|g| on the
first iteration or after a reset). Curvature pairs with ``s.y <= 1e-10 |y|^2``
are dropped rather than stored, which keeps H positive definite without the
Wolfe curvature condition (and its extra gradient evaluations).
"""
from __future__ import annotations

import numpy as np

C1 = 1e-4
MAX_TRIALS = 12
CURVATURE_EPS = 1e-10


def two_loop_coeffs(G: np.ndarray, k: int) -> np.ndarray:
    """Coefficients c over the basis [s_0..s_{k-1}, y_0..y_{k-1}, g] such that
    d = sum c_j b_j = -H g (H the L-BFGS inverse Hessian of the k pairs,
    oldest first, scaled by s.y / y.y of the newest), from the Gram matrix G."""
    G = np.asarray(G, np.float64)
    nb = 2 * k + 1
    if G.shape != (nb, nb):
        raise ValueError(f"Gram matrix of {k} pairs must be {nb}x{nb}, got {G.shape}")
    delta = np.zeros(nb)
    delta[2 * k] = 1.0
    alpha = np.zeros(k)
    rho = np.array([1.0 / G[i, k + i] for i in range(k)])
    for i in reversed(range(k)):
        alpha[i] = rho[i] * (G[i] @ delta)
        delta[k + i] -= alpha[i]
    if k:
        delta *= G[k - 1, 2 * k - 1] / G[2 * k - 1, 2 * k - 1]
    for i in range(k):
        beta = rho[i] * (G[k + i] @ delta)
        delta[i] += alpha[i] - beta
    return -delta


def select(G: np.ndarray, k: int, keep: list[int]) -> np.ndarray:
    """The Gram matrix of the basis restricted to the pairs ``keep``."""
    idx = [i for i in keep] + [k + i for i in keep] + [2 * k]
    return G[np.ix_(idx, idx)]


def backtrack(t, f0, gd, ft):
    """Next trial step after a failed Armijo test: the minimiser of the
    quadratic through f0, its slope gd and ft, clamped to [0.1 t, 0.5 t]."""
    denom = 2.0 * (ft - f0 - gd * t)
    t_new = -gd * t * t / denom if denom > 0 and np.isfinite(ft) else 0.5 * t
    return float(min(max(t_new, 0.1 * t), 0.5 * t))


class ShardLBFGS:
    """One shard's slice of the L-BFGS state: the point x, the gradient g at x
    of the current batch, the direction d, and the history pairs."""

    def __init__(self, x0, m=10):
        self.x = np.asarray(x0, np.float32).copy()
        self.m = int(m)
        self.g = np.zeros_like(self.x)
        self.d = np.zeros_like(self.x)
        self.S: list[np.ndarray] = []
        self.Y: list[np.ndarray] = []
        self.pending = None          # (s, y) of the last accepted step, not yet judged
        # (id, id) -> (dot, a, b): vectors are never changed in place, and
        # holding them keeps their ids from being reused while cached
        self._dots = {}

    def _dot(self, a, b):
        key = (id(a), id(b)) if id(a) <= id(b) else (id(b), id(a))
        hit = self._dots.get(key)
        if hit is None:
            hit = self._dots[key] = (float(a.astype(np.float64) @ b.astype(np.float64)), a, b)
        return hit[0]

    def basis(self):
        S, Y = list(self.S), list(self.Y)
        if self.pending is not None:
            S.append(self.pending[0])
            Y.append(self.pending[1])
        return S, Y

    def gram(self) -> np.ndarray:
        """This shard's partial Gram matrix of the basis; only the products
        with vectors new since the last call are computed."""
        S, Y = self.basis()
        B = S + Y + [self.g]
        live = {id(b) for b in B}
        self._dots = {k: v for k, v in self._dots.items() if k[0] in live and k[1] in live}
        G = np.empty((len(B), len(B)))
        for i, a in enumerate(B):
            for j in range(i, len(B)):
                G[i, j] = G[j, i] = self._dot(a, B[j])
        return G

    def set_direction(self, coeffs, keep: list[int]):
        """Keep the pairs ``keep`` (indices into basis()) and form d."""
        S, Y = self.basis()
        self.S = [S[i] for i in keep]
        self.Y = [Y[i] for i in keep]
        self.pending = None
        B = self.S + self.Y + [self.g]
        d = np.zeros(self.x.shape, np.float64)
        for c, b in zip(coeffs, B):
            d += c * b
        self.d = d.astype(np.float32)

    def point(self, t):
        return self.x if t == 0 else self.x + np.float32(t) * self.d

    def accept(self, t, g_new):
        s = np.float32(t) * self.d
        self.pending = (s, g_new - self.g)
        self.x = self.x + s
        self.g = g_new

    def state(self):
        """What a resumed run needs: x and the whole basis, the pending pair
        included (it is judged with the others at the next direction, so
        restored as an ordinary pair it gives the same basis; dropping it made
        a resumed run take another direction at its first batch)."""
        n = self.x.size
        S, Y = self.basis()
        return {"x": self.x, "s": np.array(S, np.float32).reshape(len(S), n),
                "y": np.array(Y, np.float32).reshape(len(Y), n)}


def choose_pairs(G: np.ndarray, k: int, m: int) -> list[int]:
    """Pairs to keep: those with enough curvature, the newest m."""
    keep = [i for i in range(k) if G[i, k + i] > CURVATURE_EPS * G[k + i, k + i] and G[k + i, k + i] > 0]
    return keep[-m:]
