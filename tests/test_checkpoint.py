"""Model files, debug-state files, training-state checkpoints and atomic writes."""

import os

import numpy as np
import pytest

from llmcupy import checkpoint as ck
from llmcupy.checkpoint import CheckpointError, DebugState, GPT2Config, TrainingState
from llmcupy.fileio import FileFormatError, atomic_write

GPT2_124M = GPT2Config()
TINY = GPT2Config(max_seq_len=16, vocab_size=100, num_layers=2, num_heads=2, channels=8)  # Vp = 128


def _params(config, seed=0):
    return np.random.default_rng(seed).normal(size=ck.num_parameters(config)).astype(np.float32)


# -- layout


def test_gpt2_124m_layout():
    shapes = ck.param_shapes(GPT2_124M)
    assert list(shapes) == list(ck.PARAM_NAMES)
    counts = dict(zip(shapes, ck.param_sizes(GPT2_124M)))
    assert counts == {"wte": 38633472, "wpe": 786432, "ln1w": 9216, "ln1b": 9216, "qkvw": 21233664,
                      "qkvb": 27648, "attprojw": 7077888, "attprojb": 9216, "ln2w": 9216, "ln2b": 9216,
                      "fcw": 28311552, "fcb": 36864, "fcprojw": 28311552, "fcprojb": 9216, "lnfw": 768, "lnfb": 768}
    P = ck.num_parameters(GPT2_124M)
    assert P == 124475904
    assert P - (50304 - 50257) * 768 == 124439808
    assert 1024 + 4 * P == 497904640  # the 124M model file
    assert ck.debug_state_size(GPT2_124M, 4, 64) == 549369860  # the starter pack's debug state
    assert GPT2_124M.padded_vocab_size == 50304


def test_config_validation():
    assert TINY.padded_vocab_size == 128
    with pytest.raises(ValueError, match="must be divisible by num_heads"):
        GPT2Config(channels=12, num_heads=5)
    with pytest.raises(ValueError, match="< vocab_size"):
        GPT2Config(vocab_size=200, padded_vocab_size=128)
    with pytest.raises(ValueError, match="num_layers must be a positive integer"):
        GPT2Config(num_layers=0)


def test_split_and_join():
    flat = _params(TINY)
    p = ck.split_params(flat, TINY)
    assert p["qkvw"].shape == (2, 24, 8) and p["fcprojw"].shape == (2, 8, 32)
    assert np.shares_memory(p["wte"], flat)
    p["lnfb"][:] = 7  # views write through
    assert flat[-1] == 7
    assert np.array_equal(ck.join_params(TINY, p), flat)
    with pytest.raises(ValueError, match="parameter wpe has shape"):
        ck.join_params(TINY, {**p, "wpe": np.zeros((3, 8))})
    with pytest.raises(ValueError, match="missing"):
        ck.join_params(TINY, {k: v for k, v in p.items() if k != "lnfw"})
    # llmcupy.config.split_params: a buffer of the wrong size (a bare ValueError also passed on
    # NumPy's "cannot reshape" once the size check was gone)
    with pytest.raises(ValueError, match=r"parameter buffer has \d+ floats, the config needs \d+"):
        ck.split_params(flat[:-1], TINY)


# -- model file


def test_model_roundtrip_fp32(tmp_path):
    flat = _params(TINY)
    path = tmp_path / "m.bin"
    ck.write_model(path, TINY, flat)
    raw = path.read_bytes()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    assert list(header[:8]) == [20240326, 3, 16, 100, 2, 2, 8, 128] and not header[8:].any()
    assert len(raw) == 1024 + 4 * flat.size
    assert np.array_equal(np.frombuffer(raw[1024:], dtype="<f4"), flat)
    config, params = ck.read_model(path)
    assert config == TINY and params.dtype == np.float32 and np.array_equal(params, flat)
    assert ck.read_model_header(path) == (TINY, 3)
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # not mkstemp's 0600


def _umask():
    m = os.umask(0o022)
    os.umask(m)
    return m


