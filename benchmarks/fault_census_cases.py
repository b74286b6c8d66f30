"""The fault census's cases (see benchmarks/fault_census.py): bad inputs for every command and loader, kills,
checkpoint corruption, attacks on the shared state, a stale kernel-build lock, a full disk.

Each case is a function of the census context that runs the checkout's CLI and returns an Observation; cases a
run should survive also return a check (did the run end as it should: checkpoint intact, result finite,
attacker's files untouched). Nothing here imports the checkout under test.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import pwd
import shutil
import signal
import struct
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from benchmarks.fault_census import Ctx, Observation, Result, finish, processes_with

TINY = dict(model_type="qwen3", vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=128,
            tie_word_embeddings=False)
TEXT = "streaming layers through a shared host state " * 60
PAUSE_ENV = "SLIDEDP_FAULT_PAUSE_IN_SAVE"  # HEAD's test hook; an older checkout ignores it (then: polled)
MOUNT_TAG = "slidedp-census-"
ORPHAN_GRACE_S = 10.0  # after the launcher has exited, its ranks must be gone within this


@dataclass(frozen=True)
class Case:
    name: str
    category: str
    expect: str  # "refuse" or "survive"
    run: Callable[[Ctx], Observation]


# ---- fixtures: shared by every case of one census (a clean checkpoint to corrupt, a profile to break) ----------
def build_fixtures(python: str, fixtures: Path, checkout: Path) -> None:
    (fixtures / "tiny.json").write_text(json.dumps(TINY))
    (fixtures / "data.txt").write_text(TEXT)
    (fixtures / "ext").mkdir()
    ctx = Ctx(python, fixtures, "fixtures", fixtures, checkout)
    for name, config in (("base", TINY), ("other", dict(TINY, num_hidden_layers=2))):
        (fixtures / f"{name}.json").write_text(json.dumps(config))
        r = ctx.cli(["train", "--model", str(fixtures / f"{name}.json"), "--data", str(fixtures / "data.txt"),
                     "--seq", "16", "--steps", "1", "--batch", "2", "--device", "cpu", "--out",
                     str(fixtures / name)], timeout=300)
        if r.rc != 0:
            raise RuntimeError(f"fixture run {name} failed: {r.stderr[-500:]}")


def cleanup() -> None:
    """A safety net: unmount whatever a census case mounted and did not unmount."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            target = line.split()[1]
            if MOUNT_TAG in target:
                subprocess.run(["umount", "-l", target], check=False)


def _train(ctx: Ctx, out: Path, *extra: str, model: str | None = None, seq: str = "16") -> list[str]:
    return ["train", "--model", model or str(ctx.fixtures / "tiny.json"), "--data", str(ctx.fixtures / "data.txt"),
            "--seq", seq, "--device", "cpu", "--out", str(out), *extra]


# ---- bad inputs -----------------------------------------------------------------------------------------------
NINE = ", ".join(["*{p}"] * 9)
BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{NINE.format(p=p)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))


