"""``--plot``: the diff heatmap and the run bars are valid PNGs of a readable size, the plot data of a real
diff has the right rows, columns and statuses, and a missing matplotlib is one actionable error line."""

import sys

import pytest
import torch
from typer.testing import CliRunner

from conftest import png_size
from kdadbg import cli
from kdadbg.cases import get_case, make_inputs
from kdadbg.compare import ORDER, QUANTITIES, TAP_ORDER, compare
from kdadbg.diff import diff_dump, write_plot
from kdadbg.errors import KdadbgError
from kdadbg.reference import run_reference
from kdadbg.render.plot import (MISSING, STATUSES, bucket_columns, diff_plot_data, plot_diff, plot_run,
                                run_plot_data)
from kdadbg.run import RunResult
from kdadbg_kernels.taps import REGISTRY


def reference_runner(bad_tap=None, bad_chunk=None):
    """A kernel stand-in: the float32 chunked reference, ``bad_tap`` scaled by 1.001 in ``bad_chunk``."""
    def run(inputs, config, precision, device, sel):
        res = run_reference(inputs, config, taps=sel.names, dtype=torch.float32)
        taps = dict(res.taps)
        if bad_tap is not None:
            taps[bad_tap] = taps[bad_tap].clone()
            taps[bad_tap][bad_chunk] *= 1.001
        return res.outputs, taps
    from test_diff import StandIn
    run.calls = []
    return StandIn(run)


@pytest.fixture(scope="module")
def faulty_diff():
    inputs, cfg = make_inputs(get_case("basic"), seed=1)
    return diff_dump(inputs, cfg, reference_runner("dL", 4), dump="basic", window=0)