def test_model_bf16_is_widened_with_a_warning(tmp_path):
    flat = _params(TINY)
    path = tmp_path / "m16.bin"
    ck.write_model(path, TINY, flat, dtype="bf16")
    assert path.stat().st_size == 1024 + 2 * flat.size
    assert ck.read_model_header(path) == (TINY, 5)
    with pytest.warns(UserWarning, match="bf16 parameters; converted to fp32"):
        config, params = ck.read_model(path)
    assert config == TINY and params.dtype == np.float32
    want = ck.bf16_to_fp32(ck.fp32_to_bf16(flat))
    assert np.array_equal(params, want)
    assert np.max(np.abs(params - flat) / np.maximum(np.abs(flat), 1e-30)) <= 2.0 ** -8


def test_bf16_rounding():
    x = np.array([1.0, 1 + 2 ** -8, 1 + 3 * 2 ** -8, -2.5, 0.0, np.inf, np.nan], dtype=np.float32)
    b = ck.fp32_to_bf16(x)
    assert b[:6].tolist() == [0x3F80, 0x3F80, 0x3F82, 0xC020, 0x0000, 0x7F80]  # ties to even
    back = ck.bf16_to_fp32(b)
    assert np.isnan(back[6]) and back[:6].tolist() == [1.0, 1.0, 1 + 2 ** -6, -2.5, 0.0, np.inf]


def _raw_model(path, fields, payload_floats):
    h = np.zeros(256, dtype="<i4")
    h[:len(fields)] = fields
    path.write_bytes(h.tobytes() + np.zeros(payload_floats, dtype="<f4").tobytes())
    return path


def test_model_file_errors(tmp_path):
    P = ck.num_parameters(TINY)
    good = [20240326, 3, 16, 100, 2, 2, 8, 128]
    cases = [
        ("magic.bin", [1, 3, 16, 100, 2, 2, 8, 128], P, r"magic\.bin: bad magic number 1 \(expected 20240326\).*llmcupy\.convert"),
        ("version.bin", [20240326, 4, 16, 100, 2, 2, 8, 128], P, r"version\.bin: unsupported llm.c model file version 4 \(supported: 3 or 5\)"),
        ("cut.bin", good, P - 1, rf"cut\.bin: truncated llm.c model file: expected {1024 + 4 * P} bytes .*\(4 missing\)"),
        ("long.bin", good, P + 2, r"long\.bin: size mismatch in llm.c model file: .*\(8 unexpected trailing bytes\)"),
        ("heads.bin", [20240326, 3, 16, 100, 2, 3, 8, 128], P, r"heads\.bin: bad model header: .*channels 8 must be divisible by num_heads 3"),
        ("vp.bin", [20240326, 3, 16, 100, 2, 2, 8, 64], P, r"vp\.bin: bad model header: .*padded_vocab_size 64 < vocab_size 100"),
        ("zero.bin", [20240326, 3, 16, 100, 0, 2, 8, 128], P, r"zero\.bin: bad model header: .*num_layers"),
        # a flipped high bit of C: the byte count wrapped in int64 ("expected -18446... bytes")
        ("huge.bin", [20240326, 3, 16, 100, 2, 2, 1 << 30, 128], P,
         r"huge\.bin: truncated llm.c model file: expected [1-9][0-9]{17,} bytes .* missing\)"),
    ]
    for name, fields, floats, pattern in cases:
        path = _raw_model(tmp_path / name, fields, floats)
        with pytest.raises(CheckpointError if "header" in pattern else FileFormatError, match=pattern):
            ck.read_model(path)
    (tmp_path / "short.bin").write_bytes(b"\x00" * 1000)
    with pytest.raises(FileFormatError, match=r"short\.bin: truncated llm.c model file: the header needs 1024 bytes"):
        ck.read_model(tmp_path / "short.bin")
    # a bf16 file must be exactly 2 bytes per parameter
    bf = _raw_model(tmp_path / "bf.bin", [20240326, 5, 16, 100, 2, 2, 8, 128], P)  # 4 bytes each: too long
    with pytest.raises(FileFormatError, match=r"bf\.bin: size mismatch .*bf16 parameters"):
        ck.read_model(bf)


def test_write_model_checks(tmp_path):
    with pytest.raises(ValueError, match="flat buffer"):
        ck.write_model(tmp_path / "x.bin", TINY, np.zeros(5, np.float32))
    with pytest.raises(ValueError, match="dtype"):
        ck.write_model(tmp_path / "x.bin", TINY, _params(TINY), dtype="fp16")
    assert not list(tmp_path.iterdir())


