"""Chat-format SFT on the H200 (#17): real local text turned into conversations, a tokenizer with a chat template
made here, loss on the answers only, packed without attention across conversations; then the same tokens as plain
packed text for the throughput comparison, and the loss curves read back from the TensorBoard logs.

    python -m benchmarks.chat_sft --out DIR                                   # on the H200 (Qwen3-0.6B shape)
    python -m benchmarks.chat_sft --model tiny.json --device cpu --steps 4 --seq 128 --batch 2 --out DIR   # CPU

Data: every function with a docstring in the Python standard library on the machine (``--source``; tests
excluded), as a conversation: system "You write Python.", user "Write a Python function `name(args)`: <the
docstring>", assistant: the function's source without its docstring. 2% held out for eval. Tokenizer: byte-level
BPE trained on those conversations (``--vocab`` ids, ChatML markers as special tokens) with a ChatML chat template,
saved as a local Hugging Face tokenizer directory (no hub).

Runs (each a ``slidedp train`` subprocess, TensorBoard logs on):
  chat   ``--format messages`` (answers trained on, packed, per-conversation attention), eval every ``--eval-every``
  chat-mask  the chat run with ``--packed-attention mask`` (a block-causal mask instead of the varlen kernel)
  text   the same conversations rendered by the template as plain text, ``--format text`` (every token trained on,
         windows across conversations): what the chat machinery costs in tokens/s

Writes DIR/results.jsonl (one row per run: tokens/s, step time, final train and eval loss), DIR/chat_sft.png
(train and eval loss per step from the event files) and DIR/chat_sft.md.
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import subprocess
import sys
import sysconfig
from pathlib import Path

from benchmarks.common import append_jsonl, exit_code, log

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ("<|im_start|>", "<|im_end|>", "<pad>")
SYSTEM = "You write Python."


def _function_pairs(source: str) -> list[tuple[str, str, str]]:
    """(signature, docstring, body without the docstring) of every documented function in one module's source."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        doc = ast.get_docstring(node)
        if not doc or len(doc) < 20:
            continue
        original = node.body
        if len(original) < 2:
            continue
        node.body = original[1:]  # the answer: the function without its docstring
        try:
            answer = ast.unparse(node)
        finally:
            node.body = original
        out.append((f"{node.name}({ast.unparse(node.args)})", doc.strip(), answer))
    return out


def conversations(root: Path, limit_mb: float, max_chars: int) -> tuple[list[dict], str]:
    """Documented stdlib functions as chat records of at most ``max_chars`` characters (longer ones would be cut
    at --seq), up to ``limit_mb`` of text, in a fixed order; and a line saying what the data is."""
    budget, used, records, files = int(limit_mb * 2**20), 0, [], 0
    for path in sorted(root.rglob("*.py")):
        if "test" in path.parts or "tests" in path.parts or used >= budget:
            continue
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        found = _function_pairs(source)
        files += bool(found)
        for signature, doc, answer in found:
            record = {"messages": [{"role": "system", "content": SYSTEM},
                                   {"role": "user", "content": f"Write a Python function `{signature}`: {doc}"},
                                   {"role": "assistant", "content": answer}]}
            size = sum(len(m["content"]) for m in record["messages"])
            if size <= max_chars:
                used += size
                records.append(record)
    what = (f"{len(records):,} documented functions (at most {max_chars:,} characters each) from {files} modules "
            f"of the Python {sys.version.split()[0]} standard library under {root} (tests excluded), "
            f"{used / 2**20:.1f} MB")
    return records, what


def render(chats: list[list[dict]]) -> list[str]:
    """The text the chat template renders for each conversation (the tokenizer is trained on it and the plain-text
    run trains on exactly these characters): CHATML itself, through jinja2 as transformers renders it, so the
    format has one home; compiled once."""
    import jinja2

    template = jinja2.Template(CHATML)
    return [template.render(messages=messages, add_generation_prompt=False) for messages in chats]


def make_tokenizer(texts: list[str], vocab: int, directory: Path) -> Path:
    """Byte-level BPE trained on ``texts`` with the ChatML markers as special tokens and a ChatML chat template."""
    import tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(SPECIALS),
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<pad>")
    fast.chat_template = CHATML
    fast.save_pretrained(str(directory))
    return directory


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    return path


def prepare(args: argparse.Namespace) -> tuple[Path, Path, Path, Path, str]:
    """Chat train/eval files, the plain-text file of the same train conversations, and the tokenizer."""
    records, what = conversations(Path(args.source), args.text_mb, args.max_chars)
    if len(records) < 10:
        raise SystemExit(f"chat_sft: only {len(records)} documented functions under {args.source}")
    random.Random(0).shuffle(records)
    n_eval = max(1, int(len(records) * args.eval_fraction))
    train, held = records[n_eval:], records[:n_eval]
    data = args.out / "data"
    data.mkdir(parents=True, exist_ok=True)
    chat = _write_jsonl(data / "chat.jsonl", train)
    chat_eval = _write_jsonl(data / "chat_eval.jsonl", held)
    rendered = render([r["messages"] for r in train])
    text = data / "chat_as_text.txt"
    text.write_text("".join(rendered), encoding="utf-8")
    tokenizer = make_tokenizer(rendered, args.vocab, args.out / "tokenizer")
    return chat, chat_eval, text, tokenizer, f"{what}; {len(train):,} train / {len(held):,} eval conversations"


