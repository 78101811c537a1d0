"""GPT-2 encoding (tiktoken) and llm.c's tokenizer file."""

import io
import os
from pathlib import Path

import numpy as np
import pytest
import tiktoken

from llmcupy import tokenizer as tk
from llmcupy.fileio import FileFormatError

import gen_inputs

SHARED_DATA = Path(os.environ.get("LLMCUPY_TEST_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")
BPE = SHARED_DATA / "gpt2.tiktoken"
_REAL = (f"optional check of GPT-2's real ids: set LLMCUPY_TEST_DATA to a folder holding gpt2.tiktoken "
         f"(not found at {BPE}); the generated-BPE tests cover the same code paths")
needs_bpe = pytest.mark.skipif(not BPE.is_file(), reason=_REAL)


@pytest.fixture(scope="module")
def enc():
    if not BPE.is_file():
        pytest.skip(_REAL)
    return tk.get_encoding(BPE)


@pytest.fixture(scope="module")
def tiny_bpe(tmp_path_factory):
    """A GPT-2-shaped BPE rank file made here (gen_inputs)."""
    return gen_inputs.write_tiny_bpe(tmp_path_factory.mktemp("bpe") / "tiny.tiktoken")


def test_generated_bpe_from_file_env_and_explicit_path(tiny_bpe, monkeypatch, tmp_path):
    e = tk.get_encoding(tiny_bpe)
    assert e.n_vocab == 50257 and e.eot_token == 50256
    text = "ROMEO:\nThe king is good, my lord!"
    ids = e.encode(text)
    assert e.decode(ids) == text and len(ids) < len(text.encode())   # merges happened
    monkeypatch.setenv(tk.BPE_ENV, str(tiny_bpe))
    assert tk.get_encoding().encode(text) == ids
    monkeypatch.setenv(tk.BPE_ENV, str(tmp_path / "missing.tiktoken"))
    assert tk.get_encoding(tiny_bpe).encode(text) == ids           # an explicit path beats the variable
    with pytest.raises(tk.TokenizerError, match="missing.tiktoken"):
        tk.get_encoding()


def test_cli_writes_a_tokenizer_file_from_a_generated_bpe(tiny_bpe, tmp_path, capsys):
    out = tmp_path / "gpt2_tokenizer.bin"
    assert tk.main(["--bpe", str(tiny_bpe), "-o", str(out)]) == 0
    assert "50257 tokens, EOT 50256" in capsys.readouterr().out
    t, e = tk.Tokenizer.load(out), tk.get_encoding(tiny_bpe)
    text = "First Citizen:\nWhat say you? \u00e9"
    assert t.decode(e.encode(text)) == text and t.decode_token(50256) == b"<|endoftext|>"


def test_cli_writes_the_bpe_rank_file_an_offline_machine_needs(tiny_bpe, tmp_path, capsys, monkeypatch):
    # offline, every CLI said "pass --bpe FILE (a gpt2.tiktoken rank file)", but nothing said where one
    # comes from: tiktoken builds GPT-2's encoding from vocab.bpe and encoder.json, not from such a file
    out, ranks = tmp_path / "gpt2_tokenizer.bin", tmp_path / "copy" / "gpt2.tiktoken"
    assert tk.main(["--bpe", str(tiny_bpe), "-o", str(out), "--bpe-out", str(ranks)]) == 0
    assert f"wrote {ranks}: GPT-2's 50256 BPE ranks" in capsys.readouterr().out
    assert ranks.read_bytes() == Path(tiny_bpe).read_bytes()   # the generated file is in the same format
    assert out.is_file()
    for argv, message in ((["--bpe", tiny_bpe, "--bpe-out", tiny_bpe], f"--bpe-out {tiny_bpe}: it is the BPE file "
                                                                       "this reads"),
                          (["--bpe", tiny_bpe, "--bpe-out", out, "-o", out], f"--bpe-out {out}: -o names it too"),
                          (["--bpe", tiny_bpe, "--bpe-out", tmp_path], f"--bpe-out {tmp_path}: it is a folder")):
        assert tk.main([str(a) for a in argv]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    monkeypatch.delenv(tk.BPE_ENV, raising=False)
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: (_ for _ in ()).throw(ConnectionError("offline")))
    with pytest.raises(tk.TokenizerError, match="python -m llmcupy.tokenizer --bpe-out gpt2.tiktoken writes one"):
        tk.get_encoding()


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv(tk.BPE_ENV, raising=False)


# -- encoding


@needs_bpe
def test_hello_world_from_file(enc):
    assert enc.encode("Hello world") == [15496, 995]
    assert enc.n_vocab == 50257 and enc.eot_token == 50256
    assert enc.encode("<|endoftext|>", allowed_special="all") == [50256]
    assert enc.decode([15496, 995]) == "Hello world"


@needs_bpe
def test_env_var_used_when_no_path(monkeypatch):
    monkeypatch.setenv(tk.BPE_ENV, str(BPE))
    assert tk.get_encoding().encode("Hello world") == [15496, 995]


@needs_bpe
def test_explicit_path_beats_env(monkeypatch, tmp_path):
    monkeypatch.setenv(tk.BPE_ENV, str(tmp_path / "missing.tiktoken"))
    assert tk.get_encoding(str(BPE)).encode("Hello world") == [15496, 995]
    with pytest.raises(tk.TokenizerError, match="missing.tiktoken"):
        tk.get_encoding()


def test_falls_back_to_tiktoken(monkeypatch, no_env):
    sentinel = object()
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: sentinel if name == "gpt2" else None)
    assert tk.get_encoding() is sentinel


