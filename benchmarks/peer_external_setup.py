"""Lay the external peers' sources into the ignored ``.peers/`` folder, and say which wheels the GPU machine lacks.

    python -m benchmarks.peer_external_setup --megatrain /work/.mirror/DLYuanGod+MegaTrain/repo \\
        --slideformer PATH [--peers-dir .peers] [--wheels-dir .whl [--download]]

A source is a git directory (a bare mirror as the ``fetch`` tool leaves it, or a checkout's ``.git``) read at
``--commit`` (default HEAD), or a plain folder. Only what the peer runs is laid out: MegaTrain's ``infinity``
package, ``examples/sft`` and its licence; SlideFormer's ``multi_gpu`` folder and its licence. Built binaries in
the sources (``build/`` folders, ``*.so``: MegaTrain's mirror carries aarch64 ones), caches and egg-info are
left out: the GPU machine JIT-builds what the peers need (DeepSpeed's and SlideFormer's CPU Adam). Each peer's
folder gets ``SOURCE.json`` (repository, commit, files), which the comparison's rows quote.

The GPU machine has no package registry (torch 2.11 + CUDA 13, transformers 5.17, ninja, psutil, pyyaml, no
deepspeed, datasets or liger-kernel): ``WHEELS`` lists what each peer needs carried as wheels; ``--download``
fetches them into ``--wheels-dir`` with pip (x86-64, CPython 3.12). DeepSpeed has no wheel on the registry: it is
built from its sdist with ``DS_BUILD_OPS=0`` (its ops are JIT-built on the GPU machine), as the earlier peer
sessions did (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from benchmarks.peer_external import DEFAULT_PEERS_DIR, EXTERNAL

# Packages each peer imports that the GPU machine's image lacks (KINDS.md's package list, 2026-11-17), pinned to the
# versions its code was written for where it says so.
WHEELS: dict[str, tuple[str, ...]] = {
    "megatrain": ("deepspeed==0.19.8", "hjson", "pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types",
                  "typing-inspection", "datasets==5.2.0", "dill", "multiprocess"),
    "slideformer": ("liger-kernel==0.7.0",),
}
BUILT_FROM_SDIST = {"deepspeed"}  # no binary wheel on the registry


@dataclass(frozen=True)
class Layout:
    """What of a peer's repository is laid out: path prefixes kept, name parts left out."""

    repo: str
    keep: tuple[str, ...]
    skip_parts: tuple[str, ...] = ("build", "__pycache__", ".git")
    skip_suffixes: tuple[str, ...] = (".so", ".o", ".pyc", ".egg-info", ".ninja_deps", ".ninja_log")

    def wanted(self, path: str) -> bool:
        p = PurePosixPath(path)
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in self.keep):
            return False
        if any(part in self.skip_parts or part.endswith(".egg-info") for part in p.parts):
            return False
        return not p.name.endswith(self.skip_suffixes)


LAYOUTS = {
    "megatrain": Layout("DLYuanGod/MegaTrain", ("infinity", "examples/sft", "LICENSE", "requirements.txt")),
    "slideformer": Layout("RegiaYoung/SlideFormer", ("multi_gpu", "LICENSE", "NOTICE")),
}


def _git(source: Path, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", str(source), *args], check=True, capture_output=True).stdout


def _git_dir(source: Path) -> Path | None:
    """The git directory of ``source`` (bare, or a checkout's .git), or None for a plain folder."""
    for candidate in (source, source / ".git"):
        if (candidate / "HEAD").is_file() and (candidate / "objects").is_dir():
            return candidate
    return None


def lay_out(name: str, source: Path, peers_dir: Path, commit: str = "HEAD") -> dict:
    """Copy the wanted files of ``source`` into ``peers_dir/name`` (replacing what was there); return SOURCE.json's
    content. Files the git directory lists but does not hold (a partial mirror) are named in ``missing``."""
    layout = LAYOUTS[name]
    dest = peers_dir / name
    staging = Path(tempfile.mkdtemp(dir=peers_dir.parent if peers_dir.parent.exists() else None))
    copied, missing = [], []
    git = _git_dir(source)
    if git is not None:
        resolved = _git(git, "rev-parse", commit).decode().strip()
        listing = _git(git, "ls-tree", "-r", "-z", resolved).decode().split("\0")
        for entry in filter(None, listing):
            meta, path = entry.split("\t", 1)
            mode, kind, obj = meta.split()
            if kind != "blob" or not layout.wanted(path):
                continue
            try:
                data = _git(git, "cat-file", "blob", obj)
            except subprocess.CalledProcessError:
                missing.append(path)
                continue
            target = staging / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            if mode == "100755":
                target.chmod(0o755)
            copied.append(path)
    else:
        resolved = "working tree (no git directory)"
        for file in sorted(p for p in source.rglob("*") if p.is_file()):
            path = file.relative_to(source).as_posix()
            if layout.wanted(path):
                target = staging / path
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(file, target)
                copied.append(path)
    script = EXTERNAL[name].script
    if script not in copied:
        shutil.rmtree(staging)
        raise SystemExit(f"peer_external_setup: error: {source} has no {script} (is it {layout.repo}?)")
    info = {"repo": layout.repo, "source": str(source), "commit": resolved, "files": len(copied), "missing": missing}
    (staging / "SOURCE.json").write_text(json.dumps(info, indent=1))
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(staging), dest)
    return info


def download_commands(names: list[str], wheels_dir: Path) -> list[list[str]]:
    """pip commands that put the wheels ``names`` need into ``wheels_dir`` for the GPU machine (x86-64, CPython
    3.12, manylinux); DeepSpeed is built here from its sdist without ops."""
    platforms = [a for tag in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
                 for a in ("--platform", tag)]
    cmds = []
    for name in names:
        for req in WHEELS[name]:
            if req.split("==")[0] in BUILT_FROM_SDIST:
                cmds.append([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                             str(wheels_dir), req])
            else:
                cmds.append([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                             "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(wheels_dir),
                             req])
    return cmds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in LAYOUTS:
        p.add_argument(f"--{name}", type=Path, metavar="SOURCE",
                       help=f"git directory or folder of {LAYOUTS[name].repo}")
    p.add_argument("--commit", default="HEAD", help="commit to read from a git directory")
    p.add_argument("--peers-dir", type=Path, default=DEFAULT_PEERS_DIR)
    p.add_argument("--wheels-dir", type=Path, default=DEFAULT_PEERS_DIR.parent / ".whl")
    p.add_argument("--download", action="store_true", help="run the pip commands (else only print them)")
    args = p.parse_args(argv)
    chosen = [name for name in LAYOUTS if getattr(args, name) is not None]
    if not chosen:
        p.error("give at least one of " + ", ".join(f"--{n}" for n in LAYOUTS))
    args.peers_dir.mkdir(parents=True, exist_ok=True)
    for name in chosen:
        source = getattr(args, name)
        if not source.exists():
            p.error(f"--{name} {source}: no such directory")
        info = lay_out(name, source, args.peers_dir, args.commit)
        print(f"{name}: {info['files']} files of {info['repo']} at {info['commit']} -> {args.peers_dir / name}"
              + (f"; {len(info['missing'])} listed but absent from the source" if info["missing"] else ""))
    print("wheels the GPU machine needs (carry the folder with the run tool's carry, with .peers):")
    for cmd in download_commands(chosen, args.wheels_dir):
        print("  " + " ".join(cmd))
        if args.download:
            subprocess.run(cmd, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
