"""python -m llmcupy.data: token data, as llm.c's token files; Tiny Shakespeare preparation and the data loader.

Token file (``*.bin``): a 1024-byte header of 256 little-endian int32 (0: magic 20240520,
1: version 1, 2: token count n, rest 0), then n little-endian uint16 token ids; the file is exactly
1024 + 2n bytes.

CLI::

    python -m llmcupy.data tinyshakespeare [--out DIR] [--input FILE] [--bpe FILE] [--base-url URL]

downloads the Tiny Shakespeare text (unless ``--input`` names a local copy), tokenises it the llm.c
way (an ``<|endoftext|>`` before every blank-line-separated section) and writes
``tiny_shakespeare_val.bin`` (the first 32,768 tokens) and ``tiny_shakespeare_train.bin`` (the
rest) into ``DIR`` (default ``data/tinyshakespeare``).

:class:`DataLoader` serves llm.c's batches: files matching a glob pattern (sorted), each a shard;
a shard of n tokens holds ``(n - 1) // (B*T)`` samples, sample k being tokens
``[k*B*T, k*B*T + B*T]`` (B*T + 1 tokens; inputs = the first B*T, targets = the last B*T). With
``shuffle=True`` (the training loader) shard order and in-shard sample order are permuted with
:class:`MT19937` seeded ``42 + process_rank`` exactly as llm.c does; the validation loader reads
samples in order. After the last sample of the last shard the loader resets (a new epoch).
"""

from __future__ import annotations

import argparse
import glob as _glob
import os
import sys
from pathlib import Path

import numpy as np

from .fileio import (FileFormatError, atomic_write, check_magic_version, check_size, file_size,
                     make_header, output_folder_problem, read_array, read_header, write_array)

TOKENS_MAGIC = 20240520
TOKENS_VERSION = 1
TS_VAL_TOKENS = 32768
TS_VAL_NAME = "tiny_shakespeare_val.bin"
TS_TRAIN_NAME = "tiny_shakespeare_train.bin"
TS_DEFAULT_OUT = os.path.join("data", "tinyshakespeare")


class DataError(FileFormatError):
    """A token file is malformed or unusable with the requested batch shape."""


# ---------------------------------------------------------------------------------------------
# Token files


def write_tokens(path, tokens) -> int:
    """Writes llm.c's token file atomically; returns the token count. Ids must fit in uint16."""
    t = np.asarray(tokens).reshape(-1)
    if t.size and (t.min() < 0 or t.max() > 0xFFFF):
        raise ValueError(f"token ids must be in [0, 65535] to fit the uint16 format "
                         f"(got range [{t.min()}, {t.max()}])")
    if t.size > 0x7FFFFFFF:
        raise ValueError(f"{t.size} tokens do not fit the int32 count field")
    with atomic_write(path) as f:
        f.write(make_header(TOKENS_MAGIC, TOKENS_VERSION, t.size))
        write_array(f, t, np.uint16)
    return int(t.size)


def _check_token_header(f, path) -> int:
    what = "llm.c token file"
    header = read_header(f, path, what)
    check_magic_version(header, path, what, TOKENS_MAGIC, (TOKENS_VERSION,))
    n = int(header[2])
    if n < 0:
        raise DataError(f"{path}: negative token count {n} in the header")
    check_size(path, what, file_size(f), 1024 + 2 * n, f"1024-byte header + {n} uint16 tokens")
    return n


def token_count(path) -> int:
    """Validates a token file's header and exact size; returns its token count."""
    with open(path, "rb") as f:
        return _check_token_header(f, path)


def read_tokens(path) -> np.ndarray:
    """All tokens of a validated token file, as uint16."""
    with open(path, "rb") as f:
        n = _check_token_header(f, path)
        return read_array(f, np.uint16, n)


def check_token_ids(path, vocab_size: int) -> None:
    """Raises :class:`DataError` naming the file and offset of the first id >= ``vocab_size``
    (one pass over a memory map: about a second per 500 M tokens)."""
    n = token_count(path)
    if n == 0:
        return
    tokens = np.memmap(path, dtype="<u2", mode="r", offset=1024, shape=(n,))
    try:
        bad = np.flatnonzero(tokens >= vocab_size)
        if bad.size:
            i = int(bad[0])
            raise DataError(f"{path}: token id {int(tokens[i])} at token {i} (byte offset {1024 + 2 * i}) is "
                            f"outside the model's vocabulary 0..{vocab_size - 1} ({bad.size} such ids in the "
                            "file); re-tokenise the data with the model's tokenizer")
    finally:
        del tokens