def test_fallback_failure_says_what_to_do(monkeypatch, no_env):
    def offline(name):
        raise ConnectionError("Name or service not known")

    monkeypatch.setattr(tiktoken, "get_encoding", offline)
    with pytest.raises(tk.TokenizerError) as e:
        tk.get_encoding()
    msg = str(e.value)
    assert "--bpe FILE" in msg and "LLMCUPY_GPT2_BPE" in msg and "Name or service not known" in msg


def test_bad_bpe_files(tmp_path):
    with pytest.raises(tk.TokenizerError, match="cannot read"):
        tk.get_encoding(tmp_path / "nope.tiktoken")
    garbage = tmp_path / "garbage.tiktoken"
    garbage.write_bytes(b"IQ== 0\nthis is not base64 at all\n")
    with pytest.raises(tk.TokenizerError, match=r"garbage.tiktoken:2: not a tiktoken BPE file"):
        tk.get_encoding(garbage)
    empty = tmp_path / "empty.tiktoken"
    empty.write_bytes(b"\n")
    with pytest.raises(tk.TokenizerError, match="empty BPE file"):
        tk.get_encoding(empty)
    small = tmp_path / "small.tiktoken"
    small.write_bytes(b"".join(b"%s %d\n" % (__import__("base64").b64encode(bytes([i])), i) for i in range(256)))
    with pytest.raises(tk.TokenizerError, match="has 256 BPE ranks"):
        tk.get_encoding(small)
    # llm.c's gpt2_tokenizer.bin given as --bpe printed 60 bytes of its binary header
    table = tmp_path / "gpt2_tokenizer.bin"
    _tiny_table().save(table)
    with pytest.raises(tk.TokenizerError) as exc:
        tk.get_encoding(table)
    assert str(exc.value) == (f"{table}: it is an llm.c tokenizer file, not a tiktoken BPE rank file (gpt2.tiktoken); "
                              "give it with --tokenizer, and the rank file with --bpe")


# -- llm.c tokenizer file


def _tiny_table():
    return tk.Tokenizer([b"a", b"bc", b"\xff" * 255, b"\n", b"<|eot|>"], eot_id=4)


def test_tokenizer_file_roundtrip(tmp_path):
    t = _tiny_table()
    path = tmp_path / "tok.bin"
    t.save(path)
    raw = path.read_bytes()
    header = np.frombuffer(raw[:1024], dtype="<u4")
    assert list(header[:4]) == [20240328, 2, 5, 4] and not header[4:].any()
    assert len(raw) == 1024 + sum(1 + len(x) for x in t.tokens)
    back = tk.Tokenizer.load(path)
    assert back.tokens == t.tokens and back.eot_id == 4
    assert back.decode_bytes([1, 0, 3]) == b"bca\n"


@needs_bpe
def test_gpt2_tokenizer_file(enc, tmp_path):
    path = tmp_path / "gpt2_tokenizer.bin"
    tk.write_tokenizer(path, enc)
    t = tk.Tokenizer.load(path)
    assert len(t) == 50257 and t.eot_id == 50256
    assert t.decode_token(15496) == b"Hello" and t.decode_token(995) == b" world"
    assert t.decode_token(50256) == b"<|endoftext|>"
    text = "First Citizen:\nBefore we proceed any further, hear me speak. \u00e9\u4e16"
    assert t.decode(enc.encode(text)) == text
    assert os.path.getsize(path) == 1024 + sum(1 + len(x) for x in t.tokens)


@needs_bpe
def test_cli_writes_gpt2_tokenizer_bin(tmp_path, capsys):
    out = tmp_path / "gpt2_tokenizer.bin"
    assert tk.main(["--bpe", str(BPE), "-o", str(out)]) == 0
    assert "50257 tokens, EOT 50256" in capsys.readouterr().out
    assert tk.Tokenizer.load(out).decode_token(995) == b" world"


