"""DeformImage kernel: identity, flip, crop offset and center crop exactly;
random scale / offset / flip against a float64 reference; normalisation;
bad input; CUDA vs CPU on a GPU."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import ops
from engine.selfcheck import ref_deform  # float64 reference, shared with sprint selfcheck
from k2_support import (assert_close, check_cuda_binding, compiled_backend_without_device, cpu,
                        cuda_module_without_device, emulated_gpu_backend, gpu_backends, poison, using)


@pytest.fixture(autouse=True)
def _cpu():
    cpu()


def _img(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    if dtype == np.uint8:
        return rng.integers(0, 256, shape, dtype=np.uint8)
    return rng.standard_normal(shape).astype(np.float32)


def _params(rows):
    return np.asarray(rows, np.float32).reshape(-1, 4)


def _norm(c, mean=0.0, std=1.0):
    return np.full(c, mean, np.float32), np.full(c, std, np.float32)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
@pytest.mark.parametrize("shape", [(2, 3, 32, 32), (1, 1, 5, 7), (3, 2, 1, 1), (2, 1, 4, 9)])
def test_identity_is_exact(dtype, shape):
    x = _img(shape, dtype, 1)
    m, s = _norm(shape[1])
    out = ops.deform(x, ops.identity_params(shape[0]), shape[2:], m, s, out=poison(shape))
    want = x.astype(np.float32) / np.float32(255) if dtype == np.uint8 else x
    assert np.array_equal(out, want)


def test_identity_with_normalisation_matches_float32_formula():
    x = _img((2, 3, 8, 8), np.uint8, 2)
    mean = np.array([0.49, 0.48, 0.45], np.float32)
    std = np.array([0.25, 0.24, 0.26], np.float32)
    out = ops.deform(x, ops.identity_params(2), (8, 8), mean, std)
    want = (x.astype(np.float32) / np.float32(255) - mean[:, None, None]) / std[:, None, None]
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_flip_and_integer_offsets_are_exact(dtype):
    x = _img((4, 3, 9, 11), dtype, 3)
    xf = x.astype(np.float32) / np.float32(255) if dtype == np.uint8 else x
    m, s = _norm(3)
    p = _params([[1, 0, 0, 1], [1, 2, -3, 0], [1, -4, 4, 1], [1, 20, 0, 0]])
    out = ops.deform(x, p, (9, 11), m, s, out=poison((4, 3, 9, 11)))
    assert np.array_equal(out[0], xf[0][:, :, ::-1])
    def shifted(img, dy, dx):  # img[i + dy, j + dx], zero outside
        pad = np.pad(img, ((0, 0), (20, 20), (20, 20)))
        return pad[:, 20 + dy:20 + dy + 9, 20 + dx:20 + dx + 11]

    assert np.array_equal(out[1], shifted(xf[1], 2, -3))  # random crop with zero padding
    assert np.array_equal(out[2], shifted(xf[2][:, :, ::-1], -4, 4))  # the mirror image, offset
    assert np.array_equal(out[3], np.zeros_like(out[3]))  # entirely outside


def test_center_crop_is_exact():
    x = _img((2, 3, 32, 32), np.uint8, 4)
    m, s = _norm(3)
    out = ops.deform(x, ops.identity_params(2), (28, 24), m, s)
    assert np.array_equal(out, x[:, :, 2:30, 4:28].astype(np.float32) / np.float32(255))


@st.composite
def cases(draw):
    N, C = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    H, W = draw(st.integers(1, 17)), draw(st.integers(1, 17))
    oh, ow = draw(st.integers(1, 17)), draw(st.integers(1, 17))
    rows = [[draw(st.floats(0.3, 3.0)), draw(st.floats(-6, 6)), draw(st.floats(-6, 6)),
             float(draw(st.booleans()))] for _ in range(N)]
    return (N, C, H, W), (oh, ow), _params(rows), draw(st.sampled_from([np.uint8, np.float32]))


@settings(max_examples=60, deadline=None)
@given(case=cases(), seed=st.integers(0, 2**31))
def test_random_params_match_float64_reference(case, seed):
    shape, out_hw, p, dtype = case
    x = _img(shape, dtype, seed)
    rng = np.random.default_rng(seed + 1)
    mean = rng.uniform(-0.5, 0.5, shape[1]).astype(np.float32)
    std = rng.uniform(0.2, 2.0, shape[1]).astype(np.float32)
    out = ops.deform(x, p, out_hw, mean, std, out=poison(shape[:2] + out_hw))
    ref = ref_deform(x, p, out_hw, mean, std)
    # float32 sample coordinates (|err| ~ 1e-6 * side) times the pixel slope
    span = 1.0 if dtype == np.uint8 else float(np.abs(x).max()) * 2
    assert_close(out, ref, tol=5e-5 * span / float(std.min()), eps=1e-5, what="deform")


def test_scale_zooms_about_the_center():
    """scale 2 on a linear ramp halves the slope around the image center."""
    W = 16
    x = np.tile(np.arange(W, dtype=np.float32), (1, 1, 4, 1))
    m, s = _norm(1)
    out = ops.deform(x, _params([2, 0, 0, 0]), (4, W), m, s)
    np.testing.assert_allclose(out[0, 0, 0], (W - 1) / 2 + (np.arange(W) - (W - 1) / 2) / 2, atol=1e-5)


def test_empty_batch():
    m, s = _norm(3)
    out = ops.deform(_img((0, 3, 8, 8), np.uint8, 0), np.zeros((0, 4), np.float32), (6, 6), m, s)
    assert out.shape == (0, 3, 6, 6) and out.dtype == np.float32


def test_big_batch_parallel_path():
    x = _img((64, 3, 32, 32), np.uint8, 5)
    rng = np.random.default_rng(6)
    p = np.column_stack([rng.uniform(0.8, 1.25, 64), rng.integers(-4, 5, (64, 2)),
                         rng.random(64) < 0.5]).astype(np.float32)
    mean, std = _norm(3, 0.5, 0.25)
    assert_close(ops.deform(x, p, (32, 32), mean, std), ref_deform(x, p, (32, 32), mean, std),
                 tol=2e-4, what="deform batch")


def _x(*shape, dtype=np.uint8):
    return np.zeros(shape, dtype)


M3, S3 = _norm(3)
P1 = _params([1, 0, 0, 0])
BAD = [
    (lambda: ops.deform(_x(1, 3, 4, 4, dtype=np.float64), P1, (4, 4), M3, S3), TypeError, "x"),
    (lambda: ops.deform(_x(1, 3, 4, 4, dtype=np.int32), P1, (4, 4), M3, S3), TypeError, "x"),
    (lambda: ops.deform(_x(3, 4, 4), P1, (4, 4), M3, S3), ValueError, "x"),
    (lambda: ops.deform(_x(1, 3, 4, 8)[..., ::2], P1, (4, 4), M3, S3), ValueError, "x"),
    (lambda: ops.deform(_x(1, 3, 0, 4), P1, (4, 4), M3, S3), ValueError, "x"),
    (lambda: ops.deform(_x(2, 3, 4, 4), P1, (4, 4), M3, S3), ValueError, "params"),
    (lambda: ops.deform(_x(1, 3, 4, 4), P1.astype(np.float64), (4, 4), M3, S3), TypeError, "params"),
    (lambda: ops.deform(_x(1, 3, 4, 4), _params([0, 0, 0, 0]), (4, 4), M3, S3), ValueError, "params"),
    (lambda: ops.deform(_x(1, 3, 4, 4), _params([1, np.nan, 0, 0]), (4, 4), M3, S3), ValueError, "params"),
    (lambda: ops.deform(_x(1, 3, 4, 4), P1, (0, 4), M3, S3), ValueError, "out_hw"),
    (lambda: ops.deform(_x(1, 3, 4, 4), P1, (4, 4, 4), M3, S3), ValueError, "out_hw"),
    (lambda: ops.deform(_x(1, 3, 4, 4), P1, 4.0, M3, S3), TypeError, "out_hw"),
    (lambda: ops.deform(_x(1, 3, 4, 4), P1, (4, 4), M3[:2], S3), ValueError, "mean"),
    (lambda: ops.deform(_x(1, 3, 4, 4), P1, (4, 4), M3, np.zeros(3, np.float32)), ValueError, "std"),
    (lambda: ops.deform(_x(1, 3, 4, 4), P1, (4, 4), M3 + np.inf, S3), ValueError, "mean"),
    (lambda: ops.deform(_x(1, 3, 4, 4), P1, (4, 4), M3, S3, out=np.zeros((1, 3, 4, 5), np.float32)),
     ValueError, "out"),
]


@pytest.mark.parametrize("call,exc,name", BAD)
def test_bad_input_names_the_argument(call, exc, name):
    with pytest.raises(exc, match=name):
        call()


def test_binding_checks_arguments_themselves():
    from engine import _sprint_cpu as ext
    out = np.zeros((1, 3, 4, 4), np.float32)
    ext.deform(_x(1, 3, 4, 4), P1, M3, S3, out)
    for args, exc, name in [((_x(1, 3, 4, 4), _params([-1, 0, 0, 0]), M3, S3, out), ValueError, "scale"),
                            ((_x(1, 3, 4, 4), _params([1, 0, np.inf, 0]), M3, S3, out), ValueError, "params"),
                            ((_x(1, 3, 4, 4), P1, M3, -S3, out), ValueError, "std"),
                            ((_x(1, 3, 4, 4, dtype=np.int8), P1, M3, S3, out), TypeError, "x"),
                            ((_x(2, 3, 4, 4), P1, M3, S3, out), ValueError, "out"),
                            ((_x(1, 3, 4, 4), P1, M3, S3, out.astype(np.float64)), TypeError, "out")]:
        with pytest.raises(exc, match=name):
            ext.deform(*args)


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    return emulated_gpu_backend(tmp_path_factory.mktemp("emulated"), ("deform",))


@settings(max_examples=20, deadline=None)
@given(case=cases(), seed=st.integers(0, 2**31))
def test_cuda_sources_on_the_cpu_match_the_cpu_twin(emulated, case, seed):
    """kernels/deform.cu run through the ops' RawModule path: the CPU twin's bits."""
    shape, out_hw, p, dtype = case
    x = _img(shape, dtype, seed)
    mean, std = _norm(shape[1], 0.3, 0.7)
    want = ops.deform(x, p, out_hw, mean, std)
    with using(emulated):
        got = ops.deform(x, p, out_hw, mean, std, out=poison(shape[:2] + out_hw))
        with pytest.raises(ValueError, match="params"):
            ops.deform(x, p * 0, out_hw, mean, std)
    assert np.array_equal(got, want)


def _special_values_image():
    """A float32 image holding Inf, -Inf, NaN and -0 next to finite pixels."""
    x = np.arange(2 * 5 * 6, dtype=np.float32).reshape(1, 2, 5, 6) - 20
    x[0, 0, 2, 3] = np.inf
    x[0, 0, 4, 0] = -np.inf
    x[0, 1, 1, 1] = np.nan
    x[0, 1, 3, 5] = -0.0
    return x


@pytest.mark.parametrize("path", ["cpu", "emulated_gpu"])
def test_identity_and_integer_shifts_copy_inf_nan_and_minus_zero_exactly(path, emulated):
    """Issue 9: the identity turned an Inf pixel into NaN (0 * Inf from the
    zero-weight neighbour) and spread it to the pixel before it. Identity,
    flip and integer offsets must copy every pixel bit for bit, and a zero
    weight must not pull a neighbour's Inf/NaN in."""
    x = _special_values_image()
    m, s = _norm(2)
    shifts = [[1, 0, 0, 0], [1, 0, 0, 1], [1, 1, -2, 0], [1, -1, 3, 1]]
    xs = np.repeat(x, len(shifts), axis=0)
    with using(emulated if path == "emulated_gpu" else cpu()):
        out = ops.deform(xs, _params(shifts), (5, 6), m, s, out=poison(xs.shape))

    def shifted(img, dy, dx):  # img[i + dy, j + dx], zero outside
        pad = np.pad(img, ((0, 0), (5, 5), (6, 6)))
        return pad[:, 5 + dy:5 + dy + 5, 6 + dx:6 + dx + 6]

    want = [x[0], x[0][:, :, ::-1], shifted(x[0], 1, -2), shifted(x[0][:, :, ::-1], -1, 3)]
    for got, ref in zip(out, want):
        assert got.tobytes() == np.ascontiguousarray(ref).tobytes()  # -0 and NaN compared bitwise too


