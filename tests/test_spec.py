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


@pytest.mark.parametrize("bad, what", [
    (dict(x0=2 ** 16), "the input"),                                # 65536^2 values
    (dict(x0=2 ** 12, m0=8, c=5), r"convs\[0\]'s unfolded input"),  # 200 x 4096^2
    (dict(x0=2 ** 14, c=1, convs=((16, 2),)), r"convs\[0\]'s output"),  # 16 x 16384^2
    (dict(convs=((2 ** 12, 1),), fcs=(2 ** 13,)), r"fcs\[0\]'s weights"),  # 4096 x 64 x 8192
])
def test_sizes_beyond_the_kernels_32_bit_arguments_are_refused(bad, what):
    """Each count fits 32 bits alone; a layer's product of them (what a
    kernel is called with) must too, or the spec is refused, naming it."""
    kw = dict(name="x", x0=8, m0=1, c=3, convs=((2, 2),), fcs=(3,))
    kw.update(bad)
    with pytest.raises(ValueError, match=what + ".*32-bit"):
        S.NetSpec(**kw)
    kw["name"] = "ok"
    S.NetSpec(**dict(kw, x0=8, m0=1, c=3, convs=((2, 2),), fcs=(3,)))   # the same call, sizes in range


def test_spec_file_round_trip(tmp_path):
    p = tmp_path / "net.json"
    p.write_text(json.dumps(S.PRESETS["cifar"].to_dict()))
    got = S.get_spec(str(p))
    assert got.convs == S.PRESETS["cifar"].convs and got.fcs == S.PRESETS["cifar"].fcs
    assert got.hash() == S.PRESETS["cifar"].hash()
    with pytest.raises(ValueError, match="preset"):
        S.get_spec(str(tmp_path / "missing.json"))


# ---- strict spec files -------------------------------------------------------------
GOOD = '{"x0": 8, "m0": 1, "convs": [[4, 2]], "fcs": [10]}'


@pytest.mark.parametrize("name, text, msg", [
    ("float.json", '{"x0": 8.9, "m0": 1.7, "convs": [[32.5, 1]], "fcs": [10.9]}', r"x0 must be a positive integer, got 8.9"),
    ("whole.json", '{"x0": 8.0, "m0": 1, "convs": [], "fcs": [10]}', r"x0 .* got 8.0 \(float\)"),
    ("bool.json", '{"x0": 8, "m0": true, "convs": [[32, 1]], "fcs": [10]}', r"m0 .* got True \(bool\)"),
    ("filters.json", '{"x0": 8, "m0": 1, "convs": [[32.5, 1]], "fcs": [10]}', r"convs\[0\]\[0\] \(filters\)"),
    ("pool.json", '{"x0": 8, "m0": 1, "convs": [[4, true]], "fcs": [10]}', r"convs\[0\]\[1\] \(pooling\)"),
    ("fcs.json", '{"x0": 8, "m0": 1, "convs": [], "fcs": [10.9]}', r"fcs\[0\]"),
    ("pair.json", '{"x0": 8, "m0": 1, "convs": [[4]], "fcs": [10]}', r"convs\[0\] must be a pair"),
    ("unknown.json", '{"x0": 8, "m0": 1, "convs": [], "fcs": [10], "dropout": 0.5}', r"unknown key.*dropout"),
    ("missing.json", '{"x0": 8, "convs": [], "fcs": [10]}', r"missing \['m0'\]"),
    ("inf.json", '{"x0": Infinity, "m0": 1, "convs": [], "fcs": [10]}', "Infinity"),
    ("nan.json", '{"x0": 8, "m0": NaN, "convs": [], "fcs": [10]}', "NaN"),
    ("huge.json", '{"x0": 100000000000, "m0": 1, "convs": [], "fcs": [10]}', r"x0 must be an integer in \[1, "),
    ("deep.json", "[" * 20_000 + "]" * 20_000, "nested too deeply"),
    ("broken.json", '{"x0": 8,', "not valid JSON"),
    ("list.json", "[8, 1]", "must be a mapping"),
    ("deep.yaml", "[" * 20_000 + "]" * 20_000, "nested too deeply|not valid YAML"),
    ("broken.yaml", "x0: [1,\n  - :", "not valid YAML"),
    ("inf.yaml", "x0: .inf\nm0: 1\nconvs: []\nfcs: [10]", r"x0 .* got inf"),
    ("code.yaml", "!!python/object/apply:os.system ['echo owned']", "not valid YAML"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 20 and "." in v else "")
def test_spec_files_are_strict_and_name_the_file(tmp_path, name, text, msg):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(ValueError, match=msg) as e:
        S.get_spec(str(p))
    assert str(e.value).startswith(f"spec file {p}: ")


def test_good_spec_files_and_dicts_load(tmp_path):
    (tmp_path / "a.json").write_text(GOOD)
    (tmp_path / "b.yaml").write_text("x0: 8\nm0: 1\nconvs: [[4, 2]]\nfcs: [10]\n")
    a, b = S.get_spec(str(tmp_path / "a.json")), S.get_spec(str(tmp_path / "b.yaml"))
    assert (a.name, b.name) == ("a", "b") and a.convs == b.convs == ((4, 2),) and a.c == 3
    assert S.get_spec(json.loads(GOOD)).fcs == (10,)
    (tmp_path / "d.json").mkdir()
    with pytest.raises(ValueError, match=r"d.json: is a directory"):
        S.get_spec(str(tmp_path / "d.json"))
    with pytest.raises(ValueError, match="filters"):
        S.NetSpec("x", 8, 1, 3, ((2.0, 1),), (3,))      # the constructor is as strict as the file


def test_mnist_preset_geometry_and_listing():
    m = S.PRESETS["mnist"]
    assert m.input_shape == (1, 28, 28) and m.n_classes == 10
    g = S.layers(m)
    assert [l.out_shape for l in g] == [(16, 14, 14), (32, 7, 7), (128,), (10,)]
    assert S.n_params(m) == S.n_params_formula(m) == 160 + 4640 + 200_832 + 1290
    assert sum(l.flops_fwd for l in g) < 20e6          # small enough for one fast CPU thread
    lines = S.preset_lines()
    assert len(lines) == len(S.PRESETS) and any(l.startswith("mnist") and "28x28x1" in l for l in lines)
    with pytest.raises(ValueError, match="mnist"):
        S.get_spec("no-such-net")
