"""Dump format v1: the loader's validation (one named case per problem), atomic writes, the
generator round trip and ``describe_dump``."""

import pytest
import torch
from safetensors.torch import save_file

from conftest import GOLDEN
from kdadbg.cases import CASES, get_case, make_inputs, with_size
from kdadbg.config import KDAConfig
from kdadbg.dump import describe_dump, load_dump, save_dump
from kdadbg.errors import KdadbgError
from kdadbg import fileio
from kdadbg.fileio import atomic_save
from kdadbg.gen import generate

# Small bases: batched (B=2, K=8 != V=12, lower_bound gate, h0 and dht) and varlen (N=3).
BATCHED = with_size(get_case("basic"), T=20, K=8, V=12)
VARLEN = with_size(get_case("varlen_short"), K=8, V=12)
GVA = with_size(get_case("gva"), T=20, K=8, V=12)   # H=2 q/k heads, HV=4 value heads


def base_tensors(case):
    inputs, config = make_inputs(case, seed=3)
    return dict(inputs.items()), config.to_metadata()


def _set(name, value):
    def f(t, m):
        t[name] = value(t) if callable(value) else value
    return f


def _drop(*names):
    def f(t, m):
        for n in names:
            t.pop(n)
    return f


def _meta(**kw):
    def f(t, m):
        m.update(kw)
    return f


def _poke(name, index, value):
    def f(t, m):
        x = t[name].clone()
        x[index] = value
        t[name] = x
    return f


def _chain(*fs):
    def f(t, m):
        for g in fs:
            g(t, m)
    return f


def _bad(id_, base, mutate, *fragments, overrides=None):
    return pytest.param(base, mutate, fragments, overrides, id=id_)


