"""RunSummary is the one layout of summary.json: every stored run directory must still load through it, and a
round trip must write back exactly the keys and values it read."""

import json
import tarfile
from pathlib import Path

import pytest

from slidedp.calibration.from_run import load_record
from slidedp.cli import main
from slidedp.errors import SlideDPError
from slidedp.report.rundir import load_run, unpack_session
from slidedp.run_summary import MemorySummary, RunSummary, SimulatedStep
from tests.builders import REPO

RESULTS = REPO / "benchmarks" / "results"
# Sessions that stored run directories (loose, or in their raw.tar.xz); some hold only benchmark tables.
SESSIONS = sorted(p for p in RESULTS.iterdir() if p.is_dir() and ((p / "raw.tar.xz").exists()
                                                                  or any(p.rglob("summary.json"))))


def _run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("summary.json"))


def _unpacked(session: Path, dest: Path) -> Path:
    """A results session as its benchmarks left it: loose files plus raw.tar.xz, and the drivers' run-directory
    tarballs inside it unpacked beside themselves."""
    tree = unpack_session(session, dest)
    for tarball in sorted(tree.rglob("*.tar.gz")):
        with tarfile.open(tarball) as fh:
            fh.extractall(tarball.parent / (tarball.name + ".d"), filter="data")
    return tree


def test_the_stored_results_hold_summaries(tmp_path):
    # a moved results folder must not turn the test below into a no-op
    assert SESSIONS and _run_dirs(_unpacked(SESSIONS[0], tmp_path))


@pytest.mark.parametrize("session", SESSIONS, ids=lambda p: p.name)
def test_every_stored_run_loads_as_a_run_and_a_record(session, tmp_path):
    runs = _run_dirs(_unpacked(session, tmp_path))
    assert runs
    for run in runs:
        data = json.loads((run / "summary.json").read_text())
        summary = RunSummary.load(run / "summary.json")
        assert summary.to_dict() == data
        if not any((run / name).exists() for name in ("trace.parquet", "trace.csv", "trace.json")):
            continue  # long_seq archives keep the summary only (traces dropped to keep them small)
        assert load_run(run).summary == summary
        record = load_record(run)
        assert record.measured_s == data["step_time_s"] and record.seq == data["seq"]
        assert record.adam_threads == data.get("adam_threads")


def test_missing_keys_read_as_none_and_are_not_written():
    s = RunSummary.from_dict({"model": "qwen3-4b", "step_time_s": 1.5})
    assert s.seq is None and s.simulated is None and s.missing("seq", "model") == ["seq"]
    assert s.to_dict() == {"model": "qwen3-4b", "step_time_s": 1.5}
    assert RunSummary().empty and not s.empty


def test_null_is_kept_apart_from_missing():
    s = RunSummary(model="m", gpu_peak_gib=None)  # a CPU run: no GPU peak, but the key is written
    assert json.loads(s.to_json()) == {"model": "m", "gpu_peak_gib": None}
    assert RunSummary.from_json(s.to_json()).given == {"model", "gpu_peak_gib"}


def test_unknown_keys_survive_a_round_trip():
    data = {"model": "m", "metadata_note": "hand-added", "future_key": [1, 2]}
    s = RunSummary.from_dict(data)
    assert s.extra == {"metadata_note": "hand-added", "future_key": [1, 2]} and s.to_dict() == data


def test_nested_sections_are_typed_and_tolerate_older_files():
    s = RunSummary.from_dict({"simulated": {"step_time_s": 2.0, "tokens_per_s": 10.0, "bottleneck": "gpu",
                                            "limiter": "compute"},
                              "memory": {"gpu_peak_gib": 1.0, "gpu_budget_gib": 2.0, "host_total_gib": 3.0,
                                         "host_state_bytes_per_param": 16.0}})
    assert isinstance(s.simulated, SimulatedStep) and s.simulated.compute_s is None
    assert s.memory == MemorySummary(1.0, 2.0, 3.0, 16.0)


def test_malformed_summary_is_one_error(tmp_path):
    (tmp_path / "summary.json").write_text("{not json")
    with pytest.raises(SlideDPError, match="malformed"):
        RunSummary.load(tmp_path / "summary.json")
    # a known key of the wrong JSON type is refused where it is read, not printed as "?" later
    for data, said in (({"step_time_s": "abc"}, "step_time_s is 'abc', not a float"), ({"gpus": 1.5}, "not an int"),
                       ({"measured": 1}, "not a bool"), ({"simulated": 3}, "not a SimulatedStep"),
                       ({"policy": [1]}, "not a dict")):
        (tmp_path / "summary.json").write_text(json.dumps(data))
        with pytest.raises(SlideDPError, match=f"malformed {tmp_path / 'summary.json'}: .*{said}"):
            RunSummary.load(tmp_path / "summary.json")
    ok = RunSummary.from_dict({"step_time_s": 2, "gpus": 4.0, "model": None, "unknown_key": "kept"})
    assert ok.step_time_s == 2 and ok.gpus == 4.0 and ok.extra == {"unknown_key": "kept"}


def test_simulate_writes_a_summary_that_reads_back(tmp_path, capsys):
    assert main(["simulate", "--model", "qwen3-0.6b", "--hardware", "h200-x1", "--seq", "1024", "--batch", "2",
                 "--json", "--out", str(tmp_path / "run")]) == 0
    printed = json.loads(capsys.readouterr().out)
    on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert printed == on_disk
    summary = load_run(tmp_path / "run").summary
    assert summary.source == "simulated" and summary.simulated.step_time_s == on_disk["simulated"]["step_time_s"]
    assert summary.to_dict() == on_disk
    # The keys slidedp simulate wrote before RunSummary existed.
    assert set(on_disk) == {"model", "model_spec", "hardware", "gpus", "seq", "batch", "tokens_per_step", "policy",
                            "source", "step_time_s", "tokens_per_s", "limiter", "bottleneck", "simulated",
                            "analytical", "model_tflops_per_gpu", "memory"}
    assert set(on_disk["simulated"]) == {"step_time_s", "tokens_per_s", "bottleneck", "limiter", "compute_s",
                                         "exposure_s"}
    assert set(on_disk["analytical"]) == {"step_time_s", "lower_bound_s", "tokens_per_s", "bottleneck", "limiter",
                                          "exposure_s"}
    assert set(on_disk["memory"]) == {"gpu_peak_gib", "gpu_budget_gib", "host_total_gib",
                                      "host_state_bytes_per_param"}
