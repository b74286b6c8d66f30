"""Fault census (issue #15's "Show"): run >= 200 faults and malformed inputs against a SlideDP checkout and
count how each one ended.

The checkout under test is driven only through its CLI, as subprocesses of a given python (a venv with that
checkout installed), so an old commit can be measured the same way as today's: nothing of the checkout is
imported here. Every case runs alone in its own scratch directory, in its own session, bounded in time
(a timeout, then SIGKILL of its session) and memory (RLIMIT_AS); afterwards the census looks for what it
left behind: SlideDP state in /dev/shm and processes still running (found by a token in their environment),
removes both and counts them as a leak.

Outcomes (one per case, first match wins; :func:`classify`):
  hang               the case ran past its timeout
  leak               state left in /dev/shm, a process left running, or the state readable by another user
  clean refusal      a case that should be refused: exit 2 and exactly one ``slidedp: error:`` line
                     (argparse's own ``slidedp <cmd>: error:`` counts), no traceback
  traceback          a Python traceback on stderr (torchrun's own shutdown report excepted in kill cases)
  accepted silently  exit 0 where the case should be refused, or a run that ended with a corrupt, attacker's
                     or NaN result
  survived correctly a case a run should survive (a kill, a leftover, a planted directory), and it did:
                     the checks of that case hold
  other failure      anything else (a wrong exit code, several error lines, a lost checkpoint, ...)

Usage (serial, ~20-30 min on 2 cores):
  python -m benchmarks.fault_census --checkout /work/wt/census-old --python /work/venvs/census-old/bin/python \\
      --label before --out benchmarks/results/census-2026-12-03
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

OUTCOMES = ("clean refusal", "survived correctly", "traceback", "hang", "accepted silently", "leak", "other failure")
ERROR_LINE = re.compile(r"^slidedp(?: [\w-]+)?: error:")
TOKEN_ENV = "SLIDEDP_CENSUS_TOKEN"
MEMORY_LIMIT = 8 * 2**30  # address space per process: enough for torch and two gloo ranks, not for a bomb
SHM = Path("/dev/shm")


@dataclass
class Result:
    """How one subprocess ended."""

    rc: int | None
    stderr: str
    timed_out: bool
    seconds: float


@dataclass
class Observation:
    """What a case saw: the main command's result, the case's own check (for cases a run should survive, or
    a result to inspect), and what the census found left behind."""

    result: Result
    check: tuple[bool, str] | None = None
    leaked: list[str] = field(default_factory=list)
    kill_case: bool = False


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ERROR_LINE.match(line)]


def has_traceback(stderr: str, kill_case: bool) -> bool:
    """A Python traceback; in kill cases torchrun's report of the signal it got is not one of ours."""
    if "Traceback (most recent call last)" not in stderr:
        return False
    if not kill_case:
        return True
    blocks = stderr.split("Traceback (most recent call last)")[1:]
    return any("SignalException" not in b.split("\n\n")[0] and "torch/distributed" not in b for b in blocks)


def classify(expect: str, obs: Observation) -> tuple[str, str]:
    """(outcome, why) of one case; ``expect`` is "refuse" or "survive"."""
    r = obs.result
    if r.timed_out:
        return "hang", f"still running after {r.seconds:.0f} s"
    if obs.leaked:
        return "leak", "; ".join(obs.leaked)[:300]
    if expect == "refuse":
        if obs.check is not None and not obs.check[0] and r.rc == 0:
            return "accepted silently", obs.check[1]
        if r.rc == 0:
            return "accepted silently", "exit 0"
        if has_traceback(r.stderr, obs.kill_case):
            return "traceback", _last_line(r.stderr)
        errors = error_lines(r.stderr)
        if r.rc == 2 and len(errors) == 1:
            return "clean refusal", errors[0][:200]
        return "other failure", f"exit {r.rc}, {len(errors)} error line(s): {_last_line(r.stderr)}"
    if obs.check is not None and obs.check[0]:
        return "survived correctly", obs.check[1]
    why = obs.check[1] if obs.check is not None else "no check"
    if r.rc == 0:
        return "accepted silently", why
    if has_traceback(r.stderr, obs.kill_case):
        return "traceback", _last_line(r.stderr)
    return "other failure", f"exit {r.rc}: {why}"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


