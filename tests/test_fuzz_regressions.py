"""The crashes and hangs found by fuzzing the kernels (issue 9), each as a
call that must now return the right result or raise a Python exception.
Each runs in a child process (a segfault, an abort or a hang would otherwise
take pytest down) with faulthandler on and a time limit; the child prints
the outcome, which the test checks."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

PRELUDE = """
import faulthandler, resource, sys, time
faulthandler.enable()
# a bounded address space: a scratch buffer sized by a huge stride/pad shows
# up as MemoryError instead of swapping the machine
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
import numpy as np
import engine._sprint_cpu as m
import engine.ops as ops
"""


def run_child(body: str, timeout: float = 20.0) -> str:
    code = PRELUDE + textwrap.dedent(body)
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hung for more than {timeout} s:\n{body}")
    assert r.returncode == 0, f"child died (rc {r.returncode}):\n{body}\n{r.stderr[-3000:]}"
    return r.stdout


def expect_error(call: str, errors=("ValueError",)) -> str:
    """Runs `call` in a child; it must raise one of `errors`. Returns the message."""
    out = run_child(f"""
try:
    {call}
    print("RESULT ok")
except Exception as e:
    print("RESULT", type(e).__name__, str(e).replace(chr(10), ' '))
""")
    line = [ln for ln in out.splitlines() if ln.startswith("RESULT")][-1]
    kind = line.split()[1]
    assert kind in errors, f"{call}: expected {errors}, got {line}"
    return line


def test_im2col_overflowing_rows_is_refused():
    # K = C*kh*kw overflowed int64; the negative expected size passed as "any"
    # and the kernel wrote past a 1x1 buffer (segfault)
    msg = expect_error("m.im2col(np.zeros((1,3,1,1),np.float32), np.zeros((1,1),np.float32), "
                       "2**31-1, 2**31-1, 1, 1, 2**30-1, 2**30-1)")
    assert "C*kh*kw" in msg


@pytest.mark.parametrize("fn", ["col2im", "im2col"])
def test_overflowing_geometry_is_refused_by_both_directions(fn):
    a, b = ("np.zeros((1,1),np.float32)", "np.zeros((1,3,1,1),np.float32)")
    if fn == "im2col":
        a, b = b, a
    expect_error(f"m.{fn}({a}, {b}, 2**31, 2**31, 2**31, 2**31, 2**31, 2**31)")


@pytest.mark.parametrize("s,p", [(2**17, 2**16), (2**15, 2**14), (2**31, 2**31 - 1), (2**20, 1)])
def test_im2col_huge_stride_and_pad_needs_no_big_scratch(s, p):
    # the padded-plane scratch was ((OH-1)*s + k)^2 floats, allocated inside
    # the OpenMP region: at (2^17, 2^16) bad_alloc could not leave it and the
    # process aborted; at 2^15 it took 4.2 GB for a 9x4 output. The child's
    # address space is capped at 3 GiB.
    out = run_child(f"""
