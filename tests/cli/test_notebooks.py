"""The notebooks run top to bottom (small configurations) and leave their figures behind."""

import os
import subprocess
import sys

import pytest

from tests.builders import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.py"))


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(notebook, tmp_path):
    env = {**os.environ, "SLIDEDP_NOTEBOOK_SMALL": "1", "SLIDEDP_NOTEBOOK_OUT": str(tmp_path),
           "SLIDEDP_REPO": str(REPO), "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, str(notebook)], capture_output=True, text=True, timeout=600, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    pngs = list(tmp_path.rglob("*.png"))
    assert pngs and all(p.stat().st_size > 5_000 for p in pngs)


def test_three_notebooks():
    assert [p.stem for p in NOTEBOOKS] == ["01_simulate_paper_setting", "02_autotune", "03_calibrate_from_run"]