# ---- running the checkout ----------------------------------------------------------------------------------
def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


class Ctx:
    """One case's scratch directory and the means to run the checkout's CLI in it."""

    def __init__(self, python: str, scratch: Path, token: str, fixtures: Path, checkout: Path):
        self.python, self.scratch, self.token, self.fixtures = python, scratch, token, fixtures
        self.checkout = checkout
        self.outs: list[Path] = []

    def env(self, extra: dict | None = None) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLIDEDP_") and k != "PYTHONPATH"}
        env.update({TOKEN_ENV: self.token, "TORCH_EXTENSIONS_DIR": str(self.fixtures / "ext"),
                    "PYTHONWARNINGS": "ignore", "TERM": "dumb"})
        env.update(extra or {})
        return env

    def popen(self, argv: list[str], env: dict | None = None, preexec=None) -> subprocess.Popen:
        if "--out" in argv:
            self.outs.append(Path(argv[argv.index("--out") + 1]))

        def start() -> None:
            _limit_memory()
            # a shell's background job inherits SIGINT ignored, and so would every process of the run: the
            # SIGINT cases would then measure nothing
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            if preexec is not None:
                preexec()

        return subprocess.Popen([self.python, "-m", "slidedp.cli", *argv], cwd=self.scratch, env=self.env(env),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace",
                                start_new_session=True, preexec_fn=start)

    def cli(self, argv: list[str], env: dict | None = None, timeout: float = 60.0, preexec=None) -> Result:
        t0 = time.monotonic()
        proc = self.popen(argv, env, preexec)
        return finish(proc, t0, timeout)


def finish(proc: subprocess.Popen, t0: float, timeout: float) -> Result:
    try:
        _, err = proc.communicate(timeout=max(1.0, timeout - (time.monotonic() - t0)))
        return Result(proc.returncode, err[-20000:], False, time.monotonic() - t0)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        return Result(None, err[-20000:], True, time.monotonic() - t0)


def processes_with(token: str) -> list[int]:
    mine = os.getpid()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == mine:
            continue
        with contextlib.suppress(OSError):
            if f"{TOKEN_ENV}={token}".encode() in (proc / "environ").read_bytes():
                found.append(int(proc.name))
    return found


def shm_entries() -> set[Path]:
    return set(SHM.glob("slidedp-*"))


def sweep_leftovers(ctx: Ctx, before: set[Path], grace: float = 30.0) -> list[str]:
    """What the case left: its processes (waited for up to ``grace``, then killed) and its /dev/shm state
    (new entries whose owner.json names one of its run directories, or, for the old naming, whose name is
    the sha1 of one); everything found is removed."""
    import hashlib

    leaked = []
    t0 = time.monotonic()
    while processes_with(ctx.token) and time.monotonic() - t0 < grace:
        time.sleep(0.25)
    alive = processes_with(ctx.token)
    if alive:
        leaked.append(f"{len(alive)} process(es) still running")
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    outs = {str(o.resolve()) for o in ctx.outs}
    old_names = {"slidedp-" + hashlib.sha1(o.encode()).hexdigest()[:16] for o in outs}
    for entry in sorted(shm_entries() - before):
        owner = None
        with contextlib.suppress(OSError, ValueError, TypeError):
            owner = json.loads((entry / "owner.json").read_text()).get("out")
        if entry.name in old_names or owner in outs:
            size = sum(f.stat().st_size for f in entry.iterdir() if f.is_file() and not f.is_symlink())
            leaked.append(f"{entry.name} left in /dev/shm ({size} bytes)")
            shutil.rmtree(entry, ignore_errors=True)
    return leaked


# ---- the census ---------------------------------------------------------------------------------------------
def checkout_of(python: str) -> str:
    code = "import slidedp, slidedp.runtime, os; print(os.path.dirname(os.path.dirname(slidedp.runtime.__file__)))"
    return subprocess.run([python, "-c", code], capture_output=True, text=True, cwd="/", check=True).stdout.strip()