def test_cli_error(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(tk.BPE_ENV, raising=False)
    assert tk.main(["--bpe", str(tmp_path / "none"), "-o", str(tmp_path / "t.bin")]) == 2
    assert "cannot read GPT-2 BPE file" in capsys.readouterr().err
    assert not (tmp_path / "t.bin").exists()



def test_cli_refuses_an_output_it_cannot_write_or_that_is_its_bpe_file(tiny_bpe, tmp_path, capsys, monkeypatch):
    # -o on the BPE file replaced it by the tokenizer file; a folder was named as a hidden temporary
    bpe = tmp_path / "gpt2.tiktoken"
    bpe.write_bytes(Path(tiny_bpe).read_bytes())
    monkeypatch.setenv(tk.BPE_ENV, str(bpe))
    for argv, message in ((["--bpe", bpe, "-o", bpe], f"-o {bpe}: it is the BPE file this reads"),
                          (["-o", bpe], f"-o {bpe}: it is the BPE file this reads"),     # through the variable
                          (["-o", tmp_path], f"-o {tmp_path}: it is a folder"),
                          (["-o", bpe / "t.bin"], f"-o {bpe / 't.bin'}: {bpe} is not a folder")):
        assert tk.main([str(a) for a in argv]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
    assert bpe.read_bytes() == Path(tiny_bpe).read_bytes()


def _write(path, header_fields, body=b""):
    h = np.zeros(256, dtype="<u4")
    h[:len(header_fields)] = header_fields
    path.write_bytes(h.tobytes() + body)
    return path


def test_tokenizer_file_errors(tmp_path):
    body = b"\x01a\x02bc\x01z"
    with pytest.raises(FileFormatError, match=r"bad\.bin: bad magic number 1234 \(expected 20240328\)"):
        tk.Tokenizer.load(_write(tmp_path / "bad.bin", [1234, 2, 3, 0], body))
    with pytest.raises(FileFormatError, match=r"unsupported llm.c tokenizer file version 3"):
        tk.Tokenizer.load(_write(tmp_path / "v3.bin", [20240328, 3, 3, 0], body))
    (tmp_path / "short.bin").write_bytes(b"\x00" * 100)
    with pytest.raises(FileFormatError, match=r"short\.bin: truncated .* header needs 1024 bytes, the file has only 100"):
        tk.Tokenizer.load(tmp_path / "short.bin")
    with pytest.raises(FileFormatError, match=r"cut\.bin: truncated tokenizer file: token 2 of 3 needs 1 bytes, only 0 left"):
        tk.Tokenizer.load(_write(tmp_path / "cut.bin", [20240328, 2, 3, 0], body[:-1]))
    with pytest.raises(FileFormatError, match=r"cut2\.bin: truncated tokenizer file: ends after 2 of 4 tokens"):
        tk.Tokenizer.load(_write(tmp_path / "cut2.bin", [20240328, 2, 4, 0], body[:5]))
    with pytest.raises(FileFormatError, match=r"zero\.bin: token 1 has length 0"):
        tk.Tokenizer.load(_write(tmp_path / "zero.bin", [20240328, 2, 3, 0], b"\x01a\x00\x01z"))
    with pytest.raises(FileFormatError, match=r"trail\.bin: size mismatch: 2 unexpected trailing bytes"):
        tk.Tokenizer.load(_write(tmp_path / "trail.bin", [20240328, 2, 3, 0], body + b"xx"))
    with pytest.raises(FileFormatError, match=r"eot\.bin: EOT id 7 is outside the 3 tokens"):
        tk.Tokenizer.load(_write(tmp_path / "eot.bin", [20240328, 2, 3, 7], body))
    with pytest.raises(FileFormatError, match=r"v1\.bin: version-1 tokenizer file must hold 50257 tokens"):
        tk.Tokenizer.load(_write(tmp_path / "v1.bin", [20240328, 1, 3], body))
    with pytest.raises(FileFormatError, match="holds no tokens"):
        tk.Tokenizer.load(_write(tmp_path / "none.bin", [20240328, 2, 0, 0]))


def test_version1_assumes_eot_50256(tmp_path):
    path = _write(tmp_path / "v1.bin", [20240328, 1, 50257, 99], b"\x01x" * 50257)
    t = tk.Tokenizer.load(path)
    assert t.eot_id == 50256 and len(t) == 50257


def test_save_refuses_unstorable_tokens(tmp_path):
    with pytest.raises(ValueError, match="token 1 is 0 bytes"):
        tk.Tokenizer([b"a", b""], 0).save(tmp_path / "x.bin")
    with pytest.raises(ValueError, match="token 0 is 256 bytes"):
        tk.Tokenizer([b"a" * 256], 0).save(tmp_path / "x.bin")
    assert not list(tmp_path.iterdir())


def test_decode_invalid_id():
    with pytest.raises(ValueError, match="invalid token id 5"):
        _tiny_table().decode_token(5)


# -- sampling output


def test_printable_piece_rules():
    assert tk.printable_piece(b"") == b""
    assert tk.printable_piece(b"\x07") == b""       # single control byte: skipped
    assert tk.printable_piece(b"\xe2") == b""       # single non-ASCII byte: skipped
    for ok in (b"A", b" ", b"\n", b"\t", b"~"):
        assert tk.printable_piece(ok) == ok
    assert tk.printable_piece(b"\xe2\x80") == b"\xe2\x80"  # multi-byte pieces pass unchanged


def test_sample_piece_and_stream():
    t = _tiny_table()
    assert tk.sample_piece(1, t) == b"bc"
    assert tk.sample_piece(42, None) == b"42 "
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding="utf-8")
    for i in (0, 1, 3):
        tk.write_sample_piece(i, t, stream)
    tk.write_sample_piece(7, None, stream)
    assert raw.getvalue() == b"abc\n7 "
    plain = io.StringIO()
    tk.write_sample_piece(1, t, plain)
    assert plain.getvalue() == "bc"