def _bad_files(ctx: Ctx) -> dict[str, str]:
    d = ctx.scratch
    configs = {
        "cfg_zero_heads": dict(TINY, num_attention_heads=0), "cfg_zero_head_dim": dict(TINY, head_dim=0),
        "cfg_huge_layers": dict(TINY, num_hidden_layers=10**9), "cfg_float_layers": dict(TINY, num_hidden_layers=1e9),
        "cfg_neg_layers": dict(TINY, num_hidden_layers=-2), "cfg_zero_vocab": dict(TINY, vocab_size=0),
        "cfg_huge_vocab": dict(TINY, vocab_size=10**12), "cfg_huge_hidden": dict(TINY, hidden_size=2**40),
        "cfg_rope0": dict(TINY, rope_theta=0.0), "cfg_rope_neg": dict(TINY, rope_theta=-5.0),
        "cfg_eps_neg": dict(TINY, rms_norm_eps=-1e-6), "cfg_eps_zero": dict(TINY, rms_norm_eps=0.0),
        "cfg_no_hidden": {k: v for k, v in TINY.items() if k != "hidden_size"},
        "cfg_bad_type": dict(TINY, model_type="gpt2"), "cfg_unknown_type": dict(TINY, model_type="nonesuch"),
        "cfg_kv_mismatch": dict(TINY, num_key_value_heads=3), "cfg_string_size": dict(TINY, hidden_size="big"),
        "cfg_list": [1, 2, 3], "cfg_null": None, "cfg_bool_layers": dict(TINY, num_hidden_layers=True),
        "cfg_nan_rope": dict(TINY, rope_theta="NaN"), "cfg_ffn_zero": dict(TINY, intermediate_size=0),
        "cfg_maxpos_zero": dict(TINY, max_position_embeddings=0),
        "cfg_heads_huge": dict(TINY, num_attention_heads=2**31),
    }
    out = {}
    for name, data in configs.items():
        text = json.dumps(data) if name != "cfg_nan_rope" else json.dumps(TINY)[:-1] + ', "rope_theta": NaN}'
        (d / f"{name}.json").write_text(text)
        out[name] = str(d / f"{name}.json")
    raw = {
        "cfg_deep": "[" * 100_000 + "]" * 100_000,
        "cfg_deep_obj": '{"a":' * 50_000 + "1" + "}" * 50_000,
        "cfg_bigint": '{"model_type": "qwen3", "num_hidden_layers": ' + "9" * 5000 + "}",
        "cfg_surrogate": json.dumps(TINY)[:-1] + ', "name": "\\udc80"}',
        "cfg_empty": "",
        "cfg_truncated": json.dumps(TINY)[:40],
    }
    for name, text in raw.items():
        (d / f"{name}.json").write_text(text)
        out[name] = str(d / f"{name}.json")
    (d / "cfg_garbage.json").write_bytes(b"\xff\xfe\x00garbage")
    out["cfg_garbage"] = str(d / "cfg_garbage.json")
    policies = {
        "pol_bomb": BOMB + "chunks_per_layer: *i\n", "pol_huge_chunks": "chunks_per_layer: 1000000000000000000000\n",
        "pol_float_chunks": "chunks_per_layer: 1e12\n", "pol_inf": "micro_batch: .inf\n",
        "pol_nan": "accumulation: .nan\n", "pol_unknown": "chunkz: 3\n", "pol_route": "param_route: broadcast\n",
        "pol_list": "- 1\n- 2\n", "pol_neg": "prefetch_depth: -1\n", "pol_bool": "accumulation: true\n",
        "pol_long_string": "activation: " + "x" * 100_000 + "\n", "pol_syntax": "a: [1, 2\n",
        "pol_gsu": "gpu_state_units: -3\n", "pol_zero_mb": "micro_batch: 0\n", "pol_python_tag":
        "micro_batch: !!python/object/apply:os.system ['true']\n", "pol_deep": "a: " + "[" * 5000 + "]" * 5000 + "\n",
        "pol_surrogate": 'activation: "\\udc80"\n', "pol_empty": "", "pol_binary": "\x00\x01\x02",
        "pol_huge_accum": "accumulation: 100000000000000\n",
    }
    for name, text in policies.items():
        (d / f"{name}.yaml").write_text(text, errors="surrogatepass")
        out[name] = str(d / f"{name}.yaml")
    base = yaml.safe_load((ctx.checkout / "slidedp" / "presets" / "h200-x1.yaml").read_text())
    hw_changes = {"hw_inf": ("gpu", "h2d_gbps", float("inf")), "hw_nan": ("gpu", "d2h_gbps", float("nan")),
                  "hw_tiny": ("gpu", "matmul_tflops", 1e-300), "hw_neg_latency": ("gpu", "pcie_latency_us", -1.0),
                  "hw_zero_mem": ("gpu", "memory_gib", 0.0), "hw_neg_cores": ("host", "cores", -4),
                  "hw_huge_gpus": (None, "num_gpus", 10**9), "hw_str_rate": ("gpu", "h2d_gbps", "fast")}
    for name, (section, key, value) in hw_changes.items():
        data = json.loads(json.dumps(base))
        (data[section] if section else data)[key] = value
        (d / f"{name}.yaml").write_text(yaml.safe_dump(data))
        out[name] = str(d / f"{name}.yaml")
    (d / "hw_bomb.yaml").write_text(BOMB + "name: *i\n")
    out["hw_bomb"] = str(d / "hw_bomb.yaml")
    data_files = {"data_empty.txt": b"", "data_binary.txt": bytes(range(256)) * 40,
                  "data_surrogate.jsonl": b'{"text": "\\udc80\\ud800 lone"}\n' * 50,
                  "data_bad.jsonl": b'{"text": 1}\n{"nope": "x"}\n[1,2]\n', "data_invalid_utf8.txt": b"\xff\xfe" * 500,
                  "data_deep.jsonl": b'{"text": ' + b"[" * 50_000 + b"]" * 50_000 + b"}\n",
                  "data_bigint.jsonl": b'{"text": ' + b"9" * 5000 + b"}\n"}
    for name, blob in data_files.items():
        (d / name).write_bytes(blob)
        out[name.split(".")[0]] = str(d / name)
    (d / "data_zero_link.txt").symlink_to("/dev/zero")
    out["data_zero_link"] = str(d / "data_zero_link.txt")
    os.mkfifo(d / "data_fifo.txt")
    out["data_fifo"] = str(d / "data_fifo.txt")
    (d / "empty_dir").mkdir()
    (d / "not_a_trace.csv").write_text("a,b\n1,2\n")
    (d / "bad.parquet").write_bytes(b"PAR1" + os.urandom(200) + b"PAR1")
    out.update(empty_dir=str(d / "empty_dir"), not_a_trace=str(d / "not_a_trace.csv"),
               bad_parquet=str(d / "bad.parquet"), tmp=str(d), good=str(ctx.fixtures / "tiny.json"),
               data=str(ctx.fixtures / "data.txt"))
    return out


