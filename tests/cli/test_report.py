import json

import numpy as np
import pandas as pd
import pytest

from slidedp.cli import main
from slidedp.exposure import exposure_from_trace
from slidedp.hardware import load_hardware
from slidedp.model_spec import load_model_spec
from slidedp.problem import resolve_problem
from slidedp.report import plots
from slidedp.report.rundir import RAW_ARCHIVE, load_run, unpack_session, write_run_dir
from slidedp.report.summary import build_report
from slidedp.run_summary import RunSummary
from slidedp.sim import simulate
from slidedp.sweep import POLICY_PRESETS, run_sweep


@pytest.fixture(scope="module")
def sim_result():
    *_, w = resolve_problem("qwen3-0.6b", "h100-sxm-x4", None, 2048, 8, None)
    return simulate(w)


@pytest.fixture(scope="module")
def sweep_table():
    model, hw = load_model_spec("qwen3-0.6b"), load_hardware("h100-sxm-x4")
    policies = [(n, POLICY_PRESETS[n]) for n in ("sharded", "replicated")]
    return run_sweep(model, hw, [1024], [4, 8, 16], [1, 2, 4], policies)


def _nontrivial(path, min_bytes=5_000):
    assert path.exists() and path.stat().st_size > min_bytes, path


def test_timeline_plots_exactly_the_trace(sim_result, tmp_path):
    plotted = plots.gantt(sim_result.trace, tmp_path / "t", "timeline")
    _nontrivial(tmp_path / "t.png")
    _nontrivial(tmp_path / "t.svg")
    trace = sim_result.trace
    expected = (trace.end_s - trace.start_s).groupby([trace.resource, trace["rank"], trace.op]).sum()
    got = plotted.set_index(["resource", "rank", "op"])["busy_s"]
    pd.testing.assert_series_equal(got.sort_index(), expected.sort_index(), check_names=False)
    assert plotted.ops.sum() == len(trace)


def test_host_bandwidth_integrates_to_the_host_bytes(sim_result):
    bw = plots.host_bandwidth(sim_result.trace)
    integral = float(np.sum(bw.rate.to_numpy()[:-1] * np.diff(bw.t.to_numpy())))
    assert integral == pytest.approx(sim_result.trace.host_bytes.sum(), rel=1e-6)


def test_exposure_bars_add_up_to_the_step(sim_result, tmp_path):
    data = plots.exposure_bars(sim_result.exposure, tmp_path / "e", "exposure")
    _nontrivial(tmp_path / "e.png")
    totals = data.drop(columns="rank").sum(axis=1)
    assert totals.to_numpy() == pytest.approx([sim_result.step_time_s] * 4, rel=1e-9)


def test_sweep_plot_shows_the_sweep_rows(sweep_table, tmp_path):
    data = plots.sweep_plot(sweep_table, tmp_path / "s", "sweep")
    _nontrivial(tmp_path / "s.png")
    by_batch = data[data.panel == "batch"]
    rows = sweep_table[sweep_table.gpus == 4]
    assert len(by_batch) == len(rows)
    merged = by_batch.merge(rows, left_on=["policy", "x"], right_on=["policy", "batch"])
    assert merged.tokens_per_s_x.to_numpy() == pytest.approx(merged.tokens_per_s_y.to_numpy())
    assert (merged.limiter_x == merged.limiter_y).all()
    by_gpus = data[data.panel == "gpus"]
    assert sorted(by_gpus.x.unique()) == [1, 2, 4] and len(by_gpus) == 6


def test_sweep_table_is_tidy_and_sharded_beats_replicated_when_host_bound(sweep_table):
    assert len(sweep_table) == 3 * 3 * 2  # batches x GPU counts x policies, every batch divisible
    assert {"gpus", "seq", "batch", "policy", "step_s", "tokens_per_s", "limiter", "fits"} <= set(sweep_table.columns)
    small = sweep_table[(sweep_table.gpus == 4) & (sweep_table.batch == 4)].set_index("policy")
    assert small.loc["sharded", "tokens_per_s"] > small.loc["replicated", "tokens_per_s"]


def test_predicted_vs_measured_reports_mape(tmp_path):
    table = pd.DataFrame({"label": ["a", "b"], "predicted_s": [1.1, 1.8], "measured_s": [1.0, 2.0]})
    data = plots.predicted_vs_measured(table, tmp_path / "v", "validation")
    _nontrivial(tmp_path / "v.png")
    assert data.attrs["mape_percent"] == pytest.approx(10.0)


def test_run_dir_round_trip_and_report(sim_result, sweep_table, tmp_path):
    run_dir = write_run_dir(tmp_path / "run", sim_result.trace, sim_result.exposure,
                            RunSummary(model="qwen3-0.6b", step_time_s=sim_result.step_time_s))
    run = load_run(run_dir)
    pd.testing.assert_frame_equal(run.trace, sim_result.trace)
    rep = build_report(run, tmp_path / "rep", sweep_table, None)
    assert set(rep.figures) == {"timeline", "exposure", "sweep"}
    text = rep.markdown.read_text()
    assert all(f"({name}.png)" in text for name in rep.figures)
    assert "<img" in rep.html.read_text()



