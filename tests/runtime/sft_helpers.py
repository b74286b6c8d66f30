"""A tiny character-level HF tokenizer with a ChatML chat template, made inside the tests (no hub), and the
chat/prompt-completion records the SFT tests train on."""

from __future__ import annotations

import json
import string
from pathlib import Path

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIALS = ["[UNK]", "<|im_start|>", "<|im_end|>", "<pad>"]


def make_tokenizer(directory: Path, chat_template: str | None = CHATML) -> Path:
    """Characters as tokens, ChatML markers as special tokens; saved as a local tokenizer directory."""
    import tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = string.ascii_letters + string.digits + " .,:;!?'-\n"
    vocab = {**{s: i for i, s in enumerate(SPECIALS)}, **{c: i + len(SPECIALS) for i, c in enumerate(chars)}}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split("", "isolated")
    tok.add_special_tokens(SPECIALS[1:])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="<|im_end|>",
                                   pad_token="<pad>")
    if chat_template is not None:
        fast.chat_template = chat_template
    fast.save_pretrained(str(directory))
    return directory


def chats(n: int) -> list[dict]:
    return [{"messages": [{"role": "system", "content": "be brief"},
                          {"role": "user", "content": f"what is {i} plus {i}?"},
                          {"role": "assistant", "content": f"it is {2 * i}."}]} for i in range(n)]


def pairs(n: int) -> list[dict]:
    return [{"prompt": f"say {i} twice: ", "completion": f"{i} {i}"} for i in range(n)]


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path