def _refusal(argv: list[str], timeout: float = 60.0) -> Callable[[Ctx], Observation]:
    def run(ctx: Ctx) -> Observation:
        files = _bad_files(ctx)
        args = [a.format(**files) for a in argv]
        r = ctx.cli(args, timeout=timeout)
        check = None
        out = ctx.scratch / "run"
        if r.rc == 0 and (out / "metrics.csv").exists():  # it trained: was the result finite at least?
            check = _finite_run(out)
        return Observation(r, check)

    return run


def _finite_run(out: Path) -> tuple[bool, str]:
    import csv

    with contextlib.suppress(OSError, ValueError, KeyError):
        with open(out / "metrics.csv") as fh:
            rows = list(csv.DictReader(fh))
        losses = [float(r["loss"]) for r in rows]
        if not losses or not all(math.isfinite(x) for x in losses) or any(int(r["skipped"]) for r in rows):
            return False, f"trained with non-finite or skipped steps (losses {losses})"
        return True, "finite"
    return False, "unreadable metrics"


TRAIN = ["train", "--data", "{data}", "--seq", "16", "--steps", "1", "--device", "cpu", "--out", "{tmp}/run"]
GOOD = [*TRAIN, "--model", "{good}"]


def bad_input_cases() -> list[Case]:
    argvs: list[list[str]] = [
        ["simulate", "--model", "no-such-model"], ["simulate", "--hardware", "no-such-hardware"],
        ["simulate", "--system", "no-such-system"], ["simulate", "--trace", "{tmp}/trace.txt"],
        ["simulate", "--policy", "/dev/zero"], ["simulate", "--policy", "{tmp}/missing.yaml"],
        ["simulate", "--policy", "{empty_dir}"], ["simulate", "--hardware", "/dev/zero"],
        ["tune", "--model", "no-such-model"], ["tune", "--batch", "3", "--gpus", "2", "--hardware", "h100-sxm-x4"],
        ["sweep", "--policies", "nonsense"], ["sweep", "--out", "{tmp}/sweep.txt"], ["sweep", "--systems", "nope"],
        ["report", "{tmp}/missing-run"], ["report", "{not_a_trace}"], ["report", "{bad_parquet}"],
        ["report", "{empty_dir}"], ["validate", "{empty_dir}"], ["validate", "{tmp}/missing"],
        ["calibrate", "--base", "no-such-profile"], ["calibrate", "--model", "{tmp}/missing.json"],
        ["calibrate", "--from-run", "{empty_dir}"], ["calibrate", "--from-run", "{tmp}/missing"],
        ["nonsense-command"], ["clean", "--remove", "extra"],
    ]
    for pol in ("pol_bomb", "pol_huge_chunks", "pol_float_chunks", "pol_inf", "pol_nan", "pol_unknown", "pol_route",
                "pol_list", "pol_neg", "pol_bool", "pol_long_string", "pol_syntax", "pol_gsu", "pol_zero_mb",
                "pol_python_tag", "pol_deep", "pol_surrogate", "pol_empty", "pol_binary", "pol_huge_accum"):
        argvs.append(["simulate", "--policy", "{" + pol + "}"])
    for pol in ("pol_bomb", "pol_float_chunks", "pol_zero_mb", "pol_huge_accum"):
        argvs.append([*GOOD, "--policy", "{" + pol + "}"])
    for hw in ("hw_inf", "hw_nan", "hw_tiny", "hw_neg_latency", "hw_zero_mem", "hw_neg_cores", "hw_huge_gpus",
               "hw_str_rate", "hw_bomb"):
        argvs.append(["simulate", "--hardware", "{" + hw + "}"])
    for hw in ("hw_inf", "hw_tiny", "hw_bomb"):
        argvs.append(["tune", "--hardware", "{" + hw + "}"])
    for cfg in ("cfg_zero_heads", "cfg_huge_layers", "cfg_float_layers", "cfg_neg_layers", "cfg_huge_vocab",
                "cfg_huge_hidden", "cfg_deep", "cfg_deep_obj", "cfg_bigint", "cfg_garbage", "cfg_list", "cfg_null",
                "cfg_empty", "cfg_truncated", "cfg_heads_huge"):
        argvs.append(["simulate", "--model", "{" + cfg + "}"])
    for cfg in ("cfg_zero_heads", "cfg_zero_head_dim", "cfg_huge_layers", "cfg_neg_layers", "cfg_zero_vocab",
                "cfg_huge_vocab", "cfg_huge_hidden", "cfg_rope0", "cfg_rope_neg", "cfg_eps_neg", "cfg_eps_zero",
                "cfg_no_hidden", "cfg_bad_type", "cfg_unknown_type", "cfg_kv_mismatch", "cfg_string_size",
                "cfg_bool_layers", "cfg_nan_rope", "cfg_ffn_zero", "cfg_maxpos_zero", "cfg_deep", "cfg_bigint",
                "cfg_surrogate", "cfg_garbage", "cfg_empty"):
        argvs.append([*TRAIN, "--model", "{" + cfg + "}"])
    for data in ("data_empty", "data_binary", "data_surrogate", "data_bad", "data_invalid_utf8", "data_deep",
                 "data_bigint", "data_zero_link", "data_fifo", "empty_dir"):
        argvs.append(["train", "--data", "{" + data + "}", *TRAIN[3:], "--model", "{good}"])
    argvs += [["train", "--data", "/dev/zero", *TRAIN[3:], "--model", "{good}"],
              ["train", "--data", "{tmp}/missing", *TRAIN[3:], "--model", "{good}"]]
    numbers = {"--lr": ["inf", "nan", "-1", "1e300", "-inf"], "--weight-decay": ["nan", "inf", "-1", "1e300"],
               "--max-grad-norm": ["nan", "inf", "-1"], "--min-lr-ratio": ["nan", "-1", "2", "inf"],
               "--warmup": ["-1", "1" + "0" * 30], "--total-steps": ["-1", "0x10"], "--seq": ["0", "-1", "nan",
               "1000000000"], "--steps": ["0", "-1", "1.5"], "--batch": ["0", "-1", "1" + "0" * 30],
               "--save-every": ["-1"], "--nproc": ["0", "-1", "100000"], "--gpu-budget": ["nan", "inf", "-1", "0"],
               "--host-limit": ["nan", "-1", "0"], "--seed": ["1" + "0" * 30], "--dtype": ["fp8"],
               "--device": ["cuda", "tpu", "cuda:99"], "--resume": ["{tmp}/missing-ckpt", "{data}"]}
    for option, values in numbers.items():
        for value in values:
            args = list(GOOD)
            if option in args:
                i = args.index(option)
                args[i + 1] = value
            else:
                args += [option, value]
            argvs.append(args)
    sim_numbers = {"--seq": ["0", "-1", "nan", "1" + "0" * 30], "--batch": ["0", "-1", "1" + "0" * 30],
                   "--gpus": ["0", "-1", "1000000000"], "--gpu-budget": ["nan", "inf", "-1", "0", "1e309"],
                   "--host-limit": ["nan", "-1"]}
    for cmd in ("simulate", "tune"):
        for option, values in sim_numbers.items():
            argvs += [[cmd, option, value] for value in values]
    argvs += [["tune", "--tokens-per-step", "-1"], ["tune", "--chunks", "0"], ["tune", "--chunks", "1" + "0" * 30],
              ["tune", "--top-k", "-1"], ["sweep", "--seqs", "0"], ["sweep", "--seqs", "nan"],
              ["sweep", "--batches", "-1"], ["sweep", "--gpu-counts", "0"], ["sweep", "--gpu-counts", "1" + "0" * 30]]
    cases = []
    for argv in argvs:
        name = " ".join(a if len(a) < 40 else a[:37] + "..." for a in argv if a not in TRAIN or a == "train")
        cases.append(Case(name, "bad input", "refuse", _refusal(argv)))
    return cases


