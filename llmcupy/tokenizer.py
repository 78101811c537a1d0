"""python -m llmcupy.tokenizer: GPT-2's tokenizer, the BPE encoder (tiktoken) and llm.c's decoder table file.

Encoding (text -> ids) uses tiktoken. :func:`get_encoding` finds GPT-2's BPE ranks, in order:

1. an explicit path (``--bpe FILE`` on the CLIs): a ``gpt2.tiktoken`` file in tiktoken's format
   (one ``base64(token) rank`` pair a line, 50,256 ranks);
2. the file named by the environment variable ``LLMCUPY_GPT2_BPE``;
3. ``tiktoken.get_encoding("gpt2")``, which downloads OpenAI's files on first use (or finds them
   in tiktoken's cache).

An encoding built from a file uses GPT-2's split pattern, the special token
``<|endoftext|>`` = 50256 and 50,257 ids in all, i.e. the same ids as tiktoken's own "gpt2".

CLI: ``python -m llmcupy.tokenizer [--bpe FILE] [-o gpt2_tokenizer.bin] [--bpe-out gpt2.tiktoken]``
writes the decoder table the trainer reads from its working folder and, with ``--bpe-out``, GPT-2's
rank file for ``--bpe`` on a machine without internet access (tiktoken itself builds the encoding
from OpenAI's vocab.bpe and encoder.json, so there is no such file to download).

Decoding (ids -> bytes) in the trainer uses llm.c's tokenizer file ``gpt2_tokenizer.bin``
(:class:`Tokenizer`): a 1024-byte header of 256 unsigned little-endian 32-bit integers
(0: magic 20240328, 1: version 2 (version 1 has no EOT field: EOT is 50256 and N must be 50257),
2: N tokens, 3: EOT id), then N records: one length byte L (1..255) and L raw bytes.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import os
import sys
from pathlib import Path

import tiktoken

from .fileio import (KNOWN_MAGICS, FileFormatError, atomic_write, check_magic_version, file_size, make_header,
                     read_header)

GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT_TOKEN = "<|endoftext|>"
EOT_ID = 50256
GPT2_VOCAB_SIZE = 50257
BPE_ENV = "LLMCUPY_GPT2_BPE"

TOKENIZER_MAGIC = 20240328
TOKENIZER_VERSION = 2


class TokenizerError(RuntimeError):
    """GPT-2's BPE ranks cannot be found or read."""


# ---------------------------------------------------------------------------------------------
# Encoding (tiktoken)


def load_bpe_ranks(path) -> dict[bytes, int]:
    """Parses a tiktoken ``.tiktoken`` file: ``base64(token) rank`` per line."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TokenizerError(f"cannot read GPT-2 BPE file {path}: {e.strerror or e}") from e
    kind = KNOWN_MAGICS.get(int.from_bytes(data[:4], "little")) if len(data) >= 4 else None
    if kind is not None:   # the binary header would be quoted as the bad first line
        hint = ("give it with --tokenizer, and the rank file with --bpe" if kind == KNOWN_MAGICS[TOKENIZER_MAGIC]
                else "--bpe takes GPT-2's rank file")
        raise TokenizerError(f"{path}: it is {kind}, not a tiktoken BPE rank file (gpt2.tiktoken); {hint}")
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        try:
            if len(parts) != 2:
                raise ValueError("expected two fields")
            token, rank = base64.b64decode(parts[0], validate=True), int(parts[1])
        except (ValueError, binascii.Error) as e:
            raise TokenizerError(f"{path}:{lineno}: not a tiktoken BPE file "
                                 f"(expected 'base64-token rank' per line): {line[:60]!r}") from e
        ranks[token] = rank
    if not ranks:
        raise TokenizerError(f"{path}: empty BPE file")
    return ranks


def encoding_from_file(path) -> tiktoken.Encoding:
    """GPT-2's encoding built from a ``gpt2.tiktoken`` rank file."""
    ranks = load_bpe_ranks(path)
    if len(ranks) != EOT_ID or max(ranks.values()) != EOT_ID - 1:
        raise TokenizerError(f"{path}: has {len(ranks)} BPE ranks (max rank {max(ranks.values())}); "
                             f"GPT-2's file has {EOT_ID} (ranks 0..{EOT_ID - 1})")
    try:
        return tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                                 special_tokens={EOT_TOKEN: EOT_ID}, explicit_n_vocab=GPT2_VOCAB_SIZE)
    except (ValueError, AssertionError) as e:
        raise TokenizerError(f"{path}: not a valid GPT-2 BPE file: {e}") from e