def train(args: argparse.Namespace, name: str, data: list[str]) -> dict:
    run = args.out / "runs" / name
    cmd = [sys.executable, "-m", "slidedp.cli", "train", "--model", args.model, "--tokenizer",
           str(args.out / "tokenizer"), *data, "--seq", str(args.seq), "--batch", str(args.batch), "--steps",
           str(args.steps), "--device", args.device, "--hardware", args.hardware, "--seed", "0", "--lr",
           str(args.lr), "--warmup", str(max(1, args.steps // 20)), "--no-checkpoint", "--log", "tensorboard",
           "--out", str(run)]
    if args.policy:
        cmd += ["--policy", args.policy]
    print(f"=== {' '.join(cmd[3:])}", flush=True)
    rc = subprocess.run(cmd, check=False).returncode
    row = {"run": name, "rc": rc, "steps": args.steps, "seq": args.seq, "batch": args.batch}
    summary = run / "summary.json"
    if summary.exists():
        from slidedp.run_summary import RunSummary

        s = RunSummary.load(summary)
        row.update(step_time_s=s.step_time_s, tokens_per_s=s.tokens_per_s, final_loss=s.final_loss,
                   gpu_peak_gib=s.gpu_peak_gib)
    curves = tensorboard_curves(run / "tensorboard")
    row["train_loss"] = curves.get("train/loss", [])
    row["eval_loss"] = curves.get("eval/loss", [])
    append_jsonl(args.out / "results.jsonl", row)
    return row


def tensorboard_curves(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of a run's TensorBoard event files, as (step, value) pairs in step order."""
    if not directory.exists():
        return {}
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def plot(rows: list[dict], out: Path, what: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_train, ax_eval) = plt.subplots(1, 2, figsize=(11, 4))
    for row in rows:
        if row["train_loss"]:
            ax_train.plot(*zip(*row["train_loss"], strict=True), lw=0.8, label=f"{row['run']} (train)")
        if row["eval_loss"]:
            ax_eval.plot(*zip(*row["eval_loss"], strict=True), marker="o", ms=3, label=f"{row['run']} (eval)")
    ax_train.set(title="training loss (chat: answer tokens only)", xlabel="optimizer step",
                 ylabel="cross-entropy (nats per token)")
    ax_eval.set(title="held-out loss (answer tokens)", xlabel="optimizer step",
                ylabel="cross-entropy (nats per token)")
    for ax in (ax_train, ax_eval):
        if ax.lines:
            ax.legend()
    fig.suptitle("Chat SFT from the TensorBoard logs", fontsize=11)
    fig.tight_layout()
    fig.savefig(out / "chat_sft.png", dpi=120)
    lines = [f"Data: {what}", "", "| run | tokens/s | step s | final train loss | final eval loss |",
             "|---|---|---|---|---|"]
    for row in rows:
        ev = f"{row['eval_loss'][-1][1]:.4f}" if row["eval_loss"] else "-"
        tr = f"{row['train_loss'][-1][1]:.4f}" if row["train_loss"] else "-"
        lines.append(f"| {row['run']} | {row.get('tokens_per_s', 0):,.0f} | {row.get('step_time_s', 0):.3f} | "
                     f"{tr} | {ev} |")
    (out / "chat_sft.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="qwen3-0.6b", help="preset or config.json (>= 0.5B parameters on the H200)")
    ap.add_argument("--source", default=sysconfig.get_paths()["stdlib"], help="directory of .py files")
    ap.add_argument("--text-mb", type=float, default=24.0, help="at most this much conversation text")
    ap.add_argument("--max-chars", type=int, default=6000, help="skip conversations longer than this")
    ap.add_argument("--vocab", type=int, default=16384, help="BPE vocabulary of the tokenizer made here")
    ap.add_argument("--eval-fraction", type=float, default=0.02)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--policy", help="policy YAML (default: train's default policy)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--hardware", default="h200-x1")
    ap.add_argument("--runs", nargs="+", choices=["chat", "chat-mask", "text"], default=["chat", "text"],
                    help="chat-mask: the chat run with --packed-attention mask (the block-causal mask, not varlen)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    chat, chat_eval, text, _, what = prepare(args)
    log(f"chat_sft data: {what}")
    runs = {"chat": ["--data", str(chat), "--format", "messages", "--eval-data", str(chat_eval), "--eval-every",
                     str(args.eval_every)],
            "text": ["--data", str(text), "--format", "text"]}
    runs["chat-mask"] = [*runs["chat"], "--packed-attention", "mask"]
    rows = [train(args, name, runs[name]) for name in args.runs]
    plot(rows, args.out, what)
    return exit_code(rows, "run")


if __name__ == "__main__":
    sys.exit(main())
