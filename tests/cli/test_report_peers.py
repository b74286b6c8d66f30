"""The peer comparison's report (slidedp.report.peers): speedups, the Markdown table and the figure, from rows
shaped like benchmarks.peer_compare's results.jsonl."""

import math

import pytest

from slidedp.report.peers import load_rows, plot, speedups, table_markdown


def test_speedups_and_table_from_rows(tmp_path):
    rows = [{"system": s, "model": "m", "seq": 8, "batch": b, "status": "ok", "tokens_per_s": tps,
             "step_time_s": 8 * b / tps} for s, b, tps in [("slidedp", 1, 300.0), ("slidedp", 2, 800.0),
                                                           ("fsdp2-offload", 1, 100.0), ("fsdp2-offload", 2, 200.0),
                                                           ("resident", 1, 600.0)]]
    rows.append({"system": "resident", "model": "m", "seq": 8, "batch": 2, "status": "oom"})
    rows.append({"system": "slidedp-host", "model": "m", "seq": 8, "batch": 1, "status": "ok", "tokens_per_s": 200.0,
                 "step_time_s": 0.04})
    s = speedups(rows, "m")
    assert s["fsdp2-offload"]["geomean"] == pytest.approx(math.sqrt(3.0 * 4.0))
    assert speedups(rows, "m", "slidedp-host")["fsdp2-offload"]["per_batch"] == {1: 2.0}
    assert s["resident"]["per_batch"] == {1: 0.5}  # the OOM batch is not a ratio
    assert math.isnan(s["deepspeed-offload"]["geomean"])
    table = table_markdown(rows)
    assert "| m | 2 | resident | oom |" in table and "geometric mean 3.46x" in table
    paths = plot(rows, tmp_path)
    assert all(p.stat().st_size > 0 for p in paths)


def test_load_rows_reads_results_jsonl_and_nothing_before_it_exists(tmp_path):
    assert load_rows(tmp_path) == []
    (tmp_path / "results.jsonl").write_text('{"system": "slidedp", "batch": 1}\n\n{"system": "resident", "batch": 2}\n')
    assert load_rows(tmp_path) == [{"system": "slidedp", "batch": 1}, {"system": "resident", "batch": 2}]