# -- atomic writes


def test_interrupted_model_save_keeps_old_file(tmp_path, monkeypatch):
    path = tmp_path / "gpt2.bin"
    old = _params(TINY, seed=1)
    ck.write_model(path, TINY, old)
    before = path.read_bytes()

    real = ck.write_array

    def interrupted(f, array, dtype):
        real(f, np.asarray(array)[: array.size // 2], dtype)  # half written, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(ck, "write_array", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ck.write_model(path, TINY, _params(TINY, seed=2))
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["gpt2.bin"]  # no temp file left


def test_atomic_write_error_and_success(tmp_path):
    path = tmp_path / "sub" / "f.bin"  # parent created
    with atomic_write(path) as f:
        f.write(b"one")
    assert path.read_bytes() == b"one"
    with pytest.raises(RuntimeError):
        with atomic_write(path) as f:
            f.write(b"two")
            raise RuntimeError("disk full")
    assert path.read_bytes() == b"one"
    assert [p.name for p in path.parent.iterdir()] == ["f.bin"]



def test_a_full_disk_names_the_file_being_saved_and_keeps_the_old_one(tmp_path, monkeypatch):
    # a write error names no file: convert -o, tokenizer -o, data --out and the trainer's checkpoints
    # printed only "error: No space left on device"
    import errno

    from llmcupy._cli import message

    path = tmp_path / "gpt2.bin"
    ck.write_model(path, TINY, _params(TINY, seed=1))
    before = path.read_bytes()

    def full(f, array, dtype):
        f.write(b"x" * 100)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ck, "write_array", full)
    with pytest.raises(OSError) as exc:
        ck.write_model(path, TINY, _params(TINY, seed=2))
    assert exc.value.errno == errno.ENOSPC
    assert message(exc.value) == f"{path}: {os.strerror(errno.ENOSPC)}"
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["gpt2.bin"]   # no temporary left behind


def test_atomic_write_never_replaces_a_folder_or_a_special_file(tmp_path):
    # a folder failed naming the hidden temporary (".dir.xxxx.tmp is a folder"); a FIFO or device
    # (--save-path /dev/null as root) was replaced by a regular file
    import os
    import stat

    from llmcupy._cli import message

    folder = tmp_path / "dir"
    folder.mkdir()
    with pytest.raises(IsADirectoryError) as exc:
        with atomic_write(folder) as f:
            f.write(b"x")
    assert message(exc.value) == f"{folder} is a folder; give a file"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="exists and is not a regular file") as exc:
        with atomic_write(fifo) as f:
            f.write(b"x")
    assert message(exc.value).startswith(f"{fifo}: exists and is not a regular file")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "fifo"]   # no temporary left behind


# -- debug state


def _debug_state(config, B=2, T=3, seed=0):
    g = np.random.default_rng(seed)
    return DebugState(x=g.integers(0, config.vocab_size, (B, T)).astype(np.int32),
                      y=g.integers(0, config.vocab_size, (B, T)).astype(np.int32),
                      logits=g.normal(size=(B, T, config.vocab_size)).astype(np.float32),
                      loss=4.25, grads=_params(config, seed + 1))


def test_debug_state_roundtrip(tmp_path):
    s = _debug_state(TINY)
    path = tmp_path / "dbg.bin"
    ck.write_debug_state(path, s.x, s.y, s.logits, s.loss, s.grads)
    raw = path.read_bytes()
    assert list(np.frombuffer(raw[:16], dtype="<i4")) == [20240327, 2, 2, 3]
    assert len(raw) == ck.debug_state_size(TINY, 2, 3)
    body = np.frombuffer(raw[1024:], dtype="<i4")
    assert np.array_equal(body[:6], s.x.reshape(-1)) and np.array_equal(body[6:12], s.y.reshape(-1))
    r = ck.read_debug_state(path, TINY)
    assert (r.B, r.T) == (2, 3)
    assert np.array_equal(r.x, s.x) and np.array_equal(r.y, s.y)
    assert np.array_equal(r.logits, s.logits) and r.loss == 4.25 and np.array_equal(r.grads, s.grads)


