import json

import pytest
from hypothesis import given, settings, strategies as st

from engine import spec as S


def test_tiny_n_param_by_hand():
    # conv1 3*(3*3*2+1), conv2 4*(3*3*3+1), fc1 6*(4*4*4+1), fc2 3*(6+1)
    assert S.n_params(S.PRESETS["tiny"]) == 57 + 112 + 390 + 21


def test_vgg_presets_match_published_counts():
    # VGG configurations A and D as published (Simonyan & Zisserman, table 2)
    assert S.n_params(S.PRESETS["cnn-a"]) == 132_863_336
    assert S.n_params(S.PRESETS["cnn-c"]) == 138_357_544


@st.composite
def specs(draw):
    c = draw(st.sampled_from([1, 3, 5]))
    pools = draw(st.lists(st.sampled_from([1, 2]), min_size=0, max_size=3))
    x0 = 2 ** sum(p == 2 for p in pools) * draw(st.integers(1, 3))
    convs = [(draw(st.integers(1, 9)), p) for p in pools]
    fcs = draw(st.lists(st.integers(1, 9), min_size=1, max_size=3))
    return S.NetSpec("h", x0, draw(st.integers(1, 4)), c, tuple(convs), tuple(fcs))


@settings(max_examples=60, deadline=None)
@given(specs())
def test_layout_and_formula_agree(spec):
    layout = S.param_layout(spec)
    off = 0
    for _, _, shape, o in layout:
        assert o == off
        n = 1
        for v in shape:
            n *= v
        off += n
    assert off == S.n_params(spec) == S.n_params_formula(spec)


def test_conv_gemm_shapes_and_flops():
    g = S.layers(S.PRESETS["cifar"], n=32)[1]
    assert g.gemm_fwd == (64, 32 * 32 * 32, 9 * 64)
    assert g.flops_fwd == 2 * 64 * 9 * 64 * 32 * 32 * 32
    assert g.out_shape == (64, 16, 16)


@pytest.mark.parametrize("bad, arg", [
    (dict(x0=0), "x0"), (dict(c=2), "c"), (dict(fcs=()), "fcs"),
    (dict(x0=6, convs=((4, 4),)), "convs"), (dict(convs=((0, 1),)), "convs"),
])
def test_bad_specs_name_the_argument(bad, arg):
    kw = dict(name="x", x0=8, m0=1, c=3, convs=((2, 2),), fcs=(3,))
    kw.update(bad)
    with pytest.raises(ValueError, match=arg):
        S.NetSpec(**kw)


def test_spec_file_round_trip(tmp_path):
    p = tmp_path / "net.json"
    p.write_text(json.dumps(S.PRESETS["cifar"].to_dict()))
    got = S.get_spec(str(p))
    assert got.convs == S.PRESETS["cifar"].convs and got.fcs == S.PRESETS["cifar"].fcs
    assert got.hash() == S.PRESETS["cifar"].hash()
    with pytest.raises(ValueError, match="preset"):
        S.get_spec(str(tmp_path / "missing.json"))