# ---- kills ------------------------------------------------------------------------------------------------------
def _pids_by_rank(token: str, rank: str) -> list[int]:
    found = []
    for pid in processes_with(token):
        with contextlib.suppress(OSError):
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if f"RANK={rank}".encode() in env and b"LOCAL_RANK=" + rank.encode() in env:
                found.append(pid)
    return found


def _wait_rows(out: Path, rows: int, proc: subprocess.Popen, deadline: float) -> bool:
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError):
            if len((out / "metrics.csv").read_text().splitlines()) > rows:
                return True
        time.sleep(0.1)
    return False


def _wait_save(ctx: Ctx, out: Path, proc: subprocess.Popen, deadline: float) -> str:
    """Until a save is under way: the pause marker where the checkout has the hook (its source is read, not
    imported), else a temporary checkpoint seen by fast polling (an older checkout: the signal may land
    just after the save)."""
    hook = PAUSE_ENV in (ctx.checkout / "runtime" / "host_state.py").read_text()
    while time.monotonic() < deadline and proc.poll() is None:
        if hook and list(out.glob("checkpoint.tmp-*/FAULT_PAUSED")):
            return "paused"
        if not hook and any(out.glob("checkpoint.tmp-*")):
            return "polled"
        time.sleep(0.002)
    return "missed"