@pytest.mark.parametrize("path", ["cpu", "emulated_gpu"])
def test_interpolation_keeps_inf_local(path, emulated):
    """A half-pixel shift blends each pixel with its right neighbour: only the
    outputs whose taps include the Inf pixel are non-finite."""
    x = _special_values_image()[:, :1]
    x[0, 0, 4, 0] = 0  # one Inf only
    m, s = _norm(1)
    with using(emulated if path == "emulated_gpu" else cpu()):
        out = ops.deform(x, _params([[1, 0, 0.5, 0]]), (5, 6), m, s)
    bad = ~np.isfinite(out[0, 0])
    assert bad.sum() == 2 and bad[2, 2] and bad[2, 3]
    assert np.isposinf(out[0, 0, 2, 2]) and np.isposinf(out[0, 0, 2, 3])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_gpu_deform_matches_cpu(dtype):
    import cupy

    x = _img((16, 3, 32, 32), dtype, 7)
    rng = np.random.default_rng(8)
    p = np.column_stack([rng.uniform(0.7, 1.4, 16), rng.uniform(-5, 5, (16, 2)),
                         rng.random(16) < 0.5]).astype(np.float32)
    mean, std = _norm(3, 0.4, 0.3)
    want = ops.deform(x, p, (28, 30), mean, std)
    ident = ops.deform(x, ops.identity_params(16), (32, 32), *_norm(3))
    for be in gpu_backends():
        with using(be):
            g = cupy.asarray
            got = ops.deform(g(x), g(p), (28, 30), g(mean), g(std), out=poison((16, 3, 28, 30), xp=cupy))
            assert_close(got, want, tol=1e-4, eps=1e-5, what=be.kernels)
            gi = ops.deform(g(x), ops.identity_params(16, cupy), (32, 32), *(g(a) for a in _norm(3)))
            assert np.array_equal(gi.get(), ident), be.kernels