# (base, mutation of (tensors, metadata), fragments the one-line message must contain, overrides)
MALFORMED = [
    _bad("missing-q", BATCHED, _drop("q"), "tensor 'q'", "missing"),
    _bad("missing-do", BATCHED, _drop("do"), "tensor 'do'", "missing"),
    _bad("missing-beta", BATCHED, _drop("beta"), "tensor 'beta'", "missing"),
    _bad("q-3d", BATCHED, _set("q", lambda t: t["q"][0]), "tensor 'q'", "[B,T,H,K]", "found [20,2,8]"),
    _bad("v-short-T", BATCHED, _set("v", lambda t: t["v"][:, :19]), "tensor 'v'",
         "expected shape [B,T,H,V] = [2,20,2,*] (B,T,H from q)", "found [2,19,2,12]"),
    _bad("k-wrong-K", BATCHED, _set("k", lambda t: t["k"][..., :7]), "tensor 'k'", "[2,20,2,8]", "found [2,20,2,7]"),
    _bad("g-wrong-H", BATCHED, _set("g", lambda t: t["g"][:, :, :1]), "tensor 'g'", "found [2,20,1,8]"),
    _bad("do-wrong-V", BATCHED, _set("do", lambda t: t["do"][..., :11]), "tensor 'do'", "[2,20,2,12]",
         "found [2,20,2,11]"),
    _bad("beta-with-K", BATCHED, _set("beta", lambda t: t["q"].clone()), "tensor 'beta'", "[B,T,H] = [2,20,2]"),
    _bad("A_log-wrong-H", BATCHED, _set("A_log", lambda t: t["A_log"][:1]), "tensor 'A_log'", "[H] = [2]"),
    _bad("dt_bias-flat-wrong-size", BATCHED, _set("dt_bias", lambda t: t["dt_bias"].flatten()[:15]),
         "tensor 'dt_bias'", "[H,K] = [2,8]", "[H*K] = [16]", "found [15]"),
    _bad("h0-kv-in-vk-dump", BATCHED, _set("h0", lambda t: t["h0"].transpose(-1, -2)), "tensor 'h0'",
         "[N,H,V,K] = [2,2,12,8]", "found [2,2,8,12]", "kv layout"),
    _bad("dht-vk-in-kv-dump", BATCHED, _chain(_meta(state_layout="kv"), _drop("h0")), "tensor 'dht'",
         "[N,H,K,V] = [2,2,8,12]", "found [2,2,12,8]"),
    _bad("h0-too-few-states", BATCHED, _set("h0", lambda t: t["h0"][:1]), "tensor 'h0'", "N=2", "found 1"),
    _bad("dht-too-many-states", VARLEN, _set("dht", lambda t: torch.cat([t["dht"], t["dht"]])), "tensor 'dht'",
         "N=3", "len(cu_seqlens)-1", "found 6"),
    _bad("q-int", BATCHED, _set("q", lambda t: t["q"].to(torch.int32)), "tensor 'q'", "float dtype", "int32"),
    _bad("beta-bool", BATCHED, _set("beta", lambda t: t["beta"] > 0), "tensor 'beta'", "float dtype", "bool"),
    _bad("A_log-float8", BATCHED, _set("A_log", lambda t: t["A_log"].to(torch.float8_e4m3fn)), "tensor 'A_log'",
         "float8_e4m3fn"),
    _bad("cu_seqlens-float", VARLEN, _set("cu_seqlens", lambda t: t["cu_seqlens"].float()), "tensor 'cu_seqlens'",
         "integer dtype", "float32"),
    _bad("cu_seqlens-not-from-0", VARLEN, _set("cu_seqlens", torch.tensor([1, 17, 33])), "tensor 'cu_seqlens'",
         "start at 0, found 1"),
    _bad("cu_seqlens-decreasing", VARLEN, _set("cu_seqlens", torch.tensor([0, 17, 1, 33])), "tensor 'cu_seqlens'",
         "non-decreasing", "cu_seqlens[2]=1 < cu_seqlens[1]=17"),
    _bad("cu_seqlens-short-of-T", VARLEN, _set("cu_seqlens", torch.tensor([0, 1, 17, 32])), "tensor 'cu_seqlens'",
         "end at T=33", "found 32"),
    _bad("cu_seqlens-with-B2", BATCHED, _chain(_set("cu_seqlens", torch.tensor([0, 5, 20])), _drop("h0", "dht")),
         "tensor 'cu_seqlens'", "B == 1", "B=2"),
    _bad("cu_seqlens-2d", VARLEN, _set("cu_seqlens", torch.tensor([[0, 1, 17, 33]])), "tensor 'cu_seqlens'",
         "[N+1]", "found [1,4]"),
    _bad("gate-unknown", BATCHED, _meta(gate="sigmoid"), "config gate", "'sigmoid'"),
    _bad("layout-unknown", BATCHED, _meta(state_layout="VKK"), "config state_layout", "'VKK'"),
    _bad("scale-not-a-number", BATCHED, _meta(scale="1/8"), "config scale", "a number", "'1/8'"),
    _bad("scale-nan", BATCHED, _meta(scale="nan"), "config scale", "finite"),
    _bad("bool-not-true-false", BATCHED, _meta(qk_l2norm="maybe"), "config qk_l2norm", "true or false"),
    _bad("chunk-size-48", BATCHED, _meta(chunk_size="48"), "config chunk_size", "16, 32 or 64", "'48'"),
    _bad("chunk-size-text", BATCHED, _meta(chunk_size="big"), "config chunk_size", "'big'"),
    _bad("lower_bound-gate-no-A_log", BATCHED, _chain(_drop("A_log"), _meta(gate="lower_bound")),
         "tensor 'A_log'", "missing", "gate=lower_bound"),
    _bad("softplus-gate-no-dt_bias", BATCHED, _chain(_drop("dt_bias"), _meta(gate="softplus")),
         "tensor 'dt_bias'", "missing", "gate=softplus"),
    _bad("default-gate-no-dt_bias", BATCHED, _chain(_drop("dt_bias"), lambda t, m: m.pop("gate")),
         "tensor 'dt_bias'", "gate=lower_bound"),
    _bad("override-gate-needs-A_log", with_size(BATCHED, gate="none"), lambda t, m: None, "tensor 'A_log'",
         "gate=softplus", overrides={"gate": "softplus"}),
    _bad("override-layout-breaks-h0", BATCHED, lambda t, m: None, "tensor 'h0'", "state_layout=kv",
         overrides={"state_layout": "kv"}),
    _bad("override-chunk-size-48", BATCHED, lambda t, m: None, "override chunk_size", "48",
         overrides={"chunk_size": 48}),
    _bad("gva-HV-not-a-multiple", GVA, _set("v", lambda t: t["v"][:, :, :3]), "tensor 'v'",
         "[B,T,HV,V] with HV a multiple of H=2", "found [1,20,3,12]"),
    _bad("gva-g-over-qk-heads", GVA, _set("g", lambda t: t["g"][:, :, :2]), "tensor 'g'",
         "[B,T,HV,K] = [1,20,4,8]", "HV=4 from v", "found [1,20,2,8]"),
    _bad("gva-beta-over-qk-heads", GVA, _set("beta", lambda t: t["beta"][:, :, :2]), "tensor 'beta'",
         "[B,T,HV] = [1,20,4]", "found [1,20,2]"),
    _bad("gva-do-over-qk-heads", GVA, _set("do", lambda t: t["do"][:, :, :2]), "tensor 'do'",
         "[B,T,HV,V] = [1,20,4,12]", "found [1,20,2,12]"),
    _bad("gva-A_log-over-qk-heads", GVA, _set("A_log", lambda t: t["A_log"][:2]), "tensor 'A_log'",
         "[HV] = [4]", "found [2]"),
    _bad("gva-dt_bias-flat-over-qk-heads", GVA, _set("dt_bias", lambda t: t["dt_bias"][:2].flatten()),
         "tensor 'dt_bias'", "[HV,K] = [4,8]", "[HV*K] = [32]", "found [16]"),
    _bad("gva-h0-over-qk-heads", GVA, _set("h0", lambda t: t["h0"][:, :2]), "tensor 'h0'",
         "[N,HV,V,K] = [1,4,12,8]", "found [1,2,12,8]"),
    _bad("gva-dht-kv-layout", GVA, _set("dht", lambda t: t["dht"].transpose(-1, -2)), "tensor 'dht'",
         "[N,HV,V,K] = [1,4,12,8]", "kv layout"),
    _bad("gva-k-over-value-heads", GVA, _set("k", lambda t: t["k"].repeat_interleave(2, 2)), "tensor 'k'",
         "[B,T,H,K] = [1,20,2,8]", "found [1,20,4,8]"),
]