def test_debug_state_errors(tmp_path):
    s = _debug_state(TINY)
    good = tmp_path / "good.bin"
    ck.write_debug_state(good, s.x, s.y, s.logits, s.loss, s.grads)
    raw = bytearray(good.read_bytes())

    def variant(name, header=None, cut=0, extra=b""):
        data = bytearray(raw)
        if header:
            for i, v in header.items():
                data[4 * i:4 * i + 4] = np.array([v], "<i4").tobytes()
        data = bytes(data[:len(data) - cut]) + extra
        p = tmp_path / name
        p.write_bytes(data)
        return p

    with pytest.raises(FileFormatError, match=r"magic\.bin: bad magic number 20240326 \(expected 20240327\): it is an "
                                              r"llm\.c model file, not an llm\.c debug-state file"):
        ck.read_debug_state(variant("magic.bin", {0: 20240326}), TINY)
    with pytest.raises(FileFormatError, match=r"version\.bin: unsupported llm.c debug-state file version 1"):
        ck.read_debug_state(variant("version.bin", {1: 1}), TINY)
    with pytest.raises(FileFormatError, match=r"cut\.bin: truncated llm.c debug-state file: .*B=2, T=3, V=100"):
        ck.read_debug_state(variant("cut.bin", cut=4), TINY)
    with pytest.raises(FileFormatError, match=r"long\.bin: size mismatch .*\(4 unexpected trailing bytes\)"):
        ck.read_debug_state(variant("long.bin", extra=b"\x00" * 4), TINY)
    with pytest.raises(CheckpointError, match=r"bigT\.bin: debug state has T=17, more than the model's max_seq_len 16"):
        ck.read_debug_state(variant("bigT.bin", {3: 17}), TINY)
    with pytest.raises(CheckpointError, match=r"zeroB\.bin: bad debug-state header: B=0"):
        ck.read_debug_state(variant("zeroB.bin", {2: 0}), TINY)
    other = GPT2Config(max_seq_len=16, vocab_size=90, num_layers=2, num_heads=2, channels=8)
    # written for another vocabulary (or model): it said only "truncated" or "size mismatch"
    with pytest.raises(FileFormatError, match=r"good\.bin: size mismatch .*; or it was written for another model "
                                              r"than the one given"):
        ck.read_debug_state(good, other)
    bigger = GPT2Config(max_seq_len=16, vocab_size=100, num_layers=3, num_heads=2, channels=8)
    with pytest.raises(FileFormatError, match=r"good\.bin: truncated .*; or it was written for another model"):
        ck.read_debug_state(good, bigger)
    (tmp_path / "tiny.bin").write_bytes(b"\x01\x02")
    with pytest.raises(FileFormatError, match=r"tiny\.bin: truncated .*header needs 1024 bytes"):
        ck.read_debug_state(tmp_path / "tiny.bin", TINY)


def test_write_debug_state_checks(tmp_path):
    s = _debug_state(TINY)
    path = tmp_path / "d.bin"
    with pytest.raises(ValueError, match="unpadded V"):
        ck.write_debug_state(path, s.x, s.y, s.logits[0], s.loss, s.grads)
    with pytest.raises(ValueError, match="grads must be a flat buffer"):
        ck.write_debug_state(path, s.x, s.y, s.logits, s.loss, s.grads.reshape(2, -1))
    with pytest.raises(ValueError, match="x and y must both be"):
        ck.write_debug_state(path, s.x, s.y[:, :-1], s.logits, s.loss, s.grads)
    assert not list(tmp_path.iterdir())
    # a file written with the wrong vocabulary or parameter count fails its exact-size check on read
    ck.write_debug_state(path, s.x, s.y, s.logits[..., :-1], s.loss, s.grads)
    with pytest.raises(FileFormatError, match=r"d\.bin: truncated llm.c debug-state file"):
        ck.read_debug_state(path, TINY)


# -- training state


