"""Tokenizers the data pipeline uses: a local Hugging Face tokenizer directory, or UTF-8 bytes.

Both answer the same three questions: the token ids of a list of texts (with or without the tokenizer's
own special tokens), the end-of-sequence id, and a conversation rendered by the tokenizer's chat template
(the byte tokenizer has none). The fingerprint keys the tokenization cache.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from slidedp.errors import SlideDPError

BYTE_EOS = 256
BYTE_TOKENIZER = "bytes"  # --tokenizer bytes (or none): the byte-level tokenizer, not a directory


class ByteTokenizer:
    """UTF-8 bytes as tokens 0-255 and 256 as end-of-sequence: works for any vocabulary of 257+."""

    eos_token_id = BYTE_EOS
    pad_token_id = BYTE_EOS
    chat_template = None
    name = BYTE_TOKENIZER

    def __init__(self, vocab_size: int):
        if vocab_size < 257:
            raise SlideDPError("the byte-level tokenizer needs a vocabulary of at least 257, "
                               f"the model has {vocab_size}")

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: list[str], special: bool) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def render_chat(self, messages: list[dict], add_generation_prompt: bool) -> str:
        raise SlideDPError("the byte-level tokenizer has no chat template: --format messages needs --tokenizer "
                           "with a chat_template (or use --format prompt_completion)")

    def fingerprint(self) -> str:
        return "bytes"


# The files a tokenizer's vocabulary lives in (fast, SentencePiece, byte-level BPE, WordPiece): a directory
# with none of them has no tokenizer, whatever else it holds.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "vocab.txt",
                   "sentencepiece.bpe.model")


def check_tokenizer_dir(path: str) -> None:
    """A local HF tokenizer directory holds a tokenizer's files, or one error line says what is wrong; cheap (no
    transformers import), so a run can check it before anything else."""
    if not Path(path).is_dir():
        raise SlideDPError(f"tokenizer {path!r}: not a directory (give a local HF tokenizer directory or 'bytes')")
    if not any((Path(path) / name).is_file() for name in TOKENIZER_FILES):
        # transformers would build an empty tokenizer from a model's config alone (every text one token)
        raise SlideDPError(f"tokenizer {path!r} holds no tokenizer ({', '.join(TOKENIZER_FILES[:3])}, ...): "
                           f"a model directory has one only if it was saved with it")


class HFTokenizer:
    """A local ``AutoTokenizer`` directory behind the pipeline's interface."""

    def __init__(self, path: str, vocab_size: int):
        from transformers import AutoTokenizer

        check_tokenizer_dir(path)
        try:
            self.tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise SlideDPError(f"tokenizer {path!r}: cannot load ({str(exc).splitlines()[0]})") from None
        if len(self.tok) > vocab_size:
            raise SlideDPError(f"tokenizer {path!r} has {len(self.tok)} tokens but the model's vocabulary is "
                               f"{vocab_size}")
        self.path, self.name = Path(path), path
        self.chat_template = self.tok.chat_template
        eos = self.tok.eos_token_id
        self.eos_token_id = eos if eos is not None else 0
        pad = self.tok.pad_token_id
        self.pad_token_id = pad if pad is not None else self.eos_token_id

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text], special=True)[0]

    def encode_batch(self, texts: list[str], special: bool) -> list[list[int]]:
        if not texts:
            return []
        return self.tok(texts, add_special_tokens=special)["input_ids"]

    def render_chat(self, messages: list[dict], add_generation_prompt: bool) -> str:
        if not self.chat_template:
            raise SlideDPError(f"tokenizer {self.name!r} has no chat template: --format messages needs one "
                               f"(a tokenizer_config.json with chat_template), or use --format prompt_completion")
        try:
            return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        except Exception as exc:  # jinja's raise_exception() and template errors
            raise SlideDPError(f"chat template failed: {str(exc).splitlines()[0][:160] if str(exc) else exc!r}") \
                from None

    def fingerprint(self) -> str:
        h = hashlib.blake2b(digest_size=16)
        for f in sorted(p for p in self.path.iterdir() if p.is_file()):
            h.update(f.name.encode())
            h.update(f.read_bytes())
        return h.hexdigest()

    def save(self, directory: Path) -> None:
        """Tokenizer files next to an exported model."""
        self.tok.save_pretrained(str(directory))


def load_tokenizer(path: str | None, vocab_size: int) -> ByteTokenizer | HFTokenizer:
    if path is None or path == BYTE_TOKENIZER:
        return ByteTokenizer(vocab_size)
    return HFTokenizer(path, vocab_size)
