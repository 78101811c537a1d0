"""Token files, Tiny Shakespeare preparation, MT19937 and the data loader."""

from pathlib import Path

import numpy as np
import pytest

from llmcupy import data
from llmcupy.data import MT19937, DataError, DataLoader, random_permutation, read_tokens, token_count, write_tokens
from llmcupy.fileio import FileFormatError

import os

import gen_inputs

SHARED_DATA = Path(os.environ.get("LLMCUPY_TEST_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")
BPE = SHARED_DATA / "gpt2.tiktoken"
TEXT = SHARED_DATA / "tinyshakespeare.txt"


@pytest.fixture(scope="module")
def shared():
    missing = [p for p in (BPE, TEXT) if not p.is_file()]
    if missing:
        pytest.skip(f"optional real-data check: set LLMCUPY_TEST_DATA to a folder holding tinyshakespeare.txt and "
                    f"gpt2.tiktoken (missing: {', '.join(map(str, missing))})")
    return BPE, TEXT


@pytest.fixture(scope="module")
def tiny_bpe(tmp_path_factory):
    """A GPT-2-shaped BPE rank file made here (gen_inputs): the CLI tests run offline on it."""
    return gen_inputs.write_tiny_bpe(tmp_path_factory.mktemp("bpe") / "tiny.tiktoken")


def test_tinyshakespeare_cli_on_generated_text(tiny_bpe, tmp_path, capsys):
    text = tmp_path / "input.txt"
    text.write_text(gen_inputs.make_text(n_sections=1600, seed=3))
    out = tmp_path / "ts"
    assert data.main(["tinyshakespeare", "--input", str(text), "--bpe", str(tiny_bpe), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    val, train = out / "tiny_shakespeare_val.bin", out / "tiny_shakespeare_train.bin"
    assert token_count(val) == 32768 and "32,768 tokens" in printed
    from llmcupy.tokenizer import get_encoding

    total = data.tokenize_sections(text.read_text(), get_encoding(tiny_bpe)).size
    assert token_count(train) == total - 32768 > 0
    assert read_tokens(val)[0] == 50256
    assert not list(out.glob(".*.tmp"))


# -- Tiny Shakespeare


def test_tinyshakespeare_split_sizes(shared, tmp_path, capsys):
    bpe, text = shared
    out = tmp_path / "ts"
    assert data.main(["tinyshakespeare", "--input", str(text), "--bpe", str(bpe), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "32,768 tokens" in printed and "305,260 tokens" in printed
    val, train = out / "tiny_shakespeare_val.bin", out / "tiny_shakespeare_train.bin"
    assert token_count(val) == 32768 and token_count(train) == 305260
    assert val.stat().st_size == 1024 + 2 * 32768 == 66560
    assert train.stat().st_size == 611544
    v = read_tokens(val)
    assert v[0] == 50256 and v.dtype == np.uint16
    assert not list(out.glob(".*.tmp"))  # no temporary files left behind


def test_tokenisation_is_llmc_way(shared):
    from llmcupy.tokenizer import get_encoding

    bpe, text_path = shared
    enc = get_encoding(bpe)
    text = text_path.read_text(encoding="utf-8")
    tokens = data.tokenize_sections(text, enc)
    assert tokens.size == 338028
    # same ids as the special-token formulation in shared/data/README.md
    prepared = "<|endoftext|>" + text.replace("\n\n", "\n\n<|endoftext|>")
    assert np.array_equal(tokens, enc.encode(prepared, allowed_special={"<|endoftext|>"}))
    assert enc.decode(tokens[:12].tolist()).startswith("<|endoftext|>First Citizen:\n")


def test_tokenize_sections_small():
    class FakeEnc:  # one id per character, to see exactly where EOTs go
        eot_token = 0

        def encode_ordinary_batch(self, pieces, num_threads=1):
            return [[ord(ch) for ch in p] for p in pieces]

    got = data.tokenize_sections("ab\n\ncd\n\n\n\ne", FakeEnc()).tolist()
    nl = ord("\n")
    assert got == [0, 97, 98, nl, nl, 0, 99, 100, nl, nl, 0, nl, nl, 0, 101]


def test_cli_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("LLMCUPY_GPT2_BPE", raising=False)
    assert data.main(["tinyshakespeare", "--bpe", str(tmp_path / "none.tiktoken"), "--out", str(tmp_path)]) == 2
    assert "cannot read GPT-2 BPE file" in capsys.readouterr().err
    bpe = gen_inputs.write_tiny_bpe(tmp_path / "tiny.tiktoken")
    assert data.main(["tinyshakespeare", "--bpe", str(bpe), "--input", str(tmp_path / "no.txt"),
                      "--out", str(tmp_path)]) == 2
    assert "no.txt" in capsys.readouterr().err
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("too short\n\nfor a split")
    assert data.main(["tinyshakespeare", "--bpe", str(bpe), "--input", str(tiny), "--out", str(tmp_path)]) == 2
    assert "only" in capsys.readouterr().err
    # --out on a file (or under one) said only "FILE: File exists"
    for out, message in ((tiny, f"--out {tiny}: it is a file; give a folder"),
                         (tiny / "sub", f"--out {tiny / 'sub'}: {tiny} is not a folder")):
        assert data.main(["tinyshakespeare", "--bpe", str(bpe), "--input", str(tiny), "--out", str(out)]) == 2
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        data.main(["wikipedia"])


def test_cli_names_an_input_text_it_cannot_use(tmp_path, capsys):
    # a binary --input said only "'utf-8' codec can't decode byte 0xc6 in position 0: ...", and a
    # short one "the text gives only N tokens": neither named the file
    bpe = gen_inputs.write_tiny_bpe(tmp_path / "tiny.tiktoken")
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"plain start \xc6\xd7 then binary")
    short = tmp_path / "short.txt"
    short.write_text("too short\n\nfor a split")
    out = tmp_path / "ts"
    for text, message in ((binary, f"error: {binary}: not UTF-8 text (byte 0xc6 at offset 12); --input takes "
                                   "the raw Tiny Shakespeare text"),
                          (short, f"error: {short}: the text gives only ")):
        assert data.main(["tinyshakespeare", "--bpe", str(bpe), "--input", str(text), "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(message) and len(err.splitlines()) == 1, err
        assert not out.exists() or not list(out.iterdir())


# -- token files


def test_token_file_roundtrip(tmp_path):
    tokens = np.array([0, 1, 50256, 65535, 7], dtype=np.int64)
    path = tmp_path / "t.bin"
    assert write_tokens(path, tokens) == 5
    raw = path.read_bytes()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    assert list(header[:3]) == [20240520, 1, 5] and not header[3:].any()
    assert np.array_equal(np.frombuffer(raw[1024:], dtype="<u2"), tokens)
    assert np.array_equal(read_tokens(path), tokens)
    with pytest.raises(ValueError, match=r"\[0, 65535\]"):
        write_tokens(tmp_path / "big.bin", [1, 65536])
    with pytest.raises(ValueError, match=r"\[0, 65535\]"):
        write_tokens(tmp_path / "neg.bin", [-1])
    assert not (tmp_path / "big.bin").exists()


def _raw_token_file(path, fields, payload=b""):
    h = np.zeros(256, dtype="<i4")
    h[:len(fields)] = fields
    path.write_bytes(h.tobytes() + payload)
    return path


def test_token_file_errors(tmp_path):
    body = np.arange(10, dtype="<u2").tobytes()
    cases = [
        ("magic.bin", [20240522, 1, 10], body, r"magic\.bin: bad magic number 20240522 \(expected 20240520\)"),
        # another llm.c file in its place (-i gpt2_124M.bin) is named as what it is
        ("model.bin", [20240326, 3, 10], body, r"model\.bin: bad magic number 20240326 \(expected 20240520\): it is "
                                               r"an llm\.c model file, not an llm\.c token file"),
        ("version.bin", [20240520, 2, 10], body, r"version\.bin: unsupported llm.c token file version 2"),
        ("short.bin", None, b"\x00" * 10, r"short\.bin: truncated llm.c token file: the header needs 1024 bytes"),
        ("cut.bin", [20240520, 1, 10], body[:-4], r"cut\.bin: truncated llm.c token file: expected 1044 bytes .* has 1040 \(4 missing\)"),
        ("long.bin", [20240520, 1, 10], body + b"\x00\x00", r"long\.bin: size mismatch .* \(2 unexpected trailing bytes\)"),
        ("neg.bin", [20240520, 1, -3], b"", r"neg\.bin: negative token count -3"),
    ]
    for name, fields, payload, pattern in cases:
        path = tmp_path / name
        if fields is None:
            path.write_bytes(payload)
        else:
            _raw_token_file(path, fields, payload)
        with pytest.raises(FileFormatError, match=pattern):
            token_count(path)
        with pytest.raises(FileFormatError, match=pattern):
            DataLoader(str(path), 1, 2)


# -- MT19937


def test_mt19937_check_values():
    r = MT19937(137)
    assert [r.random_u32() for _ in range(5)] == [4053805790, 2173880614, 380293709, 1237255315, 2986595568]
    assert MT19937(5489).random_u32() == 3499211612


def test_mt19937_matches_numpy_legacy_generator():
    # NumPy's RandomState uses the same init_genrand seeding and raw MT19937 outputs.
    ref = np.random.RandomState(42)._bit_generator.random_raw(3000)
    r = MT19937(42)
    got = np.concatenate([[r.random_u32() for _ in range(5)], r.random_u32_array(2995)])
    assert np.array_equal(got, ref)


def test_mt19937_state_roundtrip():
    a = MT19937(7)
    a.random_u32_array(700)
    b = MT19937(0)
    b.load_state_dict(a.state_dict())
    assert np.array_equal(a.random_u32_array(1000), b.random_u32_array(1000))
    with pytest.raises(ValueError, match="not an MT19937 state"):
        b.load_state_dict({"kind": "mt19937", "mt": np.zeros(5), "index": 0})


def test_permutation_reference_order():
    idx = np.arange(74)
    random_permutation(idx, MT19937(42))
    assert idx[:10].tolist() == [29, 58, 10, 4, 11, 25, 63, 56, 72, 65]
    assert sorted(idx.tolist()) == list(range(74))
    one = np.array([5])
    r = MT19937(42)
    random_permutation(one, r)  # a single element draws nothing
    assert r.random_u32() == MT19937(42).random_u32()


# -- data loader


def _shard(path, n, start=0):
    write_tokens(path, (np.arange(n) + start) % 65536)
    return path


def test_sequential_loader_layout_and_wraparound(tmp_path):
    B, T = 2, 4
    path = _shard(tmp_path / "s.bin", 7 * B * T + 1 + 3)  # 7 full samples (+1 token each, 3 spare)
    dl = DataLoader(str(path), B, T)
    assert dl.num_tokens == 60 and dl.shard_num_samples == 7
    seen = []
    for k in range(8):
        x, y = dl.next_batch()
        assert x.dtype == np.int32 and x.shape == (B, T) and y.shape == (B, T)
        assert np.array_equal(y.reshape(-1), x.reshape(-1) + 1)  # targets: inputs shifted by one
        seen.append(int(x[0, 0]))
    assert seen == [0, 8, 16, 24, 32, 40, 48, 0]  # the 8th batch wraps to sample 0
    dl.next_batch()
    dl.reset()
    assert int(dl.next_batch()[0][0, 0]) == 0
    dl.close()


def test_val_split_at_trainer_sizes(tmp_path):
    path = _shard(tmp_path / "val.bin", 32768)
    with DataLoader(str(path), 4, 1024) as dl:
        assert dl.shard_num_samples == 7  # (32768 - 1) // 4096
        firsts = [int(dl.next_batch()[0][0, 0]) for _ in range(8)]
    assert firsts == [0, 4096, 8192, 12288, 16384, 20480, 24576, 0]


def test_shuffled_loader_reference_order(tmp_path):
    B, T = 1, 4
    path = _shard(tmp_path / "train.bin", 74 * B * T + 1)  # 74 samples, like Tiny Shakespeare at B=4, T=1024
    dl = DataLoader(str(path), B, T, shuffle=True)
    epoch1 = [int(dl.next_batch()[0][0, 0]) // (B * T) for _ in range(74)]
    assert epoch1[:10] == [29, 58, 10, 4, 11, 25, 63, 56, 72, 65]
    assert sorted(epoch1) == list(range(74))
    epoch2 = [int(dl.next_batch()[0][0, 0]) // (B * T) for _ in range(74)]
    assert sorted(epoch2) == list(range(74)) and epoch2 != epoch1
    # the second epoch continues the same MT19937 stream
    r = MT19937(42)
    p = np.arange(74)
    random_permutation(p, r)
    p = np.arange(74)
    random_permutation(p, r)
    assert epoch2 == p.tolist()


def test_shuffled_multishard_order(tmp_path):
    B, T = 1, 2
    sizes = [3 * B * T + 1, 5 * B * T + 1, 2 * B * T + 1]  # 3, 5 and 2 samples
    files = [_shard(tmp_path / f"shard_{i}.bin", n, start=1000 * i) for i, n in enumerate(sizes)]
    dl = DataLoader(str(tmp_path / "shard_*.bin"), B, T, shuffle=True)
    assert dl.files == [str(f) for f in files]
    got = []
    for _ in range(2 * sum(s // 2 for s in sizes)):  # two epochs
        x, _ = dl.next_batch()
        got.append((int(x[0, 0]) // 1000, (int(x[0, 0]) % 1000) // (B * T)))
    # Expected from the rule: at each reset permute the shard order (in place, continuing from
    # the previous order), then permute the samples of each shard when it is opened.
    r = MT19937(42)
    order = np.arange(3)
    want = []
    for _ in range(2):
        random_permutation(order, r)
        for shard in order.tolist():
            samples = np.arange(sizes[shard] // 2)
            random_permutation(samples, r)
            want += [(shard, int(s)) for s in samples]
    assert got == want
    assert sorted(got[:10]) == sorted((s, k) for s in range(3) for k in range(sizes[s] // 2))


def test_sequential_multishard_sorted_and_rank_offsets(tmp_path):
    B, T = 1, 2
    for i in (2, 0, 1):
        _shard(tmp_path / f"d_{i}.bin", 2 * 2 * B * T + 1, start=1000 * i)  # 2 samples at 2 processes
    r0 = DataLoader(str(tmp_path / "d_*.bin"), B, T, process_rank=0, num_processes=2)
    r1 = DataLoader(str(tmp_path / "d_*.bin"), B, T, process_rank=1, num_processes=2)
    a = [int(r0.next_batch()[0][0, 0]) for _ in range(7)]
    b = [int(r1.next_batch()[0][0, 0]) for _ in range(7)]
    assert a == [0, 4, 1000, 1004, 2000, 2004, 0]
    assert b == [2, 6, 1002, 1006, 2002, 2006, 2]
    with pytest.raises(ValueError, match="process_rank"):
        DataLoader(str(tmp_path / "d_*.bin"), B, T, process_rank=2, num_processes=2)


def test_loader_state_resume(tmp_path):
    B, T = 1, 3
    for i in range(3):
        _shard(tmp_path / f"r_{i}.bin", (4 + i) * B * T + 1, start=1000 * i)
    pattern = str(tmp_path / "r_*.bin")
    a = DataLoader(pattern, B, T, shuffle=True)
    for _ in range(6):
        a.next_batch()
    state = a.state_dict()
    expected = [a.next_batch()[0].copy() for _ in range(30)]  # crosses shards and an epoch
    b = DataLoader(pattern, B, T, shuffle=True)
    b.next_batch()
    b.load_state_dict(state)
    assert all(np.array_equal(b.next_batch()[0], e) for e in expected)
    c = DataLoader(pattern, B, T)
    c.next_batch()
    c.load_state_dict(c.state_dict())
    with pytest.raises(ValueError, match="T is 3 in the state, 2 here"):
        DataLoader(pattern, B, 2, shuffle=True).load_state_dict(state)
    with pytest.raises(ValueError, match="shuffle"):
        c.load_state_dict(state)
    with pytest.raises(ValueError, match="not a DataLoader state"):
        c.load_state_dict({})


def test_loader_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no token files match"):
        DataLoader(str(tmp_path / "nothing_*.bin"), 4, 64)
    small = _shard(tmp_path / "small.bin", 16)
    with pytest.raises(DataError, match=r"small\.bin: 16 tokens are too few for one batch: B\*T\+1 = 17"):
        DataLoader(str(small), 4, 4)
    _shard(tmp_path / "m_0.bin", 100)
    _raw_token_file(tmp_path / "m_1.bin", [20240520, 1, 100], b"\x00" * 20)
    with pytest.raises(FileFormatError, match=r"m_1\.bin: truncated"):
        DataLoader(str(tmp_path / "m_*.bin"), 2, 4)
    with pytest.raises(ValueError, match="positive"):
        DataLoader(str(small), 0, 4)
    # -i DIR said "DIR is a folder; give a file": the flag takes token files, by a glob
    with pytest.raises(DataError) as exc:
        DataLoader(str(tmp_path), 2, 4)
    assert str(exc.value) == (f"{tmp_path} is a folder, not a token file; give the token files in it with a "
                              f"glob such as '{tmp_path / '*.bin'}'")


def test_loader_detects_files_changing_underneath(tmp_path):
    B, T = 1, 4
    a = _shard(tmp_path / "c_0.bin", 3 * B * T + 1)
    _shard(tmp_path / "c_1.bin", 3 * B * T + 1)
    dl = DataLoader(str(tmp_path / "c_*.bin"), B, T)
    _shard(tmp_path / "c_1.bin", 5 * B * T + 1)  # rewritten after validation
    for _ in range(3):
        dl.next_batch()
    with pytest.raises(DataError, match=r"c_1\.bin: changed since the loader was created"):
        dl.next_batch()
    dl2 = DataLoader(str(a), B, T)
    with open(a, "r+b") as f:  # truncated while open
        f.truncate(1024 + 2 * 6)
    dl2.next_batch()  # the first sample (tokens 0..4) is still there
    with pytest.raises(DataError, match=r"c_0\.bin: truncated while reading a batch"):
        dl2.next_batch()


def test_load_state_dict_rejects_tampered_states(tmp_path):
    B, T = 1, 2
    for i in range(2):
        _shard(tmp_path / f"t_{i}.bin", 4 * B * T + 1)
    dl = DataLoader(str(tmp_path / "t_*.bin"), B, T, shuffle=True)
    good = dl.state_dict()
    cases = [
        ({"current_shard_idx": 2}, "shard index 2 outside 0..1"),
        ({"shard_indices": np.array([0, 0])}, "not a permutation"),
        ({"current_sample_idx": 5}, "sample index 5 outside 0..4"),
        ({"intra_shard_indices": np.arange(3)}, "intra_shard_indices has the wrong length"),
        ({"shard_tokens": [9, 10]}, "shard_tokens is"),
        ({"rng": {"kind": "xorshift64*", "state": 1}}, "not an MT19937 state"),
    ]
    for change, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            DataLoader(str(tmp_path / "t_*.bin"), B, T, shuffle=True).load_state_dict({**good, **change})


def test_checking_many_token_files_shows_a_progress_bar(tmp_path, monkeypatch):
    # every id of every shard is read before training (seconds per billion tokens) with nothing shown
    import tqdm

    seen = []

    class Bar:
        def __init__(self, iterable, **kwargs):
            seen.append((len(iterable), kwargs.get("desc"), kwargs.get("disable")))
            self.iterable = iterable

        def __iter__(self):
            return iter(self.iterable)

    monkeypatch.setattr(tqdm, "tqdm", Bar)
    for i in range(3):
        write_tokens(tmp_path / f"shard_{i}.bin", np.arange(40) % 50257)
    DataLoader(str(tmp_path / "shard_*.bin"), 2, 4, vocab_size=50257)
    assert seen == [(3, "checking token files", None)]
    DataLoader(str(tmp_path / "shard_0.bin"), 2, 4, vocab_size=50257)   # one file: no bar
    assert len(seen) == 1