def _training_state(tmp_path):
    from llmcupy.data import DataLoader, write_tokens
    from llmcupy.sampling import XorShiftRNG

    write_tokens(tmp_path / "train.bin", np.arange(200) % 100)
    dl = DataLoader(str(tmp_path / "train.bin"), 2, 4, shuffle=True)
    for _ in range(3):
        dl.next_batch()
    rng = XorShiftRNG()
    rng.random_u32()
    state = TrainingState(config=TINY, params=_params(TINY, 1), step=42, m=_params(TINY, 2), v=_params(TINY, 3) ** 2,
                          loaders={"train": dl.state_dict()}, rng=rng.state_dict(),
                          extra={"lr": 3e-4, "history": [1.5, 2.5], "note": "hi", "arr": np.arange(3)})
    return state, dl, rng


def test_training_state_roundtrip(tmp_path):
    from llmcupy.data import DataLoader
    from llmcupy.sampling import XorShiftRNG

    state, dl, rng = _training_state(tmp_path)
    path = tmp_path / "run.npz"
    ck.save_training_state(path, state)
    with np.load(path) as z:  # a plain .npz archive
        assert {"meta", "params", "adam_m", "adam_v"} <= set(z.files)
    r = ck.load_training_state(path)
    assert r.config == TINY and r.step == 42
    for a, b in ((r.params, state.params), (r.m, state.m), (r.v, state.v)):
        assert a.dtype == np.float32 and np.array_equal(a, b)
    assert r.extra["lr"] == 3e-4 and r.extra["history"] == [1.5, 2.5] and r.extra["note"] == "hi"
    assert np.array_equal(r.extra["arr"], np.arange(3))
    # the loader and the sampling RNG resume exactly where they were
    dl2 = DataLoader(str(tmp_path / "train.bin"), 2, 4, shuffle=True)
    dl2.load_state_dict(r.loaders["train"])
    rng2 = XorShiftRNG(0)
    rng2.load_state_dict(r.rng)
    for _ in range(40):
        assert np.array_equal(dl.next_batch()[0], dl2.next_batch()[0])
    assert rng.random_u32() == rng2.random_u32()
    # m and v are optional (before the first update)
    ck.save_training_state(path, TrainingState(config=TINY, params=state.params, step=0))
    r = ck.load_training_state(path)
    assert r.m is None and r.v is None and r.loaders == {} and r.rng is None


def _check_step_and_moments(tmp_path, path):
    """A state past step 0 needs both AdamW moments, and its step must be a count: resuming
    without them restarted AdamW from zero silently or failed inside the update."""
    import json

    def rewrite(name, drop=(), **meta_changes):
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files if k not in drop}
        meta = json.loads(arrays["meta"].tobytes())
        meta.update(meta_changes)
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
        np.savez(tmp_path / name, **arrays)
        return tmp_path / name

    with pytest.raises(CheckpointError, match=r"nom\.npz: corrupt .* has adam_v but no adam_m"):
        ck.load_training_state(rewrite("nom.npz", drop=("adam_m",)))
    with pytest.raises(CheckpointError, match=r"nov\.npz: corrupt .* has adam_m but no adam_v"):
        ck.load_training_state(rewrite("nov.npz", drop=("adam_v",)))
    with pytest.raises(CheckpointError, match=r"none\.npz: corrupt .* at step 42 but has no AdamW moments"):
        ck.load_training_state(rewrite("none.npz", drop=("adam_m", "adam_v")))
    assert ck.load_training_state(rewrite("fresh.npz", drop=("adam_m", "adam_v"), step=0)).m is None
    for bad in (-1, 2.5, "3", True, None):
        with pytest.raises(CheckpointError, match=r"step\.npz: corrupt .* step .* is not a non-negative whole number"):
            ck.load_training_state(rewrite("step.npz", step=bad))