def read_checkpoint(directory: Path) -> tuple[bool, str, int | None]:
    """Is this a complete, finite checkpoint? (ok, why, data step) without the checkout's code."""
    import torch
    from safetensors.torch import load_file

    try:
        meta = json.loads((directory / "meta.json").read_text())
        tensors = load_file(str(directory / "state.safetensors"))
    except Exception as exc:  # any way of being unreadable
        return False, f"unreadable checkpoint ({type(exc).__name__})", None
    if not all(bool(torch.isfinite(t).all()) for t in tensors.values()):
        return False, "non-finite values in the checkpoint", None
    return True, "intact", int(meta.get("data_step", -1))


def _kill_case(sig: signal.Signals, target: str, when: str) -> Callable[[Ctx], Observation]:
    def run(ctx: Ctx) -> Observation:
        out = ctx.scratch / "run"
        extra = ["--nproc", "2", "--batch", "2", "--steps", "400"]
        extra += ["--save-every", "1"] if when == "save" else ["--save-every", "2"]
        t0 = time.monotonic()
        proc = ctx.popen(_train(ctx, out, *extra), env={PAUSE_ENV: "3"} if when == "save" else None)
        deadline = t0 + 150
        timing = "step"
        if when == "save":
            _wait_rows(out, 2, proc, deadline)
            timing = _wait_save(ctx, out, proc, deadline)
        elif not _wait_rows(out, 3, proc, deadline):
            timing = "never trained"
        pids = {"launcher": [proc.pid], "rank0": _pids_by_rank(ctx.token, "0"),
                "rank1": _pids_by_rank(ctx.token, "1")}.get(target, [])
        if target == "group":
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        # wait for the launcher itself, not for its stderr: orphaned ranks keep that pipe open to the end
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(1.0, 240 - (time.monotonic() - t0)))
        t1 = time.monotonic()
        while processes_with(ctx.token) and time.monotonic() - t1 < ORPHAN_GRACE_S:
            time.sleep(0.25)
        orphans = processes_with(ctx.token) if proc.poll() is not None else []
        for pid in orphans:  # the launcher is gone and ranks train on: orphans (they would finish unattended)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        result = finish(proc, t0, 240 + ORPHAN_GRACE_S)
        result.stderr = f"[timing {timing}]\n" + result.stderr
        if orphans:
            return Observation(result, (False, "orphans"), kill_case=True,
                               leaked=[f"{len(orphans)} process(es) still running {ORPHAN_GRACE_S:.0f} s after "
                                       f"the launcher exited"])
        leftovers = sorted(p.name for p in out.glob("checkpoint.*"))
        ok, why, step = read_checkpoint(out / "checkpoint")
        if not (out / "checkpoint").exists():
            return Observation(result, (False, f"no checkpoint after the kill (timing {timing}, {leftovers})"),
                               kill_case=True)
        if not ok:
            return Observation(result, (False, f"checkpoint {why} (timing {timing})"), kill_case=True)
        # the next run must resume from it (single process: the world differs, which is allowed)
        resumed = ctx.cli(_train(ctx, out, "--steps", "1", "--batch", "2", "--resume", str(out / "checkpoint")),
                          timeout=120)
        if resumed.rc != 0:
            return Observation(result, (False, f"resume failed: {resumed.stderr.strip().splitlines()[-1:]}"),
                               kill_case=True)
        left = sorted(p.name for p in out.glob("checkpoint.*"))
        if left:
            return Observation(result, (False, f"leftovers after resume: {left}"), kill_case=True)
        return Observation(result, (True, f"checkpoint step {step} intact, resumed (timing {timing})"),
                           kill_case=True)

    return run


def kill_cases() -> list[Case]:
    return [Case(f"{sig.name} {target} during {when}", "kill", "survive", _kill_case(sig, target, when))
            for when in ("step", "save") for target in ("launcher", "rank0", "rank1", "group")
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)]


# ---- checkpoint corruption ----------------------------------------------------------------------------------------
def _copy_base(ctx: Ctx, name: str = "base") -> Path:
    dst = ctx.scratch / "run" / "checkpoint"
    shutil.copytree(ctx.fixtures / name / "checkpoint", dst)
    return dst