# NaN/Inf values: the loader refuses them (without allow_nonfinite); inspect describes them as a finding
NONFINITE = [
    _bad("nan-in-g", BATCHED, _chain(_poke("g", (1, 3, 0, 5), float("nan")), _poke("g", (1, 4, 1, 0), float("inf"))),
         "tensor 'g'", "2 NaN/Inf (1 NaN, 1 Inf)", "first at [1,3,0,5]"),
    _bad("inf-in-h0", BATCHED, _poke("h0", (0, 1, 2, 3), float("-inf")), "tensor 'h0'", "1 NaN/Inf",
         "first at [0,1,2,3]"),
    _bad("nan-in-bf16-do", with_size(BATCHED, dtype="bfloat16"), _poke("do", (0, 0, 0, 0), float("nan")),
         "tensor 'do'", "first at [0,0,0,0]"),
]


def write_malformed(tmp_path, base, mutate, name="dump.safetensors"):
    tensors, meta = base_tensors(base)
    mutate(tensors, meta)
    path = tmp_path / name
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=meta)
    return path


@pytest.mark.parametrize("base, mutate, fragments, overrides", MALFORMED + NONFINITE)
def test_malformed_dump_is_one_line_naming_file_and_tensor(tmp_path, base, mutate, fragments, overrides):
    path = write_malformed(tmp_path, base, mutate)
    with pytest.raises(KdadbgError) as e:
        load_dump(path, overrides=overrides)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"{path}: ")
    for frag in fragments:
        assert frag in msg, msg
    assert e.value.exit_code == 2


def test_bases_are_valid(tmp_path):
    """The valid bases load, so every failure above is caused by its mutation."""
    for base in (BATCHED, VARLEN, GVA, with_size(BATCHED, dtype="bfloat16"), with_size(BATCHED, gate="none")):
        load_dump(write_malformed(tmp_path, base, lambda t, m: None))


def test_gva_dump_loads_with_flat_dt_bias(tmp_path):
    """A GVA dump as fla's layer passes it (dt_bias flat [HV*K]) loads; HV comes from v."""
    path = write_malformed(tmp_path, GVA, _set("dt_bias", lambda t: t["dt_bias"].flatten()))
    inputs, _ = load_dump(path)
    assert inputs.shape == (1, 20, 2, 8, 12) and inputs.HV == 4 and inputs.group == 2
    assert inputs.dt_bias.shape == (4, 8)
    d = describe_dump(path)
    assert d["ok"] and d["sizes"]["H"] == 2 and d["sizes"]["HV"] == 4