def run_census(python: str, checkout: Path, only: str | None, limit: int | None) -> list[dict]:
    from benchmarks import fault_census_cases as cases_mod

    root = Path(tempfile.mkdtemp(prefix="slidedp-census-"))
    os.chmod(root, 0o755)  # the other-user cases read below it as nobody
    fixtures = root / "fixtures"
    fixtures.mkdir()
    rows = []
    try:
        cases_mod.build_fixtures(python, fixtures, checkout)
        cases = [c for c in cases_mod.all_cases() if only is None or c.category == only][:limit]
        for i, case in enumerate(cases):
            scratch = root / f"case{i:03d}"
            scratch.mkdir()
            os.chmod(scratch, 0o755)
            ctx = Ctx(python, scratch, f"{os.getpid()}-{i}", fixtures, checkout)
            before = shm_entries()
            t0 = time.monotonic()
            try:
                obs = case.run(ctx)
            except Exception as exc:  # a defect of the census itself: recorded, never hidden
                obs = Observation(Result(None, f"census error: {type(exc).__name__}: {exc}", False, 0.0),
                                  (False, f"census error: {type(exc).__name__}: {exc}"))
            obs.leaked += sweep_leftovers(ctx, before)
            outcome, why = classify(case.expect, obs)
            row = {"case": case.name, "category": case.category, "expect": case.expect, "outcome": outcome,
                   "why": why, "rc": obs.result.rc, "seconds": round(time.monotonic() - t0, 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
            shutil.rmtree(scratch, ignore_errors=True)
    finally:
        cases_mod.cleanup()
        for pid in processes_with(f"{os.getpid()}-"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)
    return rows


def table(rows: list[dict]) -> str:
    """Counts by category x outcome as a Markdown table."""
    cats = sorted({r["category"] for r in rows})
    counts = Counter((r["category"], r["outcome"]) for r in rows)
    head = "| category | " + " | ".join(OUTCOMES) + " | total |"
    lines = [head, "|" + " --- |" * (len(OUTCOMES) + 2)]
    for cat in [*cats, "all"]:
        cells = [sum(n for (c, o), n in counts.items() if o == out and (cat == "all" or c == cat)) for out in OUTCOMES]
        lines.append(f"| {cat} | " + " | ".join(str(n) for n in cells) + f" | {sum(cells)} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", required=True, type=Path, help="the SlideDP checkout under test")
    parser.add_argument("--python", required=True, help="a python with that checkout installed")
    parser.add_argument("--label", required=True, help="names the output files (e.g. before, after)")
    parser.add_argument("--out", required=True, type=Path, help="results directory")
    parser.add_argument("--only", help="one category")
    parser.add_argument("--limit", type=int, help="the first N cases (a quick look)")
    parser.add_argument("--update", action="store_true",
                        help="replace only the rows of the cases run now in an existing <label>.jsonl")
    parser.add_argument("--from-log", type=Path, help="with --update: start <label>.jsonl from the rows an "
                        "interrupted census printed")
    args = parser.parse_args()
    found = Path(checkout_of(args.python)).resolve()
    if found != args.checkout.resolve():
        parser.error(f"{args.python} imports slidedp from {found}, not {args.checkout}")
    commit = subprocess.run(["git", "-C", str(args.checkout), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    if args.update and args.from_log and not (args.out / f"{args.label}.jsonl").exists() and args.only is None:
        parser.error("--from-log needs --only (the categories the log lacks)")
    rows = run_census(args.python, args.checkout, args.only, args.limit)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.update:
        target = args.out / f"{args.label}.jsonl"
        if not target.exists() and args.from_log:  # rows printed by an interrupted census of this commit
            printed = [line for line in args.from_log.read_text().splitlines() if line.startswith('{"case"')]
            target.write_text("\n".join([json.dumps({"commit": commit, "checkout": str(args.checkout)}), *printed]))
        lines = target.read_text().splitlines()
        header, previous = json.loads(lines[0]), [json.loads(line) for line in lines[1:]]
        if header["commit"] != commit:
            parser.error(f"{args.label}.jsonl is of commit {header['commit']}, the checkout is at {commit}")
        fresh = {r["case"]: r for r in rows}
        rows = [fresh.pop(r["case"], r) for r in previous] + list(fresh.values())
    with open(args.out / f"{args.label}.jsonl", "w") as fh:
        fh.write(json.dumps({"commit": commit, "checkout": str(args.checkout), "cases": len(rows)}) + "\n")
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    (args.out / f"{args.label}.md").write_text(f"commit {commit}, {len(rows)} cases\n\n{table(rows)}\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