def _header_len(path: Path) -> int:
    return struct.unpack("<Q", path.read_bytes()[:8])[0]


def _mutate_state(mutation: str) -> Callable[[Path], None]:
    def apply(ckpt: Path) -> None:
        f = ckpt / "state.safetensors"
        blob = bytearray(f.read_bytes())
        data0 = 8 + _header_len(f)
        if mutation == "truncate":
            blob = blob[:len(blob) // 2]
        elif mutation == "empty":
            blob = bytearray()
        elif mutation == "bitflip":
            blob[data0 + 1000] ^= 0x10
        elif mutation == "header_flip":
            blob[12] ^= 0x55
        elif mutation == "header_len":
            blob[:8] = struct.pack("<Q", 2**62)
        elif mutation == "random_data":
            blob[data0:data0 + 4096] = os.urandom(4096)
        elif mutation in ("nan", "nan_digest"):
            blob[data0 + 64:data0 + 68] = struct.pack("<f", float("nan"))
        elif mutation == "appended":
            blob += b"\0" * 4096
        f.write_bytes(bytes(blob))
        if mutation == "nan_digest":  # someone who also rewrote the digest: the values themselves must be checked
            import hashlib

            meta = json.loads((ckpt / "meta.json").read_text())
            if "state_blake2b" in meta:
                meta["state_blake2b"] = hashlib.blake2b(bytes(blob), digest_size=16).hexdigest()
                (ckpt / "meta.json").write_text(json.dumps(meta))
        if mutation == "missing":
            f.unlink()

    return apply


def _mutate_meta(change: Callable[[dict], object]) -> Callable[[Path], None]:
    def apply(ckpt: Path) -> None:
        meta = json.loads((ckpt / "meta.json").read_text())
        new = change(meta)
        (ckpt / "meta.json").write_text(new if isinstance(new, str) else json.dumps(meta))

    return apply


def _resume_case(mutate: Callable[[Path], None], extra: tuple[str, ...] = (), base: str = "base",
                 after: Callable[[Ctx, Path], tuple[bool, str]] | None = None) -> Callable[[Ctx], Observation]:
    def run(ctx: Ctx) -> Observation:
        ckpt = _copy_base(ctx, base)
        mutate(ckpt)
        out = ctx.scratch / "run"
        r = ctx.cli(_train(ctx, out, "--steps", "1", "--batch", "2", "--resume", str(ckpt), *extra), timeout=120)
        check = _finite_run(out) if r.rc == 0 else None
        if r.rc == 0 and after is not None and check[0]:
            check = after(ctx, out)
        return Observation(r, check)

    return run


def _no_leftovers(ctx: Ctx, out: Path) -> tuple[bool, str]:
    left = sorted(p.name for p in out.glob("checkpoint.*"))
    ok, why, step = read_checkpoint(out / "checkpoint")
    if left or not ok:
        return False, f"leftovers {left}, checkpoint {why}"
    return True, f"resumed; leftovers gone; checkpoint step {step}"


def _leftover(kind: str) -> Callable[[Path], None]:
    def apply(ckpt: Path) -> None:
        if kind == "tmp":  # a save killed before its renames: a half-written temporary directory
            tmp = ckpt.with_name("checkpoint.tmp-99999")
            tmp.mkdir()
            (tmp / "state.safetensors").write_bytes(b"\0" * 100)
        elif kind == "old_only":  # killed between the renames: only the moved-aside old checkpoint is left
            ckpt.rename(ckpt.with_name("checkpoint.old-99999"))
        elif kind == "old_beside":
            shutil.copytree(ckpt, ckpt.with_name("checkpoint.old-99999"))

    return apply


def checkpoint_cases() -> list[Case]:
    cases = [Case(f"resume: state {m}", "checkpoint", "refuse", _resume_case(_mutate_state(m)))
             for m in ("truncate", "empty", "bitflip", "header_flip", "header_len", "random_data", "nan",
                       "nan_digest", "appended", "missing")]
    metas = {"meta broken JSON": lambda m: "{not json", "meta empty": lambda m: "",
             "meta without data_step": lambda m: m.pop("data_step", None),
             "meta negative step": lambda m: m.update(data_step=-5, optimizer_step=-5),
             "meta step is a string": lambda m: m.update(data_step="x"),
             "meta huge step": lambda m: m.update(data_step=10**30, optimizer_step=10**30),
             "meta is a list": lambda m: "[1, 2]"}
    cases += [Case(f"resume: {name}", "checkpoint", "refuse", _resume_case(_mutate_meta(change)))
              for name, change in metas.items()]
    cases += [
        Case("resume: missing meta.json", "checkpoint", "refuse",
             _resume_case(lambda c: (c / "meta.json").unlink())),
        Case("resume: another model's checkpoint", "checkpoint", "refuse", _resume_case(lambda c: None, base="other")),
        Case("resume: a file, not a directory", "checkpoint", "refuse",
             _resume_case(lambda c: (shutil.rmtree(c), c.write_text("x")))),
        Case("resume: a symlink loop", "checkpoint", "refuse",
             _resume_case(lambda c: (shutil.rmtree(c), c.symlink_to(c)))),
        Case("resume with a .tmp leftover", "checkpoint", "survive",
             _resume_case(_leftover("tmp"), after=_no_leftovers)),
        Case("resume after a kill between the renames (.old only)", "checkpoint", "survive",
             _resume_case(_leftover("old_only"), after=_no_leftovers)),
        Case("resume with a .old leftover beside the checkpoint", "checkpoint", "survive",
             _resume_case(_leftover("old_beside"), after=_no_leftovers)),
        Case("resume with another seq", "checkpoint", "survive", _resume_case(lambda c: None, ("--seq", "8"))),
        Case("resume with another batch", "checkpoint", "survive", _resume_case(lambda c: None, ("--batch", "4"))),
        Case("resume with another world (2 ranks)", "checkpoint", "survive",
             _resume_case(lambda c: None, ("--nproc", "2"))),
    ]
    return cases


# ---- the shared state and other users ----------------------------------------------------------------------------
def _old_state_name(out: Path) -> Path:
    import hashlib

    return Path("/dev/shm") / f"slidedp-{hashlib.sha1(str(out.resolve()).encode()).hexdigest()[:16]}"


def _as_nobody() -> None:
    nobody = pwd.getpwnam("nobody")
    os.setgid(nobody.pw_gid)
    os.setuid(nobody.pw_uid)


def _planted(kind: str) -> Callable[[Ctx], Observation]:
    """Another user prepares the state directory a run will use (the old predictable name; today's names are
    random, so the planted directory must simply be left alone)."""
    def run(ctx: Ctx) -> Observation:
        out = ctx.scratch / "run"
        planted = _old_state_name(out)
        victim = ctx.scratch / "victim.bin"
        victim.write_bytes(b"victim" * 100)
        nobody = pwd.getpwnam("nobody")
        try:
            planted.mkdir(mode=0o777)
            os.chmod(planted, 0o777 if kind != "owned_0755" else 0o755)
            if kind == "symlinks":
                for name in ("master.bin", "exp_avg.bin", "exp_avg_sq.bin", "slot.bin"):
                    (planted / name).symlink_to(victim)
            if kind == "master":
                (planted / "master.bin").write_bytes(struct.pack("<f", 7.0) * 200_000)
            os.chown(planted, nobody.pw_uid, nobody.pw_gid)
            for f in planted.iterdir():
                os.lchown(f, nobody.pw_uid, nobody.pw_gid)
            r = ctx.cli(_train(ctx, out, "--nproc", "2", "--batch", "2", "--steps", "2"), timeout=150)
            touched = victim.read_bytes() != b"victim" * 100
            if r.rc == 0:
                ok, why = _finite_run(out)
                ok_ckpt, cwhy, _ = read_checkpoint(out / "checkpoint")
                losses = (out / "metrics.csv").read_text()
                bad = touched or not ok or not ok_ckpt or ("7.0" in losses)
                why = "victim file overwritten through a symlink" if touched else why if not ok else cwhy
                return Observation(r, (not bad, why if bad else "planted directory ignored; run correct"))
            return Observation(r, (False, "run failed: planted directory blocked it" +
                                   ("; victim overwritten" if touched else "")))
        finally:
            shutil.rmtree(planted, ignore_errors=True)

    return run


def _reader(ctx: Ctx) -> Observation:
    """Another local user (nobody) tries to read the master weights while a data-parallel run trains."""
    out = ctx.scratch / "run"
    t0 = time.monotonic()
    proc = ctx.popen(_train(ctx, out, "--nproc", "2", "--batch", "2", "--steps", "40"))
    stolen: list[str] = []
    script = ("import glob\nfor p in glob.glob('/dev/shm/slidedp-*/master.bin'):\n"
              "    try:\n        open(p,'rb').read(16); print(p)\n    except OSError: pass\n")
    ours = (str(_old_state_name(out)), f"/dev/shm/slidedp-{os.getuid()}-")  # old name, today's per-user prefix
    while proc.poll() is None and time.monotonic() - t0 < 150:
        r = subprocess.run(["python3", "-c", script], capture_output=True, text=True, preexec_fn=_as_nobody,
                           cwd="/", timeout=30)
        stolen += [p for p in r.stdout.split() if p.startswith(ours)]
        time.sleep(0.3)
    result = finish(proc, t0, 180)
    if stolen:
        return Observation(result, (False, f"another user read {stolen[0]}"))
    return Observation(result, (result.rc == 0, "another user could not read the state"
                                if result.rc == 0 else "run failed"))


def _same_out_twice(ctx: Ctx) -> Observation:
    out = ctx.scratch / "run"
    t0 = time.monotonic()
    first = ctx.popen(_train(ctx, out, "--nproc", "2", "--batch", "2", "--steps", "30"))
    _wait_rows(out, 1, first, t0 + 120)
    second = ctx.cli(_train(ctx, out, "--nproc", "2", "--batch", "2", "--steps", "2"), timeout=120)
    r1 = finish(first, t0, 240)
    rows = len((out / "metrics.csv").read_text().splitlines()) if (out / "metrics.csv").exists() else 0
    if second.rc == 2 and r1.rc == 0 and rows == 31:
        return Observation(second, (True, "second run refused; first intact"))
    return Observation(second, (False, f"second exit {second.rc}, first exit {r1.rc}, {rows - 1} metric rows"))


def shared_state_cases() -> list[Case]:
    return [Case("planted state dir, world-writable, another owner", "shared state", "survive", _planted("open")),
            Case("planted state dir with symlinks to a victim file", "shared state", "survive", _planted("symlinks")),
            Case("planted state dir with the attacker's master", "shared state", "survive", _planted("master")),
            Case("planted state dir 0755 of another owner (denial)", "shared state", "survive", _planted("owned_0755")),
            Case("another user reads the state while training", "shared state", "survive", _reader),
            Case("two runs on one run directory", "shared state", "survive", _same_out_twice)]


# ---- kernel build lock, full disk ---------------------------------------------------------------------------------
def _stale_lock(ctx: Ctx) -> Observation:
    ext = ctx.scratch / "ext"
    from slidedp.runtime.cpu_adam import KERNEL_NAME

    (ext / KERNEL_NAME).mkdir(parents=True)
    (ext / KERNEL_NAME / "lock").write_text("")  # torch's build lock, as a killed compile leaves it
    out = ctx.scratch / "run"
    r = ctx.cli(_train(ctx, out, "--steps", "1", "--batch", "2", "--dtype", "bf16"),
                env={"TORCH_EXTENSIONS_DIR": str(ext)}, timeout=240)
    return Observation(r, _finite_run(out) if r.rc == 0 else (False, "run failed"))


def _disk_full(first_save_fits: bool) -> Callable[[Ctx], Observation]:
    def run(ctx: Ctx) -> Observation:
        mnt = ctx.scratch / (MOUNT_TAG + "mnt")
        mnt.mkdir()
        # room for one checkpoint and the run's files, not for a second one beside it (a save writes the new
        # one before the old one goes); or not even for the first one
        state = (ctx.fixtures / "base" / "checkpoint" / "state.safetensors").stat().st_size
        size = f"{(state * 3 // 2 if first_save_fits else state // 2) // 1024}k"
        if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)]).returncode != 0:
            return Observation(Result(None, "mount refused", False, 0.0), (False, "cannot mount a tmpfs here"))
        try:
            out = mnt / "run"
            r = ctx.cli(_train(ctx, out, "--steps", "3", "--batch", "2", "--save-every", "1"), timeout=120)
            ok, why, step = read_checkpoint(out / "checkpoint")
            tmp_left = sorted(p.name for p in out.glob("checkpoint.*"))
            if first_save_fits:
                fine = r.rc == 2 and ok and not tmp_left and len(_err(r)) == 1
                return Observation(r, (fine, f"exit {r.rc}, checkpoint {why} step {step}, leftovers {tmp_left}"))
            return Observation(r, None if r.rc != 0 else (False, "a full disk accepted"))
        finally:
            subprocess.run(["umount", "-l", str(mnt)], check=False)

    return run


def _err(r: Result) -> list[str]:
    from benchmarks.fault_census import error_lines

    return error_lines(r.stderr)


def other_cases() -> list[Case]:
    return [Case("stale kernel-build lock (bf16 run)", "kernel lock", "survive", _stale_lock),
            Case("disk full at the first save", "disk full", "refuse", _disk_full(False)),
            Case("disk full at a later save (previous checkpoint kept)", "disk full", "survive", _disk_full(True))]


def all_cases() -> list[Case]:
    return [*bad_input_cases(), *checkpoint_cases(), *shared_state_cases(), *other_cases(), *kill_cases()]
