"""Tokenizers: the built-in character-level tokenizer for synthetic tasks, and a real
``tokenizer.json`` through the optional ``tokenizers`` library.

``CharTokenizer()``: ids 0/1/2 are ``<pad>``/``<bos>``/``<eos>``, then one id per character of
``CharTokenizer.ALPHABET`` (digits, letters, space, operators and punctuation); 96 ids in all
(``vocab_size``). ``encode(text, add_bos=False) -> list[int]`` raises ``ValueError`` naming an
unknown character; ``decode(ids, skip_special=True) -> str``.

``HFTokenizer.from_file(path)`` wraps ``tokenizers.Tokenizer`` with the same methods.
``load_tokenizer(model_dir_or_None)`` returns the HF tokenizer when ``tokenizer.json`` exists in
the directory, else the character tokenizer.
"""
from __future__ import annotations

import json
import string
from pathlib import Path


class CharTokenizer:
    SPECIALS = ("<pad>", "<bos>", "<eos>")
    ALPHABET = (string.digits + string.ascii_lowercase + string.ascii_uppercase
                + " +-*/=()<>,.:;?!_[]#\n%&@^|{}~$'")

    def __init__(self):
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
        self._to_id = {c: i + len(self.SPECIALS) for i, c in enumerate(self.ALPHABET)}
        self._to_str = {i: c for c, i in self._to_id.items()}

    @property
    def vocab_size(self) -> int:
        return len(self.SPECIALS) + len(self.ALPHABET)

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = [self.bos_id] if add_bos else []
        for i, c in enumerate(text):
            try:
                ids.append(self._to_id[c])
            except KeyError:
                raise ValueError(f"character {c!r} at index {i} is not in the character "
                                 f"tokenizer's alphabet") from None
        return ids

    def decode(self, ids, skip_special: bool = True) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i < len(self.SPECIALS):
                if not skip_special:
                    out.append(self.SPECIALS[i])
            elif i in self._to_str:
                out.append(self._to_str[i])
            else:
                raise ValueError(f"token id {i} is outside the character tokenizer's vocabulary "
                                 f"(size {self.vocab_size})")
        return "".join(out)


class HFTokenizer:
    """A Hugging Face ``tokenizer.json`` (needs the optional ``tokenizers`` package)."""

    def __init__(self, tok, bos_id: int | None, eos_id: int | None, pad_id: int | None):
        self._tok = tok
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id

    @classmethod
    def from_file(cls, path, bos_id=None, eos_id=None, pad_id=None) -> "HFTokenizer":
        try:
            from tokenizers import Tokenizer
        except ImportError as e:
            raise ImportError(f"loading {path} needs the 'tokenizers' package "
                              f"(pip install tokenizers)") from e
        return cls(Tokenizer.from_file(str(path)), bos_id, eos_id, pad_id)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return ([self.bos_id] if add_bos and self.bos_id is not None else []) + ids

    def decode(self, ids, skip_special: bool = True) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special)


def load_tokenizer(model_dir=None):
    """``tokenizer.json`` of ``model_dir`` if present (special ids from its config.json), else the
    character tokenizer."""
    if model_dir is not None and (Path(model_dir) / "tokenizer.json").is_file():
        cfg = Path(model_dir) / "config.json"
        c = json.loads(cfg.read_text()) if cfg.is_file() else {}
        eos = c.get("eos_token_id")
        eos = eos[0] if isinstance(eos, list) else eos
        return HFTokenizer.from_file(Path(model_dir) / "tokenizer.json", c.get("bos_token_id"),
                                     eos, c.get("pad_token_id"))
    return CharTokenizer()