def test_cuda_binding_checks_arguments_without_a_gpu():
    c = cuda_module_without_device()
    check_cuda_binding(lambda: c.deform(8, True, 16, 24, 32, 40, 2, 3, 8, 8, 6, 6))
    check_cuda_binding(lambda: c.deform(8, False, 16, 24, 32, 40, 2, 3, 8, 8, 9, 7))
    for args, name in (((0, True, 16, 24, 32, 40, 2, 3, 8, 8, 6, 6), "x"),
                       ((8, True, 16, 24, 0, 40, 2, 3, 8, 8, 6, 6), "std"),
                       ((8, True, 16, 24, 32, 40, 2, 0, 8, 8, 6, 6), "channels"),
                       ((8, True, 16, 24, 32, 40, 2, 3, 8, 8, 0, 6), "out_hw"),
                       ((8, True, 16, 24, 32, 40, -1, 3, 8, 8, 6, 6), "batch")):
        check_cuda_binding(lambda: c.deform(*args), ValueError, name)


def test_ops_call_the_compiled_binding_correctly():
    with using(compiled_backend_without_device()):
        for x in (_x(2, 3, 8, 8), _x(2, 3, 8, 8, dtype=np.float32)):
            check_cuda_binding(lambda: ops.deform(x, ops.identity_params(2), (6, 7), M3, S3))
