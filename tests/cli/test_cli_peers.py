"""`slidedp simulate --system` and `slidedp sweep --systems`: peers on the command line and in one sweep table."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from slidedp.cli import main
from slidedp.hardware import load_hardware
from slidedp.model_spec import load_model_spec
from slidedp.report import plots
from slidedp.sweep import POLICY_PRESETS, run_sweep

SIM = ["simulate", "--model", "qwen3-0.6b", "--hardware", "h200-x1", "--seq", "2048", "--batch", "2"]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_simulate_a_peer_as_json_and_tables(capsys, tmp_path):
    code, out, err = run(capsys, *SIM, "--system", "fsdp2-offload", "--json", "--trace", str(tmp_path / "t.csv"))
    assert code == 0, err
    got = json.loads(out)
    assert got["system"] == "fsdp2-offload" and "analytical" not in got and "policy" not in got
    assert got["simulated"]["step_time_s"] > 0 and got["memory"]["host_state_bytes_per_param"] == 16
    assert {"h2d_param", "d2h_grad", "clip", "adam"} <= set(pd.read_csv(tmp_path / "t.csv").op)
    code, out, err = run(capsys, *SIM, "--system", "ddp-resident")
    assert code == 0, err
    assert "ddp-resident" in out and "simulated (DES)" in out and "analytical" not in out


def test_default_system_json_has_no_system_key(capsys):
    code, out, _ = run(capsys, *SIM, "--json")
    assert code == 0 and "system" not in json.loads(out)


@pytest.mark.parametrize("argv, message", [
    ([*SIM, "--system", "megatron"], "unknown system 'megatron'"),
    ([*SIM[:4], "h100-sxm-x1", *SIM[5:], "--system", "zero2-offload"], "no CPU AdamW rate for 'deepspeed_cpu_adam'"),
    ([*SIM, "--system", "ddp-resident", "--policy", "p.yaml"], "--policy applies to slidedp only"),
    ([*SIM, "--system", "zero2-offload", "--state", "bf16+int8"], "--state applies to slidedp only"),
    ([*SIM, "--system", "ddp-resident", "--gpu-budget", "5"], "ddp-resident does not fit"),
    (["sweep", "--model", "qwen3-0.6b", "--hardware", "h200-x1", "--batches", "1", "--systems", "slidedp", "x"],
     "unknown system 'x'"),
    (["sweep", "--model", "qwen3-0.6b", "--hardware", "h200-x1", "--batches", "1", "--systems", "ddp-resident",
      "--analytical"], "analytical model covers slidedp only"),
])
def test_bad_systems_exit_2_with_one_line(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("slidedp: error:") and message in err


def test_sweep_with_two_systems_has_one_row_per_system_and_point_and_one_line_each(tmp_path, capsys):
    table = run_sweep(load_model_spec("qwen3-0.6b"), load_hardware("h200-x1"), [1024], [1, 2, 4], [1],
                      [("sharded", POLICY_PRESETS["sharded"])], systems=["slidedp", "fsdp2-offload"])
    assert len(table) == 6 and sorted(table.system.unique()) == ["fsdp2-offload", "slidedp"]
    peer = table[table.system == "fsdp2-offload"]
    assert (peer.source == "simulated").all() and (peer.host_gib > 0).all() and peer.fits.all()
    plotted = plots.sweep_plot(table, tmp_path / "sweep", "two systems")
    assert set(plotted[plotted.panel == "batch"].policy) == {"slidedp (sharded)", "fsdp2-offload"}
    out = tmp_path / "sweep.csv"
    code, _, err = run(capsys, "sweep", "--model", "qwen3-0.6b", "--hardware", "h200-x1", "--seq", "1024",
                       "--batches", "1", "2", "--systems", "slidedp", "ddp-resident", "--policies", "sharded",
                       "--out", str(out))
    assert code == 0, err
    written = pd.read_csv(out)
    assert sorted(zip(written.system, written.batch, strict=True)) == [("ddp-resident", 1), ("ddp-resident", 2),
                                                          ("slidedp", 1), ("slidedp", 2)]


def test_a_peer_fits_by_the_machines_whole_memory_and_every_fit_takes_the_limits_given(capsys, tmp_path):
    """A peer's run is predicted, not planned: ZeRO-2-Offload's Qwen3-4B (104.1 GiB on the host; 115.9 GiB RSS
    measured there with the head untied) is judged against h200-x1's whole 125.8 GiB host, not SlideDP's planning
    margin. --host-limit applies to the peer and to a sweep's rows alike (the sweep ignored it)."""
    zero2 = ["--model", "qwen3-4b", "--hardware", "h200-x1", "--seq", "4096"]
    code, _, err = run(capsys, "simulate", *zero2, "--batch", "4", "--system", "zero2-offload")
    assert code == 0, err
    code, _, err = run(capsys, "simulate", *zero2, "--batch", "4", "--system", "zero2-offload", "--host-limit", "100")
    assert code == 2 and "host memory 104.1 GiB exceeds the limit of 100" in err
    for limit, fits in ((None, True), ("100", False)):
        out = tmp_path / f"s{limit}.csv"
        argv = ["sweep", *zero2, "--batches", "1", "--systems", "zero2-offload", "--out", str(out)]
        assert run(capsys, *argv, *(["--host-limit", limit] if limit else []))[0] == 0
        assert pd.read_csv(out)["fits"].tolist() == [fits]


def test_a_sweep_point_given_twice_is_one_row(tmp_path, capsys):
    out = tmp_path / "s.csv"
    assert run(capsys, "sweep", "--model", "qwen3-0.6b", "--hardware", "h200-x1", "--batches", "4", "4", "2", "4",
               "--seqs", "1024", "1024", "--policies", "sharded", "--analytical", "--out", str(out))[0] == 0
    assert pd.read_csv(out)["batch"].tolist() == [4, 2]