@pytest.mark.parametrize("content, start", [
    pytest.param(b"", "not a readable safetensors file (header too small", id="empty"),
    pytest.param(b"PK\x03\x04 this is a zip file, not safetensors" * 10, "not a readable safetensors file",
                 id="garbage"),
    pytest.param(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}", "not a readable safetensors file "
                 "(malformed header", id="header-not-json"),
    pytest.param(-100, "truncated: its header describes", id="truncated-data"),
    pytest.param(20, "truncated: its header needs", id="truncated-header"),
])
def test_unreadable_file(tmp_path, content, start):
    path = tmp_path / "bad.safetensors"
    if isinstance(content, int):
        good = write_malformed(tmp_path, BATCHED, lambda t, m: None, name="good.safetensors")
        content = good.read_bytes()[:content]
    path.write_bytes(content)
    with pytest.raises(KdadbgError) as e:
        load_dump(path)
    assert str(e.value).startswith(f"{path}: {start}"), str(e.value)


def test_file_not_found_and_folder(tmp_path):
    with pytest.raises(KdadbgError, match="nope.safetensors: file not found"):
        load_dump(tmp_path / "nope.safetensors")
    with pytest.raises(KdadbgError, match="is a folder"):
        load_dump(tmp_path)


def test_nonfinite_allowed_on_request(tmp_path):
    path = write_malformed(tmp_path, BATCHED, _poke("q", (0, 0, 0, 0), float("nan")))
    inputs, _ = load_dump(path, allow_nonfinite=True)
    assert torch.isnan(inputs.q[0, 0, 0, 0])


def test_defaults_and_overrides(tmp_path):
    tensors, _ = base_tensors(BATCHED)
    path = tmp_path / "d.safetensors"
    save_file(tensors, str(path))  # no metadata at all
    _, cfg = load_dump(path)
    assert cfg == KDAConfig(scale=8 ** -0.5, chunk_size=16, gate="lower_bound", lower_bound=-5.0, qk_l2norm=True,
                            beta_sigmoid=True, state_layout="vk")
    tensors.pop("A_log"), tensors.pop("dt_bias")
    save_file(tensors, str(path))
    assert load_dump(path)[1].gate == "none"
    _, cfg = load_dump(path, overrides={"chunk_size": 64, "scale": 0.5, "qk_l2norm": False, "lower_bound": None})
    assert (cfg.chunk_size, cfg.scale, cfg.qk_l2norm, cfg.lower_bound) == (64, 0.5, False, -5.0)


def test_int32_cu_seqlens_and_extra_tensors(tmp_path):
    def mutate(t, m):
        t["cu_seqlens"] = t["cu_seqlens"].to(torch.int32)
        t["notes.o_expected"] = torch.zeros(3)
    inputs, _ = load_dump(write_malformed(tmp_path, VARLEN, mutate))
    assert inputs.cu_seqlens.dtype == torch.int64 and inputs.cu_seqlens.tolist() == [0, 1, 17, 33]
    assert inputs.n_seqs == 3


@pytest.mark.parametrize("name", [p.stem for p in sorted(GOLDEN.glob("golden_*.safetensors"))
                                  if not p.stem.endswith(".expected")])
def test_golden_dumps_load(name):
    inputs, cfg = load_dump(GOLDEN / f"{name}.safetensors")
    assert inputs.q.dtype in (torch.float32, torch.bfloat16)
    assert cfg.chunk_size in (16, 32)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in CASES])
def test_gen_round_trip(tmp_path, case):
    path = tmp_path / f"{case.name}.safetensors"
    generate(path, case.name, seed=7)
    got, got_cfg = load_dump(path)
    want, want_cfg = make_inputs(case, seed=7)
    assert got_cfg == want_cfg
    assert [n for n, _ in got.items()] == [n for n, _ in want.items()]
    for (n, a), (_, b) in zip(got.items(), want.items()):
        assert a.dtype == b.dtype and torch.equal(a, b), n