x = np.arange(1, 10, dtype=np.float32).reshape(1, 1, 3, 3)
cols = ops.im2col(x, 3, 3, stride={s}, pad={p})
back = ops.col2im(cols, x.shape, 3, 3, stride={s}, pad={p})
print(repr(cols.tolist()))
print(repr(back.tolist()))
""")
    cols, back = (np.array(eval(line), np.float32) for line in out.split("\n")[:2])
    x = np.arange(1, 10, dtype=np.float32).reshape(1, 1, 3, 3)
    want_cols, want_back = _reference_im2col(x, 3, 3, s, p)
    np.testing.assert_array_equal(cols, want_cols)
    np.testing.assert_array_equal(back, want_back.astype(np.float32))


def _uses_padded_plane(H, W, kh, kw, s, p):
    """csrc/im2col.cpp's rule: the padded plane only when it is at most about
    twice the data it serves (one input plane and its cols)."""
    OH, OW = (H + 2 * p - kh) // s + 1, (W + 2 * p - kw) // s + 1
    Hp, Wp = (OH - 1) * s + kh, (OW - 1) * s + kw
    return Hp * Wp <= 2 * (H * W + kh * kw * OH * OW) + 4096


@pytest.mark.parametrize("kh,kw,s,p", [(3, 2, 2, 1), (2, 3, 3, 2), (1, 1, 4, 40), (2, 2, 5, 45), (3, 2, 6, 50)])
def test_im2col_direct_and_padded_paths_match_the_reference(kh, kw, s, p):
    """Both CPU paths (padded-plane scratch, or edge tests with no scratch when
    that plane would dwarf the data) against float64 loops; col2im sums in
    the same (i, j) order on both paths."""
    from engine import _sprint_cpu as m
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    OH, OW = (5 + 2 * p - kh) // s + 1, (4 + 2 * p - kw) // s + 1
    cols = np.full((3 * kh * kw, 2 * OH * OW), np.nan, np.float32)
    m.im2col(x, cols, kh, kw, s, s, p, p)
    want, _ = _reference_im2col(x, kh, kw, s, p)
    np.testing.assert_array_equal(cols, want)
    back = np.full(x.shape, np.nan, np.float32)
    m.col2im(cols, back, kh, kw, s, s, p, p)
    _, want_x = _reference_im2col(x, kh, kw, s, p, cols=cols)
    np.testing.assert_allclose(back, want_x, rtol=1e-6, atol=1e-6)


def test_the_path_cases_cover_both_paths():
    assert _uses_padded_plane(5, 4, 3, 2, 2, 1) and _uses_padded_plane(5, 4, 2, 3, 3, 2)
    assert not any(_uses_padded_plane(5, 4, *c) for c in ((1, 1, 4, 40), (2, 2, 5, 45), (3, 2, 6, 50)))


def _taps(shape, kh, kw, s, p):
    """(cols row, cols column, x index) of every window tap inside the image."""
    B, C, H, W = shape
    OH, OW = (H + 2 * p - kh) // s + 1, (W + 2 * p - kw) // s + 1
    for c in range(C):
        for i in range(kh):
            for j in range(kw):
                for n in range(B):
                    for oh in range(OH):
                        for ow in range(OW):
                            h, w = oh * s + i - p, ow * s + j - p
                            if 0 <= h < H and 0 <= w < W:
                                yield (c * kh + i) * kw + j, (n * OH + oh) * OW + ow, (n, c, h, w)


def _reference_im2col(x, kh, kw, s, p, cols=None):
    """float64 loops: cols of x, and col2im of `cols` (or of those cols)."""
    B, C, H, W = x.shape
    OH, OW = (H + 2 * p - kh) // s + 1, (W + 2 * p - kw) // s + 1
    ref = np.zeros((C * kh * kw, B * OH * OW))
    for r, q, at in _taps(x.shape, kh, kw, s, p):
        ref[r, q] = x[at]
    src = ref if cols is None else cols.astype(np.float64)
    back = np.zeros(x.shape)
    for r, q, at in _taps(x.shape, kh, kw, s, p):
        back[at] += src[r, q]
    return ref.astype(np.float32), back


def test_empty_batch_returns_at_once():
    out = run_child("""
x = np.ones((0, 1, 1, 1), np.float32)
m.im2col(x, np.zeros((1, 0), np.float32), 1, 1, 2**17, 2**17, 2**16, 2**16)
m.col2im(np.zeros((1, 0), np.float32), x, 1, 1, 2**17, 2**17, 2**16, 2**16)
m.im2col(np.ones((0, 2, 3, 3), np.float32), np.zeros((18, 0), np.float32), 3, 3, 1, 1, 1, 1)
print("done")
""")
    assert out.strip() == "done"


def test_empty_transpose_with_huge_dims_returns_at_once():
    # looped 2^60 times with the GIL released (Ctrl-C could not stop it)
    out = run_child("""
m.nchw_to_cnhw(np.empty((0, 2**60, 1), np.float32), np.empty((2**60, 0), np.float32), None, False)
m.cnhw_to_nchw(np.empty((2**60, 0), np.float32), None, np.empty((0, 2**60, 1), np.float32))
db = np.full(3, 7.0, np.float32)
m.channel_sum(np.empty((2**58, 3, 0), np.float32), db, False)
print(db.tolist())
db[:] = 7
m.nchw_to_cnhw(np.empty((2**58, 3, 0), np.float32), np.empty((3, 0), np.float32), db, True)
print(db.tolist())
m.nchw_to_cnhw(np.empty((2**58, 3, 0), np.float32), np.empty((3, 0), np.float32), db, False)
print(db.tolist())
m.add_channel_bias(np.empty((2**58, 3, 0), np.float32), np.ones(3, np.float32))
""", timeout=20)
    # the sums over an empty batch are 0 (or unchanged when accumulating)
    assert out.split("\n")[:3] == ["[0.0, 0.0, 0.0]", "[7.0, 7.0, 7.0]", "[0.0, 0.0, 0.0]"]


def test_transpose_with_overflowing_batch_times_plane_is_refused():
    expect_error("m.nchw_to_cnhw(np.empty((2**40, 0, 2**40), np.float32), np.empty((0, 0), np.float32))")


def test_check_shape_has_no_negative_wildcard():
    # an expected size that overflowed to a negative number used to match any size
    msg = expect_error("m.im2col(np.empty((0, 2**33, 1, 1), np.float32), np.zeros((0, 0), np.float32), "
                       "2**31, 2**31, 1, 1, 2**30, 2**30)")
    assert "too large" in msg