def test_the_sweep_figure_names_the_swept_model_not_the_runs(sim_result, sweep_table, tmp_path):
    run_dir = write_run_dir(tmp_path / "run", sim_result.trace, sim_result.exposure,
                            RunSummary(model="another-model", step_time_s=sim_result.step_time_s))
    build_report(load_run(run_dir), tmp_path / "rep", sweep_table, None)
    svg = (tmp_path / "rep" / "sweep.svg").read_text()
    assert "Throughput sweep: qwen3-0.6b" in svg and "another-model" not in svg


@pytest.mark.parametrize("rows, message", [
    ("a,1.0,x\n", "measured_s must be a positive number"),
    ("a,1.0,0.5\nb,-1,2\n", "predicted_s must be a positive number"),
    ("", "has no rows"),
])
def test_a_bad_validation_table_is_one_line(sim_result, tmp_path, capsys, rows, message):
    run_dir = write_run_dir(tmp_path / "run", sim_result.trace, sim_result.exposure, RunSummary())
    (tmp_path / "v.csv").write_text("label,predicted_s,measured_s\n" + rows)
    assert main(["report", str(run_dir), "--validation", str(tmp_path / "v.csv"), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_unpack_session_joins_loose_files_and_the_raw_archive(sim_result, tmp_path):
    """A results folder with a run directory split between git (summary) and raw.tar.xz (trace) loads whole."""
    import tarfile

    staged = write_run_dir(tmp_path / "staged" / "run1", sim_result.trace, sim_result.exposure,
                           RunSummary(model="qwen3-0.6b", step_time_s=sim_result.step_time_s))
    session = tmp_path / "session" / "run1"
    session.mkdir(parents=True)
    for name in ("summary.json", "exposure.csv"):
        (session / name).write_bytes((staged / name).read_bytes())
    with tarfile.open(session.parent / RAW_ARCHIVE, "w:xz") as tar:
        tar.add(staged / "trace.parquet", arcname="run1/trace.parquet")
    tree = unpack_session(session.parent, tmp_path / "unpacked")
    assert not (tree / RAW_ARCHIVE).exists()
    run = load_run(tree / "run1")
    pd.testing.assert_frame_equal(run.trace, sim_result.trace)
    assert run.summary.model == "qwen3-0.6b"


@pytest.mark.parametrize("exposure, message", [
    ("", "cannot read exposure table"),
    ("x\n1\n", "lacks column(s): rank, compute, h2d"),
    ("rank,compute,h2d,d2h,collective,cpu,bubble\n0,abc,0,0,0,0,0\n", "compute must be a number in every row, got "
                                                                     "'abc' in row 1"),
    ("rank,compute,h2d,d2h,collective,cpu,bubble\n", "has no rows"),
])
def test_a_broken_exposure_csv_is_one_line_for_report_and_validate(sim_result, tmp_path, capsys, exposure,
                                                                    message):
    run = write_run_dir(tmp_path / "run", sim_result.trace, sim_result.exposure,
                        RunSummary(model="qwen3-0.6b", step_time_s=sim_result.step_time_s))
    (run / "exposure.csv").write_text(exposure)
    for argv in (["report", str(run), "--out", str(tmp_path / "rep")],
                 ["validate", str(run), "--hardware", "h100-sxm-x4"]):
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "rep").exists()  # nothing half-written


@pytest.mark.parametrize("broken, message", [("empty", "trace holds no operations"),
                                             ("nan", "without a finite start and end time")])
def test_a_trace_without_operations_or_times_is_one_line(sim_result, tmp_path, capsys, broken, message):
    """report drew two figures of three for such a trace, without saying why."""
    from slidedp.trace import save_trace

    trace = sim_result.trace.iloc[:0] if broken == "empty" else sim_result.trace.assign(end_s=np.nan)
    save_trace(trace, tmp_path / "t.parquet")
    capsys.readouterr()
    assert main(["report", str(tmp_path / "t.parquet"), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_a_table_cell_is_quoted_as_python_has_it(tmp_path):
    from slidedp.errors import SlideDPError
    from slidedp.report.tables import read_table

    (tmp_path / "v.csv").write_text("label,predicted_s,measured_s\na,1.0,-1\n")
    with pytest.raises(SlideDPError, match=r"got -1 in row 1$"):
        read_table(tmp_path / "v.csv", "validation table", ("label", "predicted_s", "measured_s"),
                   positive=("predicted_s", "measured_s"))


def test_trace_only_exposure_matches_the_simulators_chains(sim_result):
    inferred = exposure_from_trace(sim_result.trace, sim_result.step_time_s)
    pd.testing.assert_frame_equal(inferred, sim_result.exposure, check_exact=False, rtol=1e-9, atol=1e-12)


def test_cli_simulate_sweep_report(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["simulate", "--model", "qwen3-0.6b", "--hardware", "h200-x1", "--seq", "1024", "--batch", "2",
                 "--out", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["source"] == "simulated" and (run / "policy.yaml").exists() and (run / "hardware.yaml").exists()
    sweep = tmp_path / "sweep.parquet"
    assert main(["sweep", "--model", "qwen3-0.6b", "--hardware", "h100-sxm-x4", "--seq", "1024", "--batches", "4",
                 "8", "--policies", "sharded", "zero-offload-like", "--out", str(sweep)]) == 0
    assert len(pd.read_parquet(sweep)) == 2 * 2 * 3
    shown = capsys.readouterr().out.splitlines()
    # The printed table fits 80 columns uncut; what every row shares is said once, under it.
    assert max(map(len, shown)) <= 80 and not any("\u2026" in line for line in shown), "\n".join(shown)
    assert any("zero-offload-like" in line for line in shown)
    assert any(line.startswith("every row: seq 1024") for line in shown)
    assert main(["report", str(run), "--sweep", str(sweep), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "report.html").exists() and (tmp_path / "rep" / "sweep.svg").exists()
    capsys.readouterr()
    assert main(["report", str(run / "trace.parquet"), "--out", str(tmp_path / "rep2")]) == 0


@pytest.mark.parametrize("argv, message", [
    (["report", "/nonexistent/run"], "no run directory"),
    (["sweep", "--policies", "fastest"], "unknown policy"),
    (["sweep", "--gpu-counts", "16"], "exceeds the 4 GPU"),
    (["sweep", "--gpus", "1", "--gpu-counts", "4"], "exceeds the 1 GPU(s) of 'h100-sxm-x4' in use (--gpus)"),
    (["sweep", "--gpus", "2", "--hosts", "2"], "hardware 'h100-sxm-x4' has no network section"),
    (["sweep", "--out", "table.xlsx"], ".csv or .parquet"),
    (["sweep", "--batch", "8", "--batches", "4", "8"], "give --batches or --batch, not both"),
    (["sweep", "--seq", "1024", "--seqs", "2048"], "give --seqs or --seq, not both"),
])
def test_report_and_sweep_errors(capsys, argv, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_sweep_takes_a_single_batch_and_seq_as_its_axes(tmp_path, capsys):
    """--batch alone sweeps that one batch (it was dropped for the default 4-64), --seq alone that one length."""
    out = tmp_path / "s.csv"
    assert main(["sweep", "--model", "qwen3-0.6b", "--hardware", "h100-sxm-x4", "--seq", "1024", "--batch", "8",
                 "--analytical", "--out", str(out)]) == 0
    table = pd.read_csv(out)
    assert set(table["batch"]) == {8} and set(table["seq"]) == {1024}
    assert main(["sweep", "--model", "qwen3-0.6b", "--hardware", "h100-sxm-x4", "--analytical", "--gpu-counts", "1",
                 "--out", str(out)]) == 0
    table = pd.read_csv(out)
    assert sorted(set(table["batch"])) == [4, 8, 16, 32, 64] and set(table["seq"]) == {4096}


def test_sweep_names_the_gpu_counts_no_batch_divides(tmp_path, capsys):
    assert main(["sweep", "--model", "qwen3-0.6b", "--hardware", "h100-sxm-x4", "--seq", "1024", "--batches", "3",
                 "--analytical", "--out", str(tmp_path / "s.csv")]) == 0
    out = capsys.readouterr().out
    assert "left out: 2, 4 GPU(s), which no batch of [3] divides" in out and "2 points written" in out


def test_simulate_names_a_profile_cut_to_fewer_gpus_plainly(capsys):
    """The header reads "h100-sxm-x4 (1 GPU used)", not the cut profile's internal name "h100-sxm-x4@1"."""
    assert main(["simulate", "--model", "qwen3-0.6b", "--hardware", "h100-sxm-x4", "--gpus", "1", "--seq", "1024",
                 "--batch", "2"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "on h100-sxm-x4 (1 GPU used) - seq 1024, batch 2" in first and "@" not in first
    assert main(["simulate", "--model", "qwen3-0.6b", "--hardware", "h100-sxm-x4", "--seq", "1024",
                 "--batch", "4"]) == 0
    assert "on h100-sxm-x4 (4 GPUs) - seq 1024" in capsys.readouterr().out.splitlines()[0]


def test_the_sweep_tables_step_column_keeps_three_significant_digits():
    """0.950 beside 0.944 and 12.3 (the format dropped trailing zeros: 0.95), and a sub-millisecond step keeps its
    digits (0.000412, not 0.000)."""
    from rich.console import Console

    from slidedp.commands.sweep import sweep_table

    rows = pd.DataFrame({"gpus": [1, 1, 1, 1], "batch": [1, 2, 4, 8], "step_s": [0.95, 0.944, 12.3, 0.000412],
                         "tokens_per_s": [1.0, 2.0, 3.0, 4.0], "fits": [True] * 4})
    table, _ = sweep_table(rows)
    console = Console(record=True, width=80)
    console.print(table)
    text = console.export_text()
    for cell in ("0.950", "0.944", "12.3", "0.000412"):
        assert f" {cell} " in text, text
