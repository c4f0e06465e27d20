"""A GGUF model's own tokenizer and chat template, rebuilt as a `tokenizers.Tokenizer`.

The embedded model is one GGUF file: its vocabulary, merges, special tokens and chat template
are metadata inside it. Rebuilding the tokenizer from that metadata (with the `gguf` package,
without llama.cpp) gives the same ids llama.cpp computes, so masks and prompts built here match
what the model is fed. Only byte-level BPE vocabularies (`tokenizer.ggml.model` = "gpt2") with
a GPT-2-regex pre-tokenizer are rebuilt; others are refused rather than approximated.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from clotho.chat.template import ChatTemplate, ChatTemplateError
from clotho.chat.tokenizer import TemplateTokenizer

# llama.cpp token types (llama_token_type) that decide how text is split around a token.
_NORMAL, _CONTROL, _USER_DEFINED = 1, 3, 4

# `tokenizer.ggml.pre` kinds whose llama.cpp pre-tokenizer is the GPT-2 regex, with each digit
# split off first or not (llama-vocab.cpp). Only "smollm" is checked against llama.cpp here.
_DIGITS_THEN_GPT2 = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone"}
_DIGITS_THEN_GPT2 |= {"minerva-7b"}
_GPT2 = {"gpt-2", "phi-2", "mpt", "olmo", "jais", "exaone4"}


@dataclass(frozen=True)
class GgufVocab:
    """The tokenizer metadata of a GGUF file."""

    path: Path
    model: str
    pre: str
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    unk_id: int | None
    pad_id: int | None
    chat_template: str | None
    context_length: int | None

    def token(self, token_id: int | None) -> str | None:
        if token_id is None or not 0 <= token_id < len(self.tokens):
            return None
        return self.tokens[token_id]

    def end_of_turn_ids(self) -> list[int]:
        """Ids that end an assistant turn: eos, eot, and `<|im_end|>` when the vocabulary has it."""
        ids = [i for i in (self.eos_id, self.eot_id) if i is not None]
        if "<|im_end|>" in self.tokens:
            ids.append(self.tokens.index("<|im_end|>"))
        return sorted(set(ids))


def read_gguf_vocab(path: str | Path) -> GgufVocab:
    """Read the tokenizer metadata of a GGUF file (cached: `GGUFReader` takes seconds)."""
    return _read_vocab(Path(path).resolve())


@functools.lru_cache(maxsize=4)
def _read_vocab(path: Path) -> GgufVocab:
    try:
        from gguf import GGUFReader
    except ImportError as exc:  # pragma: no cover - gguf is in the `local` and `dev` extras
        raise ChatTemplateError(
            "reading a GGUF tokenizer needs the gguf package: pip install 'clotho-rl[local]'"
        ) from exc
    try:
        reader = GGUFReader(path)
    except (OSError, ValueError) as exc:
        raise ChatTemplateError(f"{path} is not a readable GGUF file: {exc}") from exc
    fields = reader.fields

    def value(key: str) -> Any:
        field = fields.get(key)
        return None if field is None else field.contents()

    def required(key: str) -> Any:
        found = value(key)
        if found is None:
            raise ChatTemplateError(f"{path} has no {key}: its tokenizer cannot be rebuilt")
        return found

    arch = value("general.architecture")
    context = value(f"{arch}.context_length") if arch else None
    return GgufVocab(
        path=path,
        model=str(required("tokenizer.ggml.model")),
        pre=str(value("tokenizer.ggml.pre") or "default"),
        tokens=list(required("tokenizer.ggml.tokens")),
        token_types=[int(t) for t in value("tokenizer.ggml.token_type") or []],
        merges=list(value("tokenizer.ggml.merges") or []),
        bos_id=value("tokenizer.ggml.bos_token_id"),
        eos_id=value("tokenizer.ggml.eos_token_id"),
        eot_id=value("tokenizer.ggml.eot_token_id"),
        unk_id=value("tokenizer.ggml.unknown_token_id"),
        pad_id=value("tokenizer.ggml.padding_token_id"),
        chat_template=value("tokenizer.chat_template"),
        context_length=int(context) if context is not None else None,
    )


def gguf_tokenizer(vocab: GgufVocab) -> Tokenizer:
    """The `tokenizers.Tokenizer` that splits text the way llama.cpp does for this vocabulary.

    Control tokens become special added tokens and user-defined ones plain added tokens: both
    are matched as whole strings before BPE, as llama.cpp does with `special=True`. No BOS is
    added (chat templates write it).
    """
    if vocab.model != "gpt2":
        raise ChatTemplateError(
            f"{vocab.path}: tokenizer model {vocab.model!r} is not supported "
            "(only byte-level BPE, tokenizer.ggml.model = 'gpt2')"
        )
    if vocab.pre in _DIGITS_THEN_GPT2:
        # llama.cpp: "\p{N}" then the GPT-2 regex; Hugging Face: Digits(individual) + ByteLevel.
        steps = [pre_tokenizers.Digits(individual_digits=True)]
    elif vocab.pre in _GPT2:
        steps = []
    else:
        raise ChatTemplateError(
            f"{vocab.path}: pre-tokenizer {vocab.pre!r} is not supported "
            f"(known: {sorted(_DIGITS_THEN_GPT2 | _GPT2)})"
        )
    ids = {token: i for i, token in enumerate(vocab.tokens)}
    if len(ids) != len(vocab.tokens):
        raise ChatTemplateError(f"{vocab.path}: the vocabulary has duplicate tokens")
    merges = [tuple(m.split(" ", 1)) for m in vocab.merges]
    if any(len(m) != 2 for m in merges):
        raise ChatTemplateError(f"{vocab.path}: a merge is not two tokens separated by a space")
    tokenizer = Tokenizer(models.BPE(vocab=ids, merges=merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([*steps, byte_level])
    tokenizer.decoder = decoders.ByteLevel()
    types = vocab.token_types or [_NORMAL] * len(vocab.tokens)
    special = [t for t, kind in zip(vocab.tokens, types, strict=True) if kind == _CONTROL]
    user = [t for t, kind in zip(vocab.tokens, types, strict=True) if kind == _USER_DEFINED]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
    return tokenizer


def gguf_chat_template(vocab: GgufVocab) -> ChatTemplate:
    """The chat template stored in the file, with its bos/eos/unk/pad token strings."""
    if not vocab.chat_template:
        raise ChatTemplateError(f"{vocab.path} has no tokenizer.chat_template")
    specials = {
        key: text
        for key, token_id in (
            ("bos_token", vocab.bos_id),
            ("eos_token", vocab.eos_id),
            ("unk_token", vocab.unk_id),
            ("pad_token", vocab.pad_id),
        )
        if (text := vocab.token(token_id)) is not None
    }
    return ChatTemplate(
        vocab.chat_template, specials, origin=f"{vocab.path.name} tokenizer.chat_template"
    )


def load_gguf_tokenizer(path: str | Path) -> TemplateTokenizer:
    """The tokenizer and chat template of a GGUF model, ready to render and mask conversations."""
    vocab = read_gguf_vocab(path)
    return TemplateTokenizer(gguf_tokenizer(vocab), gguf_chat_template(vocab))