def test_gen_sizes_and_seed(tmp_path):
    generate(tmp_path / "a.safetensors", "tail", seed=1, T=33, K=32, V=8, dtype="float64")
    generate(tmp_path / "b.safetensors", "tail", seed=2, T=33, K=32, V=8, dtype="float64")
    a, cfg = load_dump(tmp_path / "a.safetensors")
    b, _ = load_dump(tmp_path / "b.safetensors")
    assert a.shape == (1, 33, 3, 32, 8) and a.q.dtype == torch.float64 and cfg.scale == 32 ** -0.5
    assert not torch.equal(a.q, b.q)
    with pytest.raises(KdadbgError, match="cu_seqlens"):
        generate(tmp_path / "c.safetensors", "varlen", T=50)
    generate(tmp_path / "g.safetensors", "gva", H=3)          # a GVA preset keeps its group (HV = 2 H)
    g, _ = load_dump(tmp_path / "g.safetensors")
    assert g.shape[2] == 3 and g.HV == 6
    generate(tmp_path / "h.safetensors", "basic", H=1, HV=3)  # any preset takes --HV
    h, _ = load_dump(tmp_path / "h.safetensors")
    assert h.shape[2] == 1 and h.HV == 3
    with pytest.raises(KdadbgError, match="--HV: expected a multiple of H=2"):
        generate(tmp_path / "c.safetensors", "basic", HV=3)
    with pytest.raises(KdadbgError, match="unknown preset 'nope'"):
        generate(tmp_path / "c.safetensors", "nope")
    assert not (tmp_path / "c.safetensors").exists()


def _listing(folder):
    return sorted(p.name for p in folder.iterdir())


def test_save_refuses_overwrite_and_leaves_nothing_behind(tmp_path):
    inputs, cfg = make_inputs(BATCHED)
    path = tmp_path / "d.safetensors"
    path.write_bytes(b"precious")
    with pytest.raises(KdadbgError, match="already exists"):
        save_dump(path, inputs, cfg)
    assert path.read_bytes() == b"precious"
    assert _listing(tmp_path) == ["d.safetensors"]
    save_dump(path, inputs, cfg, force=True)
    assert torch.equal(load_dump(path)[0].q, inputs.q)
    assert _listing(tmp_path) == ["d.safetensors"]


def test_save_validates_before_writing(tmp_path):
    inputs, cfg = make_inputs(BATCHED)
    inputs.v = inputs.v[:, :5]
    with pytest.raises(KdadbgError, match="tensor 'v'"):
        save_dump(tmp_path / "d.safetensors", inputs, cfg)
    assert _listing(tmp_path) == []


def test_atomic_save_failure_removes_temp_file(tmp_path):
    with pytest.raises(Exception):
        atomic_save({"x": "not a tensor"}, {}, tmp_path / "x.safetensors")
    assert _listing(tmp_path) == []
    with pytest.raises(KdadbgError, match="does not exist"):
        atomic_save({"x": torch.zeros(2)}, {}, tmp_path / "no" / "x.safetensors")


def test_atomic_save_loses_race_without_clobbering(tmp_path, monkeypatch):
    """A file that appears between the existence check and the move is not overwritten."""
    path = tmp_path / "x.safetensors"
    real_save = fileio.save_file

    def save_then_race(tensors, tmp, metadata):
        real_save(tensors, tmp, metadata=metadata)
        path.write_bytes(b"other writer")
    monkeypatch.setattr(fileio, "save_file", save_then_race)
    with pytest.raises(KdadbgError, match="already exists"):
        atomic_save({"x": torch.zeros(2)}, {}, path)
    assert path.read_bytes() == b"other writer"
    assert _listing(tmp_path) == ["x.safetensors"]


def test_describe_valid_dump(tmp_path):
    def mutate(t, m):
        m.pop("scale"), m.pop("gate")
        t["extra_note"] = torch.arange(4.0)
    path = write_malformed(tmp_path, VARLEN, mutate)
    d = describe_dump(path)
    assert d["ok"] and d["verdict"] == "valid"
    assert d["sizes"] == {"B": 1, "T": 33, "H": 2, "HV": 2, "K": 8, "V": 12, "N": 3, "n_chunks": 3}
    cfg = {r["key"]: r for r in d["config"]}
    assert cfg["scale"]["default"] and cfg["scale"]["value"] == 8 ** -0.5
    assert cfg["gate"]["default"] and cfg["gate"]["value"] == "lower_bound"
    assert not cfg["chunk_size"]["default"]
    rows = {r["name"]: r for r in d["tensors"]}
    q = load_dump(path)[0].q.double()
    assert rows["q"]["shape"] == [1, 33, 2, 8] and rows["q"]["dtype"] == "float32"
    assert rows["q"]["min"] == q.min().item() and rows["q"]["max"] == q.max().item()
    assert rows["q"]["mean"] == pytest.approx(q.mean().item(), rel=1e-12)
    assert d["extra"] == ["extra_note"] and rows["extra_note"]["role"] == "extra"
    assert [r["name"] for r in d["tensors"]][:6] == ["q", "k", "v", "g", "beta", "do"]