def get_encoding(bpe_path=None) -> tiktoken.Encoding:
    """GPT-2's tiktoken encoding: from ``bpe_path``, else $LLMCUPY_GPT2_BPE, else tiktoken's "gpt2"."""
    if bpe_path is not None:
        return encoding_from_file(bpe_path)
    env = os.environ.get(BPE_ENV)
    if env:
        return encoding_from_file(env)
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # network, proxy, cache or missing-package errors all end up here
        raise TokenizerError(
            f"cannot load tiktoken's GPT-2 encoding ({type(e).__name__}: {e}). tiktoken downloads it "
            f"on first use; without internet access pass --bpe FILE (a gpt2.tiktoken rank file; "
            f"python -m llmcupy.tokenizer --bpe-out gpt2.tiktoken writes one where tiktoken can download) or "
            f"set {BPE_ENV}=FILE") from e


def write_bpe_ranks(path, enc: tiktoken.Encoding) -> None:
    """Writes ``enc``'s BPE ranks as a tiktoken rank file (``base64(token) rank`` a line, by rank),
    atomically: what :func:`encoding_from_file` reads. In tiktoken a mergeable token's id is its rank."""
    with atomic_write(path) as f:
        f.write(b"".join(base64.b64encode(enc.decode_single_token_bytes(rank)) + b" %d\n" % rank
                         for rank in range(EOT_ID)))


# ---------------------------------------------------------------------------------------------
# llm.c's decoder table (gpt2_tokenizer.bin)


