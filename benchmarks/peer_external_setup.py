"""Lay the external peers' sources into the ignored ``.peers/`` folder, and say which wheels the GPU machine lacks.

    python -m benchmarks.peer_external_setup --megatrain /work/.mirror/DLYuanGod+MegaTrain/repo \\
        --slideformer PATH [--peers-dir .peers] [--wheels-dir .whl [--download]]

A source is a git directory (a bare mirror as the ``fetch`` tool leaves it, or a checkout's ``.git``) read at
``--commit`` (default HEAD), or a plain folder. Only what the peer runs is laid out: MegaTrain's ``infinity``
package, ``examples/sft`` and its licence; SlideFormer's ``multi_gpu`` folder and its licence. Built binaries in
the sources (``build/`` folders, ``*.so``: MegaTrain's mirror carries aarch64 ones), caches and egg-info are
left out: the GPU machine JIT-builds what the peers need (DeepSpeed's and SlideFormer's CPU Adam). Each peer's
folder gets ``SOURCE.json`` (repository, commit, files), which the comparison's rows quote.

A plain folder may carry ``INDEX_VERSIONS.json`` (path -> commit of every file, for a tree transcribed file by
file from the search index when no snapshot of the repository can be had: SlideFormer's, in the ignored
``.peers-src/slideformer``); its commits go into SOURCE.json. A tree with a ``SHA256SUMS`` (SlideFormer's
``multi_gpu`` has one) is checked against it, the result recorded too. Where SlideFormer's tree lacks
``csrc/cpu_adam.cpp``, the few lines of pybind11 binding that its ``builder.py`` compiles with
``cpu_adam_impl.cpp``, a binding of our own is written (`write_cpu_adam_binding`) and recorded under
``reconstructed``.

The GPU machine has no package registry (torch 2.11 + CUDA 13, transformers 5.17, ninja, psutil, pyyaml, no
deepspeed, datasets or liger-kernel): ``WHEELS`` lists what each peer needs carried as wheels; ``--download``
fetches them into ``--wheels-dir`` with pip (x86-64, CPython 3.12). DeepSpeed has no wheel on the registry: it is
built from its sdist with ``DS_BUILD_OPS=0`` (its ops are JIT-built on the GPU machine), as the earlier peer
sessions did (benchmarks/RESULTS.md). ``PRIVATE_WHEELS`` go into the peer's own folder instead (``wheels/``, carried
with ``.peers``), for packages only its process may see: SlideFormer's pinned transformers.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from benchmarks.peer_external import DEFAULT_PEERS_DIR, EXTERNAL, PRIVATE_WHEELS_DIR

# Packages each peer imports that the GPU machine's image lacks (KINDS.md's package list, 2026-11-17), pinned to the
# versions its code was written for where it says so.
WHEELS: dict[str, tuple[str, ...]] = {
    "megatrain": ("deepspeed==0.19.8", "hjson", "pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types",
                  "typing-inspection", "datasets==5.2.0", "dill", "multiprocess"),
    "slideformer": ("liger-kernel==0.7.0",),
}
BUILT_FROM_SDIST = {"deepspeed"}  # no binary wheel on the registry
# Wheels only the peer's own process may see: they go into the peer's folder (``wheels/``), and
# peer_external installs them into its ``site/``, first on the peer's PYTHONPATH (peer_external.PRIVATE_SITE).
# SlideFormer's multi_gpu release (e577d1aa) passes ``cache_position`` to ``masking_utils.create_causal_mask``,
# which transformers 5.17 (the image's) no longer takes: its own pin, 5.5.4, does; 5.5.4 checks at import that
# tokenizers is <= 0.23.0 (the image has 0.23.2; no 0.23.0 final exists, 0.22.2 is the newest below).
PRIVATE_WHEELS: dict[str, tuple[str, ...]] = {
    "slideformer": ("transformers==5.5.4", "tokenizers==0.22.2"),
}


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


# ---- SlideFormer's CPU Adam binding ---------------------------------------------------------------------------
# builder.py (CPUAdamLoader) JIT-compiles csrc/cpu_adam.cpp with csrc/cpu_adam_impl.cpp into the module that
# layer_adam.py calls. No stored version of RegiaYoung/SlideFormer holds cpu_adam.cpp (its SHA256SUMS lists it).
# cpu_adam_impl.cpp defines, and cpu_adam.h declares, the three functions; the missing file can only be their
# binding under the names layer_adam.py calls (the layout DeepSpeed's csrc/adam/cpu_adam.cpp has too). Python
# name -> C++ function, each an ``int f(...)`` whose argument list layer_adam.py's calls match one to one:
#   create_adam(id, lr, beta1, beta2, eps, weight_decay, adamw_mode, should_log)
#   adam_update(id, step, lr, beta1, beta2, eps, weight_decay, bias_correction, params, grads, exp_avg, exp_avg_sq)
#   destroy_adam(id)
SLIDEFORMER_ADAM = "multi_gpu/optimizer/layer_adam"
CPU_ADAM_BINDINGS = {"create_adam": "create_adam_optimizer", "adam_update": "ds_adam_step",
                     "destroy_adam": "destroy_adam_optimizer"}
CPU_ADAM_BINDING = """\
// Written by SlideDP's benchmarks/peer_external_setup.py (write_cpu_adam_binding), not taken from SlideFormer:
// no stored version of RegiaYoung/SlideFormer holds multi_gpu/optimizer/layer_adam/csrc/cpu_adam.cpp, the
// Python binding builder.py compiles with cpu_adam_impl.cpp. It binds the three functions cpu_adam_impl.cpp
// defines and cpu_adam.h declares, under the names layer_adam.py calls; nothing else.
#include "cpu_adam.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)
{
{defs}
}
"""


def cpu_adam_binding() -> str:
    """The text of the binding: one ``m.def`` per entry of CPU_ADAM_BINDINGS."""
    defs = "\n".join(f'    m.def("{py}", &{cpp}, "{cpp} (cpu_adam_impl.cpp)");'
                     for py, cpp in CPU_ADAM_BINDINGS.items())
    return CPU_ADAM_BINDING.replace("{defs}", defs)


def write_cpu_adam_binding(tree: Path) -> dict | None:
    """Write ``csrc/cpu_adam.cpp`` into a laid-out SlideFormer tree that lacks it; None where it is there or the
    tree has no CPU Adam sources. Written only where the tree agrees with the binding: layer_adam.py calls exactly
    the bound names and cpu_adam_impl.cpp defines, cpu_adam.h declares, every bound function; else nothing is
    written and the entry says why."""
    adam = tree / SLIDEFORMER_ADAM
    target = adam / "csrc" / "cpu_adam.cpp"
    if target.exists() or not (adam / "csrc" / "cpu_adam_impl.cpp").is_file():
        return None
    entry: dict = {"reason": "absent from every stored version of the repository; builder.py compiles it with "
                             "cpu_adam_impl.cpp into the module layer_adam.py calls",
                   "binds": dict(CPU_ADAM_BINDINGS)}
    sources = {n: (adam / n).read_text() if (adam / n).is_file() else "" for n in
               ("layer_adam.py", "csrc/cpu_adam_impl.cpp", "csrc/cpu_adam.h")}
    called = set(re.findall(r"\bcpu_adam\.(\w+)\(", sources["layer_adam.py"]))
    problems = [f"layer_adam.py calls {sorted(called)}"] if called != set(CPU_ADAM_BINDINGS) else []
    for name in ("csrc/cpu_adam_impl.cpp", "csrc/cpu_adam.h"):
        problems += [f"{name} has no int {f}(" for f in CPU_ADAM_BINDINGS.values()
                     if not re.search(rf"\bint\s+{f}\s*\(", sources[name])]
    if problems:
        return {**entry, "written": False, "why_not": "; ".join(problems)}
    text = cpu_adam_binding()
    target.write_text(text)
    return {**entry, "written": True, "sha256": hashlib.sha256(text.encode()).hexdigest()}


def check_sums(tree: Path) -> dict:
    """Each ``SHA256SUMS`` of the laid-out tree against the files beside it: path -> matched / differs / absent."""
    out = {}
    for sums in sorted(tree.rglob("SHA256SUMS")):
        matched, differs, absent = 0, [], []
        for line in sums.read_text().splitlines():
            digest, _, rel = line.partition("  ")
            file = sums.parent / rel
            if not file.is_file():
                absent.append(rel)
            elif hashlib.sha256(file.read_bytes()).hexdigest() == digest:
                matched += 1
            else:
                differs.append(rel)
        out[sums.relative_to(tree).as_posix()] = {"matched": matched, "differs": differs, "absent": absent}
    return out


def lay_out(name: str, source: Path, peers_dir: Path, commit: str = "HEAD") -> dict:
    """Copy the wanted files of ``source`` into ``peers_dir/name`` (replacing what was there); return SOURCE.json's
    content. Files the git directory lists but does not hold (a partial mirror) are named in ``missing``."""
    layout = LAYOUTS[name]
    dest = peers_dir / name
    staging = Path(tempfile.mkdtemp(dir=peers_dir.parent if peers_dir.parent.exists() else None))
    copied, missing, versions = [], [], {}
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
        index = source / "INDEX_VERSIONS.json"
        if index.is_file():
            versions = json.loads(index.read_text())
            resolved = versions.get("tree_commit", resolved)
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
    if versions:
        info["versions"] = {p: c for p, c in versions.get("files", {}).items() if p in copied}
        info["absent_from_index"] = versions.get("absent", {})
    if name == "slideformer":
        binding = write_cpu_adam_binding(staging)
        if binding is not None:
            info["reconstructed"] = {f"{SLIDEFORMER_ADAM}/csrc/cpu_adam.cpp": binding}
    sums = check_sums(staging)
    if sums:
        info["sha256sums"] = sums
    (staging / "SOURCE.json").write_text(json.dumps(info, indent=1))
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(staging), dest)
    return info


def download_commands(names: list[str], wheels_dir: Path, peers_dir: Path = DEFAULT_PEERS_DIR) -> list[list[str]]:
    """pip commands that put the wheels ``names`` need into ``wheels_dir`` for the GPU machine (x86-64, CPython
    3.12, manylinux), and each peer's PRIVATE_WHEELS into its own ``peers_dir/<name>/wheels``; DeepSpeed is
    built here from its sdist without ops."""
    platforms = [a for tag in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
                 for a in ("--platform", tag)]
    cmds = []
    for name in names:
        wanted = [(req, wheels_dir) for req in WHEELS[name]]
        private = peers_dir / EXTERNAL[name].folder / PRIVATE_WHEELS_DIR
        wanted += [(req, private) for req in PRIVATE_WHEELS.get(name, ())]
        for req, where in wanted:
            if req.split("==")[0] in BUILT_FROM_SDIST:
                cmds.append([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                             str(where), req])
            else:
                cmds.append([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                             "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(where),
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
        for path, entry in info.get("reconstructed", {}).items():
            print(f"  {path}: " + ("written (our binding; see SOURCE.json)" if entry["written"]
                                   else f"NOT written: {entry['why_not']}"))
        for path, result in info.get("sha256sums", {}).items():
            print(f"  {path}: {result['matched']} files match, differ: {result['differs'] or 'none'}, "
                  f"absent: {len(result['absent'])}")
    print("wheels the GPU machine needs (carry the folder with the run tool's carry, with .peers):")
    for cmd in download_commands(chosen, args.wheels_dir, args.peers_dir):
        print("  " + " ".join(cmd))
        if args.download:
            subprocess.run(cmd, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