def test_describe_invalid_dump_still_shows_tensors(tmp_path):
    path = write_malformed(tmp_path, BATCHED, _chain(_poke("g", (0, 0, 0, 0), float("nan")),
                                                     _poke("g", (0, 1, 0, 0), float("inf")),
                                                     _set("k", lambda t: t["k"][..., :7])))
    d = describe_dump(path)
    assert not d["ok"] and "tensor 'k'" in d["verdict"]
    g = {r["name"]: r for r in d["tensors"]}["g"]
    assert (g["nan"], g["inf"]) == (1, 1)
    assert g["min"] is not None and g["max"] < float("inf")  # stats over the finite values
    assert d["config"] is not None
    # the NaN/Inf are still located; the chunk is unknown without a valid layout
    assert [(r["name"], r["first"], r["token"], r["chunk"]) for r in d["nonfinite"]] == [("g", [0, 0, 0, 0], 0, None)]


@pytest.mark.parametrize("base, mutate, fragments, overrides", NONFINITE)
def test_describe_nonfinite_dump_is_valid_with_a_finding(tmp_path, base, mutate, fragments, overrides):
    """User trial, round 42: inspect called the dumps capture --when nonfinite writes invalid (exit 2). NaN/Inf
    values are a finding: the dump is valid, and each tensor holding any is listed with where its first is."""
    path = write_malformed(tmp_path, base, mutate)
    d = describe_dump(path)
    assert (d["ok"], d["verdict"]) == (True, "valid")
    name = fragments[0].split("'")[1]
    first = [int(i) for i in fragments[-1].split("[")[1].rstrip("]").split(",")]
    assert [(r["name"], r["first"]) for r in d["nonfinite"]] == [(name, first)]


@pytest.mark.parametrize("base, poke, where", [
    pytest.param(BATCHED, _poke("g", (1, 3, 0, 5), float("nan")),
                 {"batch": 1, "token": 3, "head": 0, "sequence": 1, "chunk": 2}, id="batched-g"),
    pytest.param(VARLEN, _poke("q", (0, 20, 1, 2), float("inf")),   # cu_seqlens [0,1,17,33]: chunks 0, 1, 2
                 {"batch": 0, "token": 20, "head": 1, "sequence": 2, "chunk": 2}, id="varlen-q"),
    pytest.param(GVA, _poke("beta", (0, 17, 3), float("nan")),
                 {"batch": 0, "token": 17, "head": 3, "sequence": 0, "chunk": 1}, id="gva-beta-value-head"),
    pytest.param(BATCHED, _poke("h0", (1, 0, 2, 3), float("nan")),
                 {"batch": None, "token": None, "head": 0, "sequence": 1, "chunk": None}, id="h0"),
    pytest.param(GVA, _set("dt_bias", lambda t: t["dt_bias"].flatten().index_fill(0, torch.tensor([17]),
                                                                                  float("nan"))),
                 {"batch": None, "token": None, "head": 2, "sequence": None, "chunk": None}, id="flat-dt_bias"),
])
def test_describe_nonfinite_says_where(tmp_path, base, poke, where):
    d = describe_dump(write_malformed(tmp_path, base, poke))
    assert d["ok"] and len(d["nonfinite"]) == 1
    assert {k: d["nonfinite"][0][k] for k in where} == where