# ---------------------------------------------------------------------------------------------
# Tiny Shakespeare


def tokenize_sections(text: str, enc) -> np.ndarray:
    """llm.c's preparation: split on blank lines ("\\n\\n"), emit EOT before every section,
    re-append "\\n\\n" to every section but the last, encode each with GPT-2's BPE (no special
    tokens). Same ids as encoding ``"<|endoftext|>" + text.replace("\\n\\n", "\\n\\n<|endoftext|>")``
    with the special token allowed."""
    eot = enc.eot_token
    sections = text.split("\n\n")
    pieces = [s + "\n\n" if i < len(sections) - 1 else s for i, s in enumerate(sections)]
    out: list[int] = []
    for ids in enc.encode_ordinary_batch(pieces, num_threads=1):
        out.append(eot)
        out.extend(ids)
    return np.asarray(out, dtype=np.int64)


def prepare_tinyshakespeare(text: str, enc, out_dir, *, log=print) -> dict:
    """Tokenises the corpus and writes the val (first 32,768 tokens) and train splits."""
    tokens = tokenize_sections(text, enc)
    if tokens.size <= TS_VAL_TOKENS:
        raise ValueError(f"the text gives only {tokens.size} tokens; the val split alone takes "
                         f"{TS_VAL_TOKENS}")
    out_dir = Path(out_dir)
    val_path, train_path = out_dir / TS_VAL_NAME, out_dir / TS_TRAIN_NAME
    n_val = write_tokens(val_path, tokens[:TS_VAL_TOKENS])
    log(f"wrote {n_val:,} tokens to {val_path}")
    n_train = write_tokens(train_path, tokens[TS_VAL_TOKENS:])
    log(f"wrote {n_train:,} tokens to {train_path}")
    return {"val": (val_path, n_val), "train": (train_path, n_train)}


# ---------------------------------------------------------------------------------------------
# MT19937 (the loader's shuffling RNG; bit-identical to PyTorch's CPU generator)

_N, _M = 624, 397
_UPPER, _LOWER, _MATRIX = np.uint32(0x80000000), np.uint32(0x7FFFFFFF), np.uint32(0x9908B0DF)


def _mix(cur, nxt, far):
    y = (cur & _UPPER) | (nxt & _LOWER)
    return far ^ (y >> np.uint32(1)) ^ ((y & np.uint32(1)) * _MATRIX)


def _twist(mt: np.ndarray) -> None:
    """The 624-word twist in place, vectorised in chunks that respect its data dependencies:
    word i reads words i+1 (not yet updated) and i+397 mod 624 (updated once it wrapped)."""
    k = _N - _M                                                    # 227
    mt[:k] = _mix(mt[:k], mt[1:k + 1], mt[_M:])                     # all reads old
    mt[k:2 * k] = _mix(mt[k:2 * k], mt[k + 1:2 * k + 1], mt[:k])      # far reads new 0..226
    mt[2 * k:_N - 1] = _mix(mt[2 * k:_N - 1], mt[2 * k + 1:], mt[k:_M - 1])  # far reads new 227..395
    mt[_N - 1:] = _mix(mt[_N - 1:], mt[:1], mt[_M - 1:_M])           # wraps to new word 0


def _temper(y: np.ndarray) -> np.ndarray:
    y = y ^ (y >> np.uint32(11))
    y = y ^ ((y << np.uint32(7)) & np.uint32(0x9D2C5680))
    y = y ^ ((y << np.uint32(15)) & np.uint32(0xEFC60000))
    return y ^ (y >> np.uint32(18))


class MT19937:
    """32-bit Mersenne Twister (n=624, m=397), seeded like PyTorch's CPU generator."""

    def __init__(self, seed: int = 5489):
        s = [int(seed) & 0xFFFFFFFF]
        for i in range(1, _N):
            s.append((1812433253 * (s[-1] ^ (s[-1] >> 30)) + i) & 0xFFFFFFFF)
        self.mt = np.array(s, dtype=np.uint32)
        self.index = _N
        self._out = None

    def _refill(self):
        _twist(self.mt)
        self.index = 0
        self._out = _temper(self.mt)

    def random_u32(self) -> int:
        if self.index >= _N:
            self._refill()
        elif self._out is None:
            self._out = _temper(self.mt)
        v = int(self._out[self.index])
        self.index += 1
        return v

    def random_u32_array(self, count: int) -> np.ndarray:
        out = np.empty(count, dtype=np.uint32)
        pos = 0
        while pos < count:
            if self.index >= _N:
                self._refill()
            elif self._out is None:
                self._out = _temper(self.mt)
            take = min(count - pos, _N - self.index)
            out[pos:pos + take] = self._out[self.index:self.index + take]
            self.index += take
            pos += take
        return out

    def state_dict(self) -> dict:
        return {"kind": "mt19937", "mt": self.mt.copy(), "index": self.index}

    def load_state_dict(self, d: dict) -> None:
        ok = isinstance(d, dict) and d.get("kind") == "mt19937" and "mt" in d and "index" in d
        mt = np.asarray(d["mt"], dtype=np.uint32).reshape(-1) if ok else None
        if not ok or mt.size != _N or not 0 <= int(d["index"]) <= _N:
            raise ValueError("not an MT19937 state (kind 'mt19937', 624 words, index 0..624)")
        self.mt, self.index, self._out = mt.copy(), int(d["index"]), None


