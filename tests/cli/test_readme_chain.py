"""The README's examples chain as written: the policy a tune example writes is what the train examples load.

Each ``slidedp tune`` command in the README's bash blocks runs verbatim in a scratch directory; each complete
``slidedp train`` command then resolves its settings against what the tunes wrote (the same code path that
refuses a batch that disagrees with the policy), without training: the README's models need a GPU.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from slidedp.cli import build_parser, main
from slidedp.commands.train_args import build_train_spec
from slidedp.model_spec import load_model_spec
from slidedp.workload import StepWorkload

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_commands(tool: str) -> list[list[str]]:
    """argv of every ``slidedp <tool>`` line in the README's bash blocks (continuations joined, comments cut)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv[:2] == ["slidedp", tool]:
                commands.append(argv[1:])
    return commands


def test_readme_has_a_tune_and_train_chain():
    assert len(readme_commands("tune")) >= 2 and len(readme_commands("train")) >= 3


def test_readme_train_examples_run_against_the_policies_its_tune_examples_write(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for argv in readme_commands("tune"):
        if "--hosts" in argv:  # the several-host example tunes a 72B model for a minute: parsed, not run
            build_parser().parse_args(argv)
            continue
        assert main(argv) == 0, capsys.readouterr().err
        shown = capsys.readouterr().out.splitlines()
        # The ranked table fits an 80-column terminal without cutting cells, shows the GPU-held units and
        # marks the rows that only the analytical model priced.
        assert max(map(len, shown)) <= 80 and not any("\u2026" in line for line in shown), "\n".join(shown)
        assert any(line.split()[:3] == ["#", "step", "s"] and "held" in line for line in shown)
        assert any("* = analytical model only" in line for line in shown)
    checked = 0
    for argv in readme_commands("train"):
        if "..." in argv:  # a sketch with elided flags (the resume example)
            continue
        assert "--steps" in argv, f"README train example without --steps: {shlex.join(argv)}"
        args = build_parser().parse_args(argv)
        if args.nnodes and args.nnodes > 1:
            continue  # its policy comes from the tune example that is parsed, not run
        spec = build_train_spec(args, log=lambda _msg: None)
        assert spec.policy.sequences_per_rank() * args.nproc == args.batch
        # The trainer's own workload (its thread and batch checks against the run's hardware profile).
        hw = spec.hardware if spec.hardware.num_gpus == args.nproc else spec.hardware.with_gpus(args.nproc)
        StepWorkload(load_model_spec(args.model), hw, spec.policy, args.seq, args.batch)
        checked += 1
    assert checked >= 2


@pytest.mark.parametrize("tool", ["simulate", "sweep", "report", "calibrate", "validate"])
def test_readme_examples_parse(tool):
    commands = [argv for argv in readme_commands(tool) if not any("|" in a or "..." in a for a in argv)]
    assert commands, f"no complete `slidedp {tool}` example in the README"  # synopses of alternatives left out
    for argv in commands:
        build_parser().parse_args(argv)