def test_describe_unreadable(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(b"\x00" * 3)
    d = describe_dump(path)
    assert not d["ok"] and d["tensors"] == [] and "not a readable safetensors" in d["verdict"]



def test_unknown_metadata_keys_are_named_with_the_key_they_may_mean(tmp_path):
    """User trial, round 38: metadata {chunksize, Gate, state-layout} read as valid with every config key at its
    default and no word of the three; inspect (text and JSON) and run/diff's note now name each key not read,
    with the config key it may be meant as."""
    from kdadbg.dump import extra_tensors_note
    from safetensors.torch import load_file

    path = tmp_path / "d.safetensors"
    inputs, cfg = make_inputs(get_case("basic"))
    save_dump(path, inputs, cfg)
    t = load_file(str(path))
    typo = tmp_path / "typo.safetensors"
    save_file(t, str(typo), metadata={"chunksize": "64", "Gate": "softplus", "state-layout": "kv", "model": "m1"})
    desc = describe_dump(typo)
    assert desc["ok"] and sorted(desc["unknown_metadata"]) == sorted(
        ["chunksize (chunk_size?)", "Gate (gate?)", "state-layout (state_layout?)", "model"]), desc["unknown_metadata"]
    note = extra_tensors_note(typo)
    assert "metadata keys not read" in note and "chunksize (chunk_size?)" in note, note
    assert describe_dump(path)["unknown_metadata"] == [] and extra_tensors_note(path) is None


def test_a_dump_without_upstream_gradient_is_not_a_pass(tmp_path):
    """User trial, round 38: do all zero and no dht made every gradient 0 against 0 and run PASS, whatever the
    backward: now inspect warns, and run and diff leave the gradients not compared (partial, exit 3)."""
    import json

    from test_cli import kdadbg

    inputs, cfg = make_inputs(get_case("basic"))
    inputs.do.zero_()
    inputs.dht = None
    path = save_dump(tmp_path / "z.safetensors", inputs, cfg)
    desc = describe_dump(path)
    assert desc["ok"] and len(desc["warnings"]) == 1 and "do is all zero" in desc["warnings"][0]
    grads = ["dq", "dk", "dv", "dg", "dbeta", "dh0", "dA_log", "ddt_bias"]
    for command, extra in (("run", []), ("diff", ["--window", "0"])):
        js = tmp_path / f"{command}.json"
        r = kdadbg(command, path, "--json", js, *extra)
        doc = json.loads(js.read_text())
        assert r.exit_code == 3 and doc["verdict"] == "partial", r.output
        assert sorted(doc["not_provided"]) == sorted(grads), doc["not_provided"]
        assert all("do is all zero" in why for why in doc["not_provided"].values())
        # said as not compared (they were returned), not as not provided
        assert "8 not compared (dq" in r.stdout or "dbeta, dh0, dA_log, ddt_bias not compared" in r.stdout, r.stdout
        assert "not provided (" not in r.stdout and "] not provided" not in r.stdout, r.stdout
    # a nonzero dht alone is an upstream gradient: compared as usual
    inputs2, cfg2 = make_inputs(get_case("basic"))
    inputs2.do.zero_()
    p2 = save_dump(tmp_path / "z2.safetensors", inputs2, cfg2)
    assert describe_dump(p2)["warnings"] == [] and kdadbg("run", p2).exit_code == 0


def test_inspects_stats_need_little_memory_beyond_the_tensor(monkeypatch):
    """User trial, round 40: inspect peaked at 2.2 GB on a 1.34 GB dump (a float64 copy of each tensor and its
    masks at once; measured 1231 MB against 676 MB now on a 672 MB float32 dump, T 16384, H 16). The stats go
    slice by slice, with the same figures as over the whole tensor."""
    from kdadbg import dump as dump_module

    t = torch.randn(3, 1000, dtype=torch.float32)
    t[0, 5], t[2, 7] = float("nan"), float("-inf")
    whole = dump_module._stats(t)
    monkeypatch.setattr(dump_module, "_STATS_SLICE", 257)   # slices that cut rows anywhere
    sliced = dump_module._stats(t)
    assert sliced["nan"] == whole["nan"] == 1 and sliced["inf"] == whole["inf"] == 1
    assert sliced["min"] == whole["min"] and sliced["max"] == whole["max"]
    assert abs(sliced["mean"] - whole["mean"]) <= 1e-12 * max(1.0, abs(whole["mean"]))
    fin = t[torch.isfinite(t)].double()
    assert whole["min"] == float(fin.min()) and abs(whole["mean"] - float(fin.mean())) <= 1e-12
