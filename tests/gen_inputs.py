"""Small inputs the tests make themselves, so a fresh clone (no ``../shared`` data, no network)
runs the trainer, data, tokenizer and notebook tests.

* :func:`make_text`: Shakespeare-like text (speaker lines in blank-line-separated sections) from a
  seeded RNG over a small word list;
* :func:`write_tiny_bpe`: a BPE rank file in tiktoken's format with GPT-2's shape (the 256 byte
  tokens, merges that build the word list's words, then filler tokens up to 50,256 ranks, which
  are byte strings that never occur in UTF-8 text), so :func:`llmcupy.tokenizer.get_encoding`
  accepts it and ids stay below GPT-2's vocabulary (EOT = 50256);
* :func:`write_token_files`: llm.c's train/val token files of that text.
"""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np

WORDS = ("the and to of my that in you is not with it me for be his this your he but have as thou so "
         "him will what her thy all do no by shall if are we lord king good now sir come our love more "
         "well they let which than would then there how one upon hath o like make know say may").split()
SPEAKERS = ("ROMEO", "JULIET", "First Citizen", "KING RICHARD", "MENENIUS", "GLOUCESTER")
N_RANKS = 50256


def make_text(n_sections: int = 40, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    sections = []
    for _ in range(n_sections):
        lines = [f"{SPEAKERS[rng.integers(len(SPEAKERS))]}:"]
        for _ in range(int(rng.integers(1, 4))):
            words = [WORDS[i] for i in rng.integers(0, len(WORDS), size=int(rng.integers(4, 10)))]
            lines.append(" ".join(words).capitalize() + rng.choice([",", ".", "!", "?", ";"]))
        sections.append("\n".join(lines))
    return "\n\n".join(sections) + "\n"


def write_tiny_bpe(path) -> Path:
    """A GPT-2-shaped tiktoken rank file; a few KB of real merges, the rest filler."""
    ranks: list[bytes] = [bytes([b]) for b in range(256)]
    seen = set(ranks)
    for word in (*WORDS, *(w.capitalize() for w in WORDS), *SPEAKERS):
        for piece in (word, " " + word):
            data = piece.encode()
            for end in range(2, len(data) + 1):   # every prefix: a merge path to the whole word
                if data[:end] not in seen:
                    seen.add(data[:end])
                    ranks.append(data[:end])
    i = 0
    while len(ranks) < N_RANKS:   # 0xF8..0xFF never occur in UTF-8: these tokens never match
        filler = b"\xf8" + str(i).encode()
        i += 1
        if filler not in seen:
            seen.add(filler)
            ranks.append(filler)
    path = Path(path)
    path.write_bytes(b"".join(base64.b64encode(t) + b" " + str(r).encode() + b"\n" for r, t in enumerate(ranks)))
    return path


def write_token_files(folder, bpe_path, n_sections: int = 60, val_sections: int = 12, seed: int = 0):
    """(train, val) llm.c token files of generated text, tokenised the llm.c way."""
    from llmcupy.data import tokenize_sections, write_tokens
    from llmcupy.tokenizer import get_encoding

    enc = get_encoding(bpe_path)
    folder = Path(folder)
    train = tokenize_sections(make_text(n_sections, seed), enc)
    val = tokenize_sections(make_text(val_sections, seed + 1), enc)
    write_tokens(folder / "train.bin", train)
    write_tokens(folder / "val.bin", val)
    return folder / "train.bin", folder / "val.bin"