def random_permutation(data: np.ndarray, rng: MT19937) -> None:
    """llm.c's in-place Fisher-Yates from the end: for i = n-1..1, j = u32 mod (i+1), swap i, j."""
    n = len(data)
    if n < 2:
        return
    draws = rng.random_u32_array(n - 1).tolist()  # one draw per i, in order i = n-1, n-2, ..., 1
    items = list(data)  # swapping Python list items is much faster than NumPy scalars
    for k, i in enumerate(range(n - 1, 0, -1)):
        j = draws[k] % (i + 1)
        items[i], items[j] = items[j], items[i]
    data[:] = items


# ---------------------------------------------------------------------------------------------
# Data loader


class DataLoader:
    """llm.c's distributed data loader over token shards (single process by default).

    ``next_batch()`` returns ``(inputs, targets)``, both int32 arrays of shape (B, T), and keeps
    them as ``.inputs`` / ``.targets``. ``state_dict()`` / ``load_state_dict()`` save and restore
    the position (shard, sample, permutations, RNG) for resuming a run.

    Several processes and gradient accumulation (llm.c's mainline): a *sample* is the whole
    step's batch, ``micro_steps * num_processes`` slices of B*T tokens (+1 for the targets); the
    ``i``-th call of a step on rank ``r`` reads slice ``i * num_processes + r``, and the sample
    advances after ``micro_steps`` calls. Every rank shuffles with the same seed (llm.c seeds each
    rank's shuffle with 42 + rank), so the slices of all ranks and micro-steps together are exactly
    the batch one process with ``B * num_processes * micro_steps`` rows reads.
    """

    def __init__(self, pattern, B: int, T: int, *, shuffle: bool = False, process_rank: int = 0,
                 num_processes: int = 1, seed: int = 42, micro_steps: int = 1, vocab_size: int | None = None):
        if B <= 0 or T <= 0:
            raise ValueError(f"B and T must be positive (got B={B}, T={T})")
        if not 0 <= process_rank < num_processes:
            raise ValueError(f"process_rank {process_rank} outside 0..{num_processes - 1}")
        self.pattern = pattern
        if isinstance(pattern, (list, tuple)):
            files = [str(p) for p in pattern]
        else:
            files = sorted(_glob.glob(str(pattern)))
        if not files:
            raise FileNotFoundError(f"no token files match {str(pattern)!r}")
        for path in files:   # -i DIR: the open would fail with a bare "is a folder"
            if os.path.isdir(path):
                raise DataError(f"{path} is a folder, not a token file; give the token files in it with a glob "
                                f"such as {os.path.join(path, '*.bin')!r}")
        self.files = files
        self.B, self.T = int(B), int(T)
        self.process_rank, self.num_processes = int(process_rank), int(num_processes)
        if micro_steps < 1:
            raise ValueError(f"micro_steps must be >= 1 (got {micro_steps})")
        self.micro_steps, self.micro_step = int(micro_steps), 0
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        need = self.slices * self.B * self.T + 1
        self.shard_tokens = []
        checked = files
        if vocab_size is not None and len(files) > 1:
            # scanning every id takes about a second per 500 M tokens: FineWeb-10B's shards take ~20 s
            from tqdm import tqdm

            # disable=None: a bar on a terminal only (no \r clutter in logs); leave=False: gone when done;
            # rank 0's only: several ranks on one terminal (srun --pty) would draw over one another
            checked = tqdm(files, desc="checking token files", unit="file", leave=False,
                           disable=None if self.process_rank == 0 else True, file=sys.stderr)
        for path in checked:  # validate every shard up front so no error waits for epoch 2
            n = token_count(path)
            if n < need:
                raise DataError(f"{path}: {n} tokens are too few for one batch: B*T+1 = {need} "
                                f"tokens needed (B={B}, T={T}, {num_processes} process(es), "
                                f"{micro_steps} micro-step(s))")
            if vocab_size is not None:
                check_token_ids(path, vocab_size)
            self.shard_tokens.append(n)
        self.num_tokens = int(sum(self.shard_tokens))
        self.rng = MT19937(self.seed) if self.shuffle else None
        self.shard_indices = np.arange(len(files), dtype=np.int64)
        self.intra_shard_indices = None
        self._file = None
        self._open_index = None
        self.inputs = self.targets = None
        self.reset()

    # -- shard handling

    @property
    def slices(self) -> int:
        """B*T slices per sample: one per process and micro-step."""
        return self.num_processes * self.micro_steps

    @property
    def num_shards(self) -> int:
        return len(self.files)

    def _file_index(self, shard_idx: int) -> int:
        return int(self.shard_indices[shard_idx]) if self.shuffle else shard_idx

    def _samples_in(self, file_index: int) -> int:
        return (self.shard_tokens[file_index] - 1) // (self.slices * self.B * self.T)

    def _load_shard(self, shard_idx: int) -> None:
        fi = self._file_index(shard_idx)
        if self._open_index != fi:
            self.close()
            self._file = open(self.files[fi], "rb", buffering=0)  # one read per batch, no stale buffer
            if _check_token_header(self._file, self.files[fi]) != self.shard_tokens[fi]:
                raise DataError(f"{self.files[fi]}: changed since the loader was created")
            self._open_index = fi
        self.shard_num_samples = self._samples_in(fi)

    def _prepare_intra_shard_indices(self) -> None:
        idx = np.arange(self.shard_num_samples, dtype=np.int64)
        random_permutation(idx, self.rng)
        self.intra_shard_indices = idx

    def reset(self) -> None:
        """Back to the first sample of the first shard; a shuffling loader draws new orders."""
        self.current_shard_idx = 0
        self.current_sample_idx = 0
        self.micro_step = 0
        if self.shuffle:
            random_permutation(self.shard_indices, self.rng)
        self._load_shard(self.current_shard_idx)
        if self.shuffle:
            self._prepare_intra_shard_indices()

    def _advance(self) -> None:
        if self.current_shard_idx == self.num_shards - 1:
            self.reset()  # end of the last shard: new epoch
            return
        self.current_shard_idx += 1
        self.current_sample_idx = 0
        self.micro_step = 0
        self._load_shard(self.current_shard_idx)
        if self.shuffle:
            self._prepare_intra_shard_indices()

    def _sample_index(self) -> int:
        if self.shuffle:
            return int(self.intra_shard_indices[self.current_sample_idx])
        return self.current_sample_idx

    def next_batch(self):
        """The next (inputs, targets) pair, int32 arrays of shape (B, T)."""
        if self.current_sample_idx >= self.shard_num_samples:
            self._advance()
        bt = self.B * self.T
        slot = self.micro_step * self.num_processes + self.process_rank
        offset = 1024 + 2 * (self._sample_index() * self.slices * bt + slot * bt)
        self._file.seek(offset)
        try:
            buf = read_array(self._file, np.uint16, bt + 1).astype(np.int32)
        except EOFError as e:
            raise DataError(f"{self.files[self._open_index]}: truncated while reading a batch "
                            f"(the file changed?): {e}") from e
        self.inputs = buf[:-1].reshape(self.B, self.T)
        self.targets = buf[1:].reshape(self.B, self.T)
        self.micro_step += 1
        if self.micro_step == self.micro_steps:
            self.micro_step = 0
            self.current_sample_idx += 1
        return self.inputs, self.targets

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None
        self._open_index = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -- resume

    def state_dict(self) -> dict:
        """Position and RNG state; values are ints, strings, lists and NumPy arrays."""
        return {
            "kind": "llmcupy.DataLoader",
            "files": [os.path.basename(p) for p in self.files],
            "shard_tokens": list(self.shard_tokens),
            "B": self.B, "T": self.T,
            "process_rank": self.process_rank, "num_processes": self.num_processes,
            "micro_steps": self.micro_steps, "micro_step": self.micro_step,
            "shuffle": self.shuffle, "seed": self.seed,
            "current_shard_idx": self.current_shard_idx,
            "current_sample_idx": self.current_sample_idx,
            "shard_indices": self.shard_indices.copy(),
            "intra_shard_indices": None if self.intra_shard_indices is None
            else self.intra_shard_indices.copy(),
            "rng": None if self.rng is None else self.rng.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restores a position saved by :meth:`state_dict` on a loader over the same shards."""
        if state.get("kind") != "llmcupy.DataLoader":
            raise ValueError("not a DataLoader state")
        mine = {"files": [os.path.basename(p) for p in self.files], "shard_tokens": list(self.shard_tokens),
                "B": self.B, "T": self.T, "process_rank": self.process_rank,
                "num_processes": self.num_processes, "shuffle": self.shuffle,
                "micro_steps": self.micro_steps}
        for key, value in mine.items():
            theirs = state.get(key)
            if key == "micro_steps" and theirs is None:
                theirs = 1   # a state written before gradient accumulation existed
            if key in ("files", "shard_tokens"):
                theirs = [x if isinstance(x, str) else int(x) for x in theirs]
            if theirs != value:
                raise ValueError(f"data loader state does not match this loader: {key} is {theirs!r} "
                                 f"in the state, {value!r} here")
        shard_idx, sample_idx = int(state["current_shard_idx"]), int(state["current_sample_idx"])
        if not 0 <= shard_idx < self.num_shards:
            raise ValueError(f"data loader state: shard index {shard_idx} outside 0..{self.num_shards - 1}")
        self.shard_indices = np.asarray(state["shard_indices"], dtype=np.int64).copy()
        if sorted(self.shard_indices.tolist()) != list(range(self.num_shards)):
            raise ValueError("data loader state: shard_indices is not a permutation of the shards")
        if self.shuffle:
            self.rng.load_state_dict(state["rng"])
        self.current_shard_idx = shard_idx
        self._load_shard(shard_idx)
        if not 0 <= sample_idx <= self.shard_num_samples:
            raise ValueError(f"data loader state: sample index {sample_idx} outside "
                             f"0..{self.shard_num_samples}")
        self.current_sample_idx = sample_idx
        self.micro_step = int(state.get("micro_step", 0))
        if not 0 <= self.micro_step < self.micro_steps:
            raise ValueError(f"data loader state: micro step {self.micro_step} outside 0..{self.micro_steps - 1}")
        if self.shuffle:
            intra = np.asarray(state["intra_shard_indices"], dtype=np.int64).copy()
            if intra.size != self.shard_num_samples:
                raise ValueError("data loader state: intra_shard_indices has the wrong length")
            self.intra_shard_indices = intra


# ---------------------------------------------------------------------------------------------
# CLI


def main(argv=None) -> int:
    from . import download
    from .tokenizer import TokenizerError, get_encoding

    parser = argparse.ArgumentParser(prog="python -m llmcupy.data",
                                     description="Prepare llm.c token files for a data set.")
    parser.add_argument("dataset", choices=["tinyshakespeare"])
    parser.add_argument("--out", default=TS_DEFAULT_OUT,
                        help=f"output folder (default {TS_DEFAULT_OUT}, relative to the current folder)")
    parser.add_argument("--input", metavar="FILE", help="use this local copy of the raw text instead of downloading")
    parser.add_argument("--bpe", metavar="FILE",
                        help="gpt2.tiktoken BPE rank file (default: $LLMCUPY_GPT2_BPE, else tiktoken's download)")
    parser.add_argument("--base-url", metavar="URL",
                        help=f"download from this base URL instead of the public one (or set {download.BASE_ENV})")
    args = parser.parse_args(argv)
    problem = output_folder_problem(args.out)
    if problem:   # before tokenising or downloading
        print(f"error: --out {args.out}: {problem}", file=sys.stderr)
        return 2
    try:
        enc = get_encoding(args.bpe)  # before any download, so a missing tokenizer fails fast
        if args.input:
            text_path = Path(args.input)
        else:
            try:
                text_path = download.download("tinyshakespeare", args.out, base_url=args.base_url,
                                              progress=None)[0]   # a bar only on a terminal
            except download.Unreachable as e:   # offline: say how this command takes a copy
                raise download.Unreachable(f"{e}; then give it with --input FILE") from None
        try:
            text = text_path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:   # the codec's message names no file
            raise DataError(f"{text_path}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); "
                            "--input takes the raw Tiny Shakespeare text") from None
        try:
            prepare_tinyshakespeare(text, enc, args.out)
        except DataError:
            raise
        except ValueError as e:   # a text too short for the split: say which file
            raise DataError(f"{text_path}: {e}") from None
    except (TokenizerError, download.DownloadError, FileFormatError, OSError, ValueError) as e:
        from ._cli import fail

        return fail(e)   # bad input or files, or a failed download: 2
    return 0


if __name__ == "__main__":
    from llmcupy._cli import run_main

    sys.exit(run_main(main))