class Tokenizer:
    """llm.c's decoder table: token id -> raw bytes, plus the EOT id."""

    def __init__(self, tokens, eot_id: int = EOT_ID):
        self.tokens = [bytes(t) for t in tokens]
        if not 0 <= eot_id < len(self.tokens):
            raise ValueError(f"EOT id {eot_id} outside the {len(self.tokens)} tokens")
        self.eot_id = int(eot_id)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def __len__(self):
        return len(self.tokens)

    @classmethod
    def from_encoding(cls, enc: tiktoken.Encoding | None = None) -> "Tokenizer":
        """The decoder table of a tiktoken encoding (GPT-2's by default)."""
        enc = get_encoding() if enc is None else enc
        return cls([enc.decode_single_token_bytes(i) for i in range(enc.n_vocab)], enc.eot_token)

    @classmethod
    def load(cls, path) -> "Tokenizer":
        """Reads llm.c's ``gpt2_tokenizer.bin`` (versions 1 and 2)."""
        what = "llm.c tokenizer file"
        with open(path, "rb") as f:
            header = read_header(f, path, what, unsigned=True)
            version = check_magic_version(header, path, what, TOKENIZER_MAGIC, (1, 2),
                                          "write one with python -m llmcupy.tokenizer, or --bpe FILE for the trainer")
            n = int(header[2])
            if version == 1:
                if n != GPT2_VOCAB_SIZE:
                    raise FileFormatError(f"{path}: version-1 tokenizer file must hold {GPT2_VOCAB_SIZE} "
                                          f"tokens (it has no EOT field), header says {n}")
                eot = EOT_ID
            else:
                eot = int(header[3])
            if n == 0:
                raise FileFormatError(f"{path}: tokenizer file holds no tokens")
            if not 0 <= eot < n:
                raise FileFormatError(f"{path}: EOT id {eot} is outside the {n} tokens")
            data = f.read()
            size = file_size(f)
        tokens, pos = [], 0
        for i in range(n):
            if pos >= len(data):
                raise FileFormatError(f"{path}: truncated tokenizer file: ends after {i} of {n} tokens "
                                      f"({size} bytes)")
            length = data[pos]
            if length == 0:
                raise FileFormatError(f"{path}: token {i} has length 0 (lengths are 1..255)")
            if pos + 1 + length > len(data):
                raise FileFormatError(f"{path}: truncated tokenizer file: token {i} of {n} needs "
                                      f"{length} bytes, only {len(data) - pos - 1} left")
            tokens.append(data[pos + 1:pos + 1 + length])
            pos += 1 + length
        if pos != len(data):
            raise FileFormatError(f"{path}: size mismatch: {len(data) - pos} unexpected trailing bytes "
                                  f"after the {n} tokens")
        return cls(tokens, eot)

    def save(self, path) -> None:
        """Writes llm.c's tokenizer file (version 2), atomically."""
        for i, t in enumerate(self.tokens):
            if not 1 <= len(t) <= 255:
                raise ValueError(f"token {i} is {len(t)} bytes long; the format stores 1..255")
        with atomic_write(path) as f:
            f.write(make_header(TOKENIZER_MAGIC, TOKENIZER_VERSION, len(self.tokens), self.eot_id,
                                unsigned=True))
            f.write(b"".join(bytes([len(t)]) + t for t in self.tokens))

    # -- decoding

    def decode_token(self, token_id: int) -> bytes:
        token_id = int(token_id)
        if not 0 <= token_id < len(self.tokens):
            raise ValueError(f"invalid token id {token_id} (the tokenizer has {len(self.tokens)} tokens)")
        return self.tokens[token_id]

    def decode_bytes(self, ids) -> bytes:
        return b"".join(self.decode_token(i) for i in ids)

    def decode(self, ids) -> str:
        """Text of a token sequence (bytes joined first, invalid UTF-8 replaced)."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


def write_tokenizer(path, enc: tiktoken.Encoding | None = None) -> Tokenizer:
    """Writes llm.c's ``gpt2_tokenizer.bin`` for ``enc`` (GPT-2's by default); returns the table."""
    tok = Tokenizer.from_encoding(enc)
    tok.save(path)
    return tok


def printable_piece(piece: bytes) -> bytes:
    """What llm.c's sampler prints for one token: nothing for an empty piece or for a single byte
    that is neither printable ASCII nor whitespace (raw control bytes would garble a terminal);
    otherwise the bytes unchanged (multi-byte pieces may be partial UTF-8)."""
    if not piece:
        return b""
    if len(piece) == 1:
        c = piece[0]
        if not (0x20 <= c <= 0x7E or c in b" \t\n\v\f\r"):
            return b""
    return piece


def sample_piece(token_id: int, tokenizer: Tokenizer | None) -> bytes:
    """One generated token as the trainer prints it: its printable bytes, or "<id> " without a
    tokenizer."""
    if tokenizer is None:
        return f"{int(token_id)} ".encode()
    return printable_piece(tokenizer.decode_token(token_id))


def write_sample_piece(token_id: int, tokenizer: Tokenizer | None, stream=None) -> None:
    """Writes :func:`sample_piece` to a text stream's byte buffer (stdout by default) and flushes."""
    stream = sys.stdout if stream is None else stream
    piece = sample_piece(token_id, tokenizer)
    buf = getattr(stream, "buffer", None)
    if buf is not None:
        stream.flush()
        buf.write(piece)
        buf.flush()
    else:
        stream.write(piece.decode("utf-8", errors="replace"))
        stream.flush()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmcupy.tokenizer",
                                     description="Write llm.c's GPT-2 tokenizer file (the trainer's decoder table).")
    parser.add_argument("-o", "--out", default="gpt2_tokenizer.bin", help="output file (default gpt2_tokenizer.bin)")
    parser.add_argument("--bpe", metavar="FILE",
                        help=f"gpt2.tiktoken BPE rank file (default: ${BPE_ENV}, else tiktoken's download)")
    parser.add_argument("--bpe-out", metavar="FILE",
                        help="also write GPT-2's BPE rank file here (gpt2.tiktoken), for --bpe on a machine offline")
    args = parser.parse_args(argv)
    from .fileio import output_path_problem

    # checked first: a folder was reported naming a hidden temporary file, and -o on the BPE file
    # itself replaced it (the only GPT-2 rank file of an offline machine)
    bpe = args.bpe or os.environ.get(BPE_ENV)
    for flag, out in (("-o", args.out), ("--bpe-out", args.bpe_out)):
        if out is None:
            continue
        problem = output_path_problem(out, makes_folders=True)
        if problem is None and bpe and os.path.exists(out) and os.path.exists(bpe) and os.path.samefile(out, bpe):
            problem = "it is the BPE file this reads; give another file"
        if problem is None and flag == "--bpe-out" and os.path.abspath(out) == os.path.abspath(args.out):
            problem = "-o names it too; give another file"
        if problem:
            print(f"error: {flag} {out}: {problem}", file=sys.stderr)
            return 2
    try:
        enc = get_encoding(args.bpe)
        tok = write_tokenizer(args.out, enc)
        if args.bpe_out:
            write_bpe_ranks(args.bpe_out, enc)
    except (TokenizerError, OSError, ValueError) as e:
        from ._cli import fail

        return fail(e)   # a missing or bad BPE file, an unwritable output: 2
    print(f"wrote {args.out}: {len(tok)} tokens, EOT {tok.eot_id}")
    if args.bpe_out:
        print(f"wrote {args.bpe_out}: GPT-2's {EOT_ID} BPE ranks (give it with --bpe, or {BPE_ENV}, where tiktoken "
              "cannot download)")
    return 0


if __name__ == "__main__":
    from llmcupy._cli import run_main

    sys.exit(run_main(main))