def fabricated(n_cols):
    """Plot data with every status, ``n_cols`` chunks wide."""
    rows = [{"name": n, "stage": REGISTRY[n].stage, "tol": 3e-5 if REGISTRY[n].stage.startswith("fwd") else 5e-5}
            for n in TAP_ORDER]
    status = [["ok"] * n_cols for _ in rows]
    values = [[-7.0] * n_cols for _ in rows]
    for i, s in enumerate(("drift", "bug", "nonfinite", "not_compared", "unrepresentable")):
        status[i + 3][n_cols // 2] = s
        values[i + 3][n_cols // 2] = {"drift": -4.2, "bug": -1.0}.get(s)
    return {"title": "fabricated", "rows": rows, "chunks": list(range(n_cols)), "log10_ratio": values,
            "status": status, "first": {"row": 4, "col": n_cols // 2}}


@pytest.mark.parametrize("n_cols", [pytest.param(1, id="one_chunk"), pytest.param(6, id="narrow"),
                                    pytest.param(200, id="wide_bucketed")])
def test_plot_diff_writes_a_png(tmp_path, n_cols):
    out = plot_diff(tmp_path / "d.png", fabricated(n_cols))
    w, h = png_size(out.read_bytes())
    assert 800 <= w <= 2400 and 400 <= h <= 1600, (w, h)
    assert out.stat().st_size < 400_000


@pytest.mark.parametrize("n_cols", [None, 1, 6, 200])
def test_plot_diff_legend_fits_the_figure(tmp_path, monkeypatch, n_cols, faulty_diff):
    """Every legend entry within the figure's width (round 38: a real diff's four entries side by side were cut
    at both edges, the tolerance band's first); None: that real diff (6 chunks, ht/dh0 grey where they are not)."""
    import kdadbg.render.plot as P
    from kdadbg.diff import write_plot

    figs = []
    save = P._save
    monkeypatch.setattr(P, "_save", lambda fig, canvas, path: figs.append(fig) or save(fig, canvas, path))
    if n_cols is None:
        write_plot(faulty_diff, tmp_path / "d.png")
    else:
        plot_diff(tmp_path / "d.png", fabricated(n_cols))
    fig = figs[0]
    renderer = fig.canvas.get_renderer()
    texts = [t.get_text() for lg in fig.legends for t in lg.get_texts()]
    for legend in fig.legends:
        box = legend.get_window_extent(renderer)
        assert box.x0 >= 0 and box.x1 <= fig.bbox.x1, (texts, box, fig.bbox)
    assert texts and (n_cols == 200 or any(t.startswith("not compared") for t in texts)), texts


def drawn(monkeypatch, tmp_path, data):
    """``(figure, RGBA grid of the heatmap's cells)`` of ``plot_diff(data)``, the figure intercepted."""
    import kdadbg.render.plot as P

    figs = []
    save = P._save
    monkeypatch.setattr(P, "_save", lambda fig, canvas, path: figs.append(fig) or save(fig, canvas, path))
    plot_diff(tmp_path / "d.png", data)
    fig = figs[0]
    return fig, fig.axes[0].get_images()[0].get_array()


def over_tolerance(rgba) -> bool:
    """In the colour map's yellow-to-red bins (not blue, not the pale band)."""
    from matplotlib.colors import to_rgba

    import kdadbg.render.plot as P

    cmap = P._colourmap()
    return tuple(rgba) in {to_rgba(cmap(b)) for b in range(P.N_LOW + P.N_BAND, P.N_BINS)}


def test_the_colour_never_contradicts_the_status(tmp_path, monkeypatch):
    """A user trial (bf16 diffs of kimi_c64 and strong_gates dumps): OK cells at 0.0199 against tol 0.02
    fell in the first yellow bin (the band's top edge rounds into it), OK cells passing on the absolute
    rule (ratio 0.032 > 0.02) were drawn yellow to red; a DRIFT cell just over its tolerance must not be
    drawn pale either. OK-by-absolute-rule cells carry a dot, explained in the legend."""
    import math

    tols = [0.02, 0.02, 5e-3]   # the band spans 5e-3 .. 2e-2
    rows = [{"name": n, "stage": "bwd_prepare", "tol": t} for n, t in zip(("dkd", "dgT", "dg"), tols)]
    lg = math.log10
    values = [[lg(0.0199), lg(0.02), lg(0.032), lg(0.021), -4.0],
              [lg(0.02 * (1 - 1e-12)), lg(0.019999), -1.0, lg(0.02 * (1 + 1e-9)), -4.0],
              [0.5, lg(5e-3), lg(5.01e-3), lg(5.0001e-3), -3.0]]
    status = [["ok", "ok", "ok", "drift", "ok"],
              ["ok", "ok", "ok", "drift", "ok"],
              ["ok", "ok", "ok", "bug", "ok"]]
    data = {"title": "t", "rows": rows, "chunks": list(range(5)), "log10_ratio": values, "status": status,
            "first": None}
    fig, rgba = drawn(monkeypatch, tmp_path, data)
    for i in range(3):
        for j in range(5):
            assert over_tolerance(rgba[i][j]) == (status[i][j] != "ok"), (rows[i]["name"], j, status[i][j])
    from matplotlib.colors import to_rgba

    import kdadbg.render.plot as P

    dots = [c for c in fig.axes[0].collections if len(c.get_facecolors()) and
            tuple(c.get_facecolors()[0]) == to_rgba(P.ABSOLUTE)]
    # (column, row) of the OK cells over their row's tolerance
    assert sorted(map(tuple, dots[0].get_offsets().tolist())) == [(0, 2), (2, 0), (2, 1), (2, 2)]
    texts = [t.get_text() for lg_ in fig.legends for t in lg_.get_texts()]
    assert any(t.startswith("OK on the absolute rule") for t in texts), texts
    # no OK cell over its tolerance: no dot, no legend entry
    fig, _ = drawn(monkeypatch, tmp_path, fabricated(6))
    assert not any(t.get_text().startswith("OK on the absolute rule") for lg_ in fig.legends
                   for t in lg_.get_texts())


def test_the_subtitle_names_the_first_divergences_head(tmp_path, monkeypatch):
    """The text report names the first divergence's head; the figure's subtitle did not (user trial)."""
    data = fabricated(6)
    data["first"].update(head=2)
    fig, _ = drawn(monkeypatch, tmp_path, data)
    assert f"{TAP_ORDER[4]} ({REGISTRY[TAP_ORDER[4]].stage}) at chunk 3, head 2: BUG" in fig._suptitle.get_text()
    data["first"].update(head=1, value_heads=[2, 3])    # dq/dk under GVA: a q/k head, as the text says it
    fig, _ = drawn(monkeypatch, tmp_path, data)
    assert "at chunk 3, q/k head 1 (value heads 2-3): BUG" in fig._suptitle.get_text()


NAME = "kimi_varlen_dump_name.safetensors"
LONG_PATHS = [pytest.param("/home/someone/kimi_linear_experiments/varlen_sweeps/run_0042/layer_17/" + NAME, id="long"),
              pytest.param("/home/someone/" + "a_rather_long_folder_name/" * 8 + NAME, id="wider_than_the_figure")]


def titles(fig) -> list[str]:
    """The lines of the figure's titles (suptitle and axes titles), each checked to lie within the figure's width."""
    renderer = fig.canvas.get_renderer()
    texts = [t for t in (fig._suptitle, *(ax.title for ax in fig.axes)) if t is not None and t.get_text()]
    for t in texts:
        box = t.get_window_extent(renderer)
        assert box.x0 >= 0 and box.x1 <= fig.bbox.x1, (t.get_text(), box, fig.bbox)
    return [line for t in texts for line in t.get_text().split("\n")]


@pytest.mark.parametrize("path", LONG_PATHS)
@pytest.mark.parametrize("command", ["run", "diff"])
def test_a_long_dump_path_fits_the_title(tmp_path, monkeypatch, command, path):
    """A user trial: ``run --plot``'s title was cut at the left edge (``adbg run: /tmp/trialA_user/d/kimivar…``);
    ``diff --plot`` broke a long path anywhere, its file name included. Every title line lies within the figure;
    the path is whole where it fits a line, else its file name is."""
    import kdadbg.render.plot as P

    figs = []
    save = P._save
    monkeypatch.setattr(P, "_save", lambda fig, canvas, p: figs.append(fig) or save(fig, canvas, p))
    if command == "run":
        ref = torch.randn(2, 8, dtype=torch.float64)
        tensors = [compare(n, ref.float(), ref).judge(1e-5) for n in ("o", "dq", "dk", "dv")]
        result = RunResult(path, "fp32", "cpu", make_inputs(get_case("basic"))[1], tensors)
        plot_run(tmp_path / "r.png", run_plot_data(result))
    else:
        plot_diff(tmp_path / "d.png", {**fabricated(6), "title": f"kdadbg diff: {path}  ·  ours vs reference  ·  "
                                                                 "fp32  ·  chunks 0:6, heads 0-1"})
    lines = titles(figs[0])
    assert any(line.startswith(f"kdadbg {command}") for line in lines), lines
    if len(path) < 120:
        assert any(path in line for line in lines), lines
    else:
        assert any(line.startswith("/home/someone/") and line.endswith("…/" + NAME) for line in lines), lines


def test_bucket_columns_keep_the_worst():
    data = fabricated(200)
    labels, values, status, per, groups = bucket_columns(data["chunks"], data["log10_ratio"], data["status"])
    assert per == 4 and len(labels) == 50 and labels[0] == "0-3" and labels[-1] == "196-199"
    assert status[4][25] == "bug" and values[4][25] == -1.0 and status[5][25] == "nonfinite"
    assert status[6][25] == "ok"            # one compared chunk in the bucket: not "not compared"
    # an UNREP cell's bucket is UNREP (hatched), not an OK cell coloured with the UNREP cell's ratio (round 38)
    assert status[7][25] == "unrepresentable"
    assert bucket_columns([0, 1, 2], [[-7.0] * 3], [["ok"] * 3])[3] == 1


def test_plot_data_of_a_real_diff(tmp_path, faulty_diff):
    data = diff_plot_data(faulty_diff)
    names = [n for n in ORDER if QUANTITIES[n].kind != "head"]    # taps and output rows, dataflow order
    assert [r["name"] for r in data["rows"]] == names
    assert [r["stage"] for r in data["rows"]] == [QUANTITIES[n].stage for n in names]
    assert data["chunks"] == list(range(6)) and data["rows"][0]["tol"] == faulty_diff.cells["gc"].tol
    i = names.index("dL")
    assert data["status"][i][4] == "bug"
    assert data["first"] == {"row": i, "col": 4, "head": faulty_diff.first_divergence["head"]}
    assert all(s == "ok" for s in data["status"][0]) and {s for r in data["status"] for s in r} <= set(STATUSES)
    assert data["log10_ratio"][i][4] > -4 > data["log10_ratio"][0][0]
    assert "basic" in data["title"] and "fp32" in data["title"]
    heads = faulty_diff.heads
    assert data["title"].endswith(f"chunks 0:6, heads {heads[0]}-{heads[-1]}"), data["title"]
    import copy

    narrow = copy.copy(faulty_diff)     # a --heads selection is named in the title (round 39: it was not)
    narrow.heads = [heads[0], heads[-1]] if len(heads) > 2 else [heads[-1]]
    assert diff_plot_data(narrow)["title"].endswith(f"heads {','.join(map(str, narrow.heads))}")
    info = write_plot(faulty_diff, tmp_path / "grid.png")
    assert info["rows"][0] == "gc" and info["chunks"] == [0, 5]
    assert png_size((tmp_path / "grid.png").read_bytes())[0] >= 800


def test_plot_data_marks_what_was_not_compared(faulty_diff):
    import copy

    res = copy.copy(faulty_diff)
    res.cells = {n: c for n, c in faulty_diff.cells.items() if n != "dki"}
    res.missing = {"taps": ["dki"], "chunks": [6], "heads": []}
    data = diff_plot_data(res)
    assert [r["name"] for r in data["rows"]] == [n for n in ORDER if QUANTITIES[n].kind != "head"]
    assert data["chunks"] == list(range(7))
    assert data["status"][[r["name"] for r in data["rows"]].index("dki")] == ["not_compared"] * 7
    assert all(row[6] == "not_compared" and v[6] is None for row, v in zip(data["status"], data["log10_ratio"]))


def test_plot_run(tmp_path):
    ref = torch.randn(2, 8, dtype=torch.float64)
    bad = ref.clone()
    bad[0, 0] = float("nan")
    low = ref.to(torch.bfloat16)
    tensors = [compare("o", ref.float(), ref).judge(1e-5), compare("dq", ref * 1.1, ref).judge(1e-5),
               compare("dk", bad, ref).judge(1e-5),
               compare("dv", low, ref).judge(1e-5).judge_storage(low.dtype, compare("dv", low, ref).ratio, 8e-3)]
    result = RunResult("d.safetensors", "fp32", "cpu", make_inputs(get_case("basic"))[1], tensors)
    data = run_plot_data(result)
    assert [t["name"] for t in data["tensors"]] == ["o", "dq", "dk", "dv"]
    assert [t["passed"] for t in data["tensors"]] == [True, False, False, False]
    assert [t["unrep"] for t in data["tensors"]] == [False, False, False, True] and result.passed is False
    assert "chunks" not in data["title"]
    result.window = [2, 5]          # run --chunks 2:5: the title says the window compared
    assert "  ·  chunks 2:5\n" in run_plot_data(result)["title"]
    assert data["tensors"][2]["ratio"] is None and data["tensors"][2]["nonfinite"] == 1
    w, h = png_size(plot_run(tmp_path / "r.png", data).read_bytes())
    assert 600 <= w <= 1600 and 250 <= h <= 1000


def test_plot_refuses_a_missing_folder(tmp_path):
    with pytest.raises(KdadbgError, match="existing folder"):
        plot_diff(tmp_path / "no" / "d.png", fabricated(3))


@pytest.fixture
def no_matplotlib(monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)    # makes `import` raise ImportError


def test_missing_matplotlib_is_one_error_line(tmp_path, no_matplotlib):
    with pytest.raises(KdadbgError) as e:
        plot_diff(tmp_path / "d.png", fabricated(3))
    assert str(e.value) == MISSING == ("--plot needs matplotlib: pip install matplotlib (in a kdadbg checkout: pip "
                                       "install -e '.[plot]')")
    from kdadbg.dump import save_dump

    dump = save_dump(tmp_path / "basic.safetensors", *make_inputs(get_case("t1")))
    for command in ("diff", "run"):     # refused before any compute
        r = CliRunner().invoke(cli.app, [command, str(dump), "--device", "cpu", "--plot", str(tmp_path / "p.png")])
        assert r.exit_code == 2, r.output
        assert r.stderr.strip() == f"error: {MISSING}"
        assert not (tmp_path / "p.png").exists()


@pytest.mark.parametrize("command", ["run", "diff"])
@pytest.mark.parametrize("name, found", [pytest.param("out.jpg", "the suffix '.jpg'", id="jpg"),
                                         pytest.param("out.txt", "the suffix '.txt'", id="txt"),
                                         pytest.param("out", "no suffix", id="no-suffix")])
def test_plot_refuses_a_name_not_ending_in_png(command, name, found, tmp_path):
    """A --plot name that is not .png is refused in one line before any compute, and nothing is written."""
    from conftest import REPO

    r = CliRunner().invoke(cli.app, [command, str(REPO / "sample_inputs" / "basic.safetensors"), "--impl",
                                     "reference", "--plot", str(tmp_path / name), "--json", str(tmp_path / "r.json")])
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --plot ") and "expected a file name ending in .png" in \
        lines[0] and found in lines[0], r.stderr
    assert list(tmp_path.iterdir()) == []


def test_plot_accepts_png_in_any_case(tmp_path):
    from kdadbg.render.plot import check_plot

    for name in ("a.png", "a.PNG", "a.Png", ".png"):   # '.png': a hidden file, no suffix for pathlib
        check_plot(tmp_path / name)