def test_training_state_errors(tmp_path, monkeypatch):
    import json

    state, _, _ = _training_state(tmp_path)
    path = tmp_path / "run.npz"
    ck.save_training_state(path, state)
    good = path.read_bytes()

    cut = tmp_path / "cut.npz"
    cut.write_bytes(good[: len(good) // 2])
    with pytest.raises(CheckpointError, match=r"cut\.npz: .*(truncated or corrupt|corrupt)"):
        ck.load_training_state(cut)
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip file at all" * 10)
    with pytest.raises(CheckpointError, match=r"junk\.npz: not an llmcupy training-state file \(not a zip archive\)"):
        ck.load_training_state(junk)

    def rewrite(name, **changes):
        with np.load(path) as z:
            arrays = {k: z[k] for k in z.files}
        meta = json.loads(arrays["meta"].tobytes())
        for k, v in changes.items():
            if k in ("params", "adam_m"):
                arrays[k] = v
            else:
                meta[k] = v
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
        p = tmp_path / name
        np.savez(p, **arrays)
        return p

    with pytest.raises(CheckpointError, match=r"fmt\.npz: not an llmcupy training-state file \(format tag 'other'\)"):
        ck.load_training_state(rewrite("fmt.npz", format="other"))
    # a -o DIR checkpoint's per-rank state given to -e or --resume said only "(format tag 'llmcupy-rank-state')"
    rank = rewrite("state_00000020_00000.npz", format="llmcupy-rank-state", step=20)
    with pytest.raises(CheckpointError) as exc:
        ck.load_training_state(rank)
    assert str(exc.value) == (f"{rank}: it is one rank's optimizer state of a -o DIR checkpoint, not a training "
                              f"state; the model is {tmp_path / 'model_00000020.bin'} (-e takes it), and -o "
                              f"{tmp_path} -y 1 continues that run")
    with pytest.raises(CheckpointError, match=r"ver\.npz: unsupported llmcupy training-state file version 9"):
        ck.load_training_state(rewrite("ver.npz", version=9))
    with pytest.raises(CheckpointError, match=r"size\.npz: params is float32\[10\]; the model needs float32\[\d+\]"):
        ck.load_training_state(rewrite("size.npz", params=np.zeros(10, np.float32)))
    with pytest.raises(CheckpointError, match=r"dtype\.npz: adam_m is float64"):
        ck.load_training_state(rewrite("dtype.npz", adam_m=state.m.astype(np.float64)))
    with pytest.raises(CheckpointError, match=r"cfg\.npz: bad model config"):
        ck.load_training_state(rewrite("cfg.npz", config={"channels": 7, "num_heads": 2}))
    np.savez(tmp_path / "nometa.npz", params=state.params)
    _check_step_and_moments(tmp_path, path)
    with pytest.raises(CheckpointError, match=r"nometa\.npz: not an llmcupy training-state file: no 'meta' member"):
        ck.load_training_state(tmp_path / "nometa.npz")
    np.savez(tmp_path / "badjson.npz", params=state.params, meta=np.frombuffer(b"{not json", np.uint8))
    with pytest.raises(CheckpointError, match=r"badjson\.npz: corrupt .*unreadable metadata"):
        ck.load_training_state(tmp_path / "badjson.npz")
    # one damaged byte in a member's .npy header (an unterminated quote) was a tokenize.TokenError traceback
    raw = path.read_bytes()
    damaged = tmp_path / "damaged.npz"
    damaged.write_bytes(raw.replace(b"{'descr'", b"\"'descr'", 1))
    with pytest.raises(CheckpointError, match=r"damaged\.npz: corrupt llmcupy training-state file"):
        ck.load_training_state(damaged)
    np.save(tmp_path / "single.npy", np.zeros(3))
    with pytest.raises(CheckpointError, match=r"single.npy: not an llmcupy training-state file \(a single .npy array"):
        ck.load_training_state(tmp_path / "single.npy")
    with pytest.raises(TypeError, match="cannot store set at extra.bad"):
        ck.save_training_state(tmp_path / "bad.npz", TrainingState(config=TINY, params=state.params, step=0,
                                                                   extra={"bad": {1, 2}}))
    with pytest.raises(TypeError, match="keys must be strings"):
        ck.save_training_state(tmp_path / "bad.npz", TrainingState(config=TINY, params=state.params, step=0,
                                                                   extra={1: 2}))
    with pytest.raises(ValueError, match="params has shape"):
        ck.save_training_state(tmp_path / "bad.npz", TrainingState(config=TINY, params=np.zeros(3), step=0))
    assert not (tmp_path / "bad.npz").exists()

    # Ctrl-C in the middle of a save keeps the previous checkpoint
    def interrupted(f, **arrays):
        f.write(b"PK partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(ck.np, "savez", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ck.save_training_state(path, state)
    assert path.read_bytes() == good
    assert not list(tmp_path.glob(".*.tmp"))
