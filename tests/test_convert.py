"""Hugging Face GPT-2 safetensors -> llm.c model file, on small synthetic checkpoints."""

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from llmcupy import checkpoint as ck
from llmcupy import convert as cv
from llmcupy.config import PRESETS, GPT2Config, num_parameters
from llmcupy.convert import ConvertError

L, C, NH, V, MAXT = 2, 64, 4, 300, 32  # Vp = 384


def hf_tensors(L=L, C=C, V=V, maxT=MAXT, seed=0, prefix="", buffers=True):
    """A GPT-2 checkpoint in Hugging Face's layout: Conv1D weights are (in, out)."""
    g = np.random.default_rng(seed)

    def r(*shape):
        return g.normal(size=shape).astype(np.float32)

    t = {"wte.weight": r(V, C), "wpe.weight": r(maxT, C), "ln_f.weight": r(C), "ln_f.bias": r(C)}
    for l in range(L):
        h = f"h.{l}."
        t.update({h + "ln_1.weight": r(C), h + "ln_1.bias": r(C),
                  h + "attn.c_attn.weight": r(C, 3 * C), h + "attn.c_attn.bias": r(3 * C),
                  h + "attn.c_proj.weight": r(C, C), h + "attn.c_proj.bias": r(C),
                  h + "ln_2.weight": r(C), h + "ln_2.bias": r(C),
                  h + "mlp.c_fc.weight": r(C, 4 * C), h + "mlp.c_fc.bias": r(4 * C),
                  h + "mlp.c_proj.weight": r(4 * C, C), h + "mlp.c_proj.bias": r(C)})
        if buffers:
            t[h + "attn.bias"] = np.tril(np.ones((maxT, maxT), np.float32))[None, None]
    return {prefix + k: v for k, v in t.items()}


def check_placement(params, config, t, prefix=""):
    p = ck.split_params(params, config)
    g = lambda k: t[prefix + k]  # noqa: E731
    Vr = config.vocab_size
    assert np.array_equal(p["wte"][:Vr], g("wte.weight"))
    assert not p["wte"][Vr:].any()  # zero padding rows
    assert np.array_equal(p["wpe"], g("wpe.weight"))
    assert np.array_equal(p["lnfw"], g("ln_f.weight")) and np.array_equal(p["lnfb"], g("ln_f.bias"))
    for l in range(config.num_layers):
        h = f"h.{l}."
        assert np.array_equal(p["ln1w"][l], g(h + "ln_1.weight")) and np.array_equal(p["ln1b"][l], g(h + "ln_1.bias"))
        assert np.array_equal(p["qkvw"][l], g(h + "attn.c_attn.weight").T)   # (3C, C) = (out, in)
        assert np.array_equal(p["qkvb"][l], g(h + "attn.c_attn.bias"))
        assert np.array_equal(p["attprojw"][l], g(h + "attn.c_proj.weight").T)
        assert np.array_equal(p["attprojb"][l], g(h + "attn.c_proj.bias"))
        assert np.array_equal(p["ln2w"][l], g(h + "ln_2.weight")) and np.array_equal(p["ln2b"][l], g(h + "ln_2.bias"))
        assert np.array_equal(p["fcw"][l], g(h + "mlp.c_fc.weight").T)       # (4C, C)
        assert np.array_equal(p["fcb"][l], g(h + "mlp.c_fc.bias"))
        assert np.array_equal(p["fcprojw"][l], g(h + "mlp.c_proj.weight").T)  # (C, 4C)
        assert np.array_equal(p["fcprojb"][l], g(h + "mlp.c_proj.bias"))


def test_convert_places_and_transposes_exactly(tmp_path):
    t = hf_tensors()
    src, out = tmp_path / "model.safetensors", tmp_path / "tiny.bin"
    save_file(t, str(src))
    config = cv.convert(src, out, num_heads=NH)
    assert config == ck.GPT2Config(max_seq_len=MAXT, vocab_size=V, num_layers=L, num_heads=NH, channels=C)
    assert config.padded_vocab_size == 384
    header = np.frombuffer(out.read_bytes()[:32], dtype="<i4")
    assert header.tolist() == [20240326, 3, MAXT, V, L, NH, C, 384]
    read_config, params = ck.read_model(out)
    assert read_config == config
    check_placement(params, config, t)
    # spot-check one element by hand: qkvw[l][o, i] = c_attn.weight[i, o]
    p = ck.split_params(params, config)
    assert p["qkvw"][1][130, 5] == t["h.1.attn.c_attn.weight"][5, 130]
    assert p["fcprojw"][0][3, 200] == t["h.0.mlp.c_proj.weight"][200, 3]


def test_full_gpt2_vocab_pads_to_50304(tmp_path):
    t = hf_tensors(L=1, C=64, V=50257, maxT=8, buffers=False)
    config, params = cv.hf_to_llmc(t)
    assert config.padded_vocab_size == 50304 and config.num_heads == 1  # C / 64
    wte = ck.split_params(params, config)["wte"]
    assert wte.shape == (50304, 64) and not wte[50257:].any()
    assert np.array_equal(wte[:50257], t["wte.weight"])


def test_prefixed_keys_and_tied_lm_head(tmp_path):
    t = hf_tensors(prefix="transformer.")
    t["lm_head.weight"] = t["transformer.wte.weight"].copy()
    config, params = cv.hf_to_llmc(t, num_heads=NH)
    check_placement(params, config, t, prefix="transformer.")
    t["lm_head.weight"][0, 0] += 1
    with pytest.raises(ConvertError, match="lm_head.weight differs"):
        cv.hf_to_llmc(t, num_heads=NH)


def test_a_tied_lm_head_saved_in_place_of_wte(tmp_path):
    # safetensors.torch.save_model keeps one name of tied tensors, the first in sorted order:
    # "lm_head.weight" before "transformer.wte.weight". That file was "missing tensor 'wte.weight':
    # not a GPT-2 checkpoint"
    t = hf_tensors(prefix="transformer.")
    t["lm_head.weight"] = t.pop("transformer.wte.weight")
    config, params = cv.hf_to_llmc(t, num_heads=NH)
    t["transformer.wte.weight"] = t["lm_head.weight"]
    check_placement(params, config, t, prefix="transformer.")


def test_num_heads_from_config_json(tmp_path):
    src = tmp_path / "model.safetensors"
    save_file(hf_tensors(), str(src))
    (tmp_path / "config.json").write_text(json.dumps({"n_head": 8, "n_embd": C}))
    assert cv.convert(src, tmp_path / "a.bin").num_heads == 8
    assert cv.convert(src, tmp_path / "b.bin", num_heads=2).num_heads == 2  # the flag wins
    (tmp_path / "config.json").write_text("{broken")
    with pytest.warns(UserWarning, match="ignoring unreadable .*config.json"):
        assert cv.convert(src, tmp_path / "c.bin").num_heads == 1  # falls back to C / 64
    # a JSON list was an AttributeError traceback; n_head "twelve" a ValueError one; 2.7 became 2 and
    # 0 was taken for "no n_head" (a guess) without a word
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.warns(UserWarning, match="ignoring unreadable .*config.json.*not a JSON object"):
        assert cv.convert(src, tmp_path / "d.bin").num_heads == 1
    for n_head in ("twelve", 2.7, 0, -4, True):
        (tmp_path / "config.json").write_text(json.dumps({"n_head": n_head}))
        with pytest.raises(ConvertError) as exc:
            cv.convert(src, tmp_path / "e.bin")
        assert str(exc.value) == (f"{tmp_path / 'config.json'}: n_head is {n_head!r}, not a positive whole number; "
                                  "correct it, or pass --num-heads N"), n_head
    assert not (tmp_path / "e.bin").exists()


def test_cli(tmp_path, capsys):
    src = tmp_path / "model.safetensors"
    save_file(hf_tensors(), str(src))
    out = tmp_path / "gpt2_tiny.bin"
    assert cv.main([str(src), "-o", str(out), "--num-heads", str(NH)]) == 0
    printed = capsys.readouterr().out
    assert f"V={V} Vp=384 L={L} NH={NH} C={C}" in printed and "fp32, version 3" in printed
    assert ck.read_model_header(out)[1] == 3
    out16 = tmp_path / "gpt2_tiny_bf16.bin"
    assert cv.main([str(src), "-o", str(out16), "--num-heads", str(NH), "--bf16"]) == 0
    assert ck.read_model_header(out16)[1] == 5


def test_the_head_count_of_a_released_gpt2_shape_is_stated_not_guessed():
    # the README's path (download gpt2, then convert) has no config.json, and every GPT-2 release has
    # 64-wide heads: "guessed ... pass --num-heads N if it differs" there was a false alarm
    from llmcupy.config import GPT2Config

    for name, nh in (("d12", 12), ("d24", 16), ("d36", 20), ("d48", 25)):
        c = GPT2Config.preset(name)
        assert cv.heads_note(c) == (f"NH = {nh}, as GPT-2's release of L = {c.num_layers}, C = {c.channels} "
                                    f"({name}) has it")
    other = GPT2Config(num_layers=2, num_heads=12, channels=768)   # not a released shape: still a guess
    assert cv.heads_note(other).startswith("guessed NH = C/64 = 12")


def test_cli_names_a_guessed_head_count_and_keeps_an_existing_default_output(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    src = tmp_path / "model.safetensors"
    save_file(hf_tensors(), str(src))
    # no config.json: NH = C / 64, said with the flag that overrides it
    assert cv.main([str(src)]) == 0
    printed = capsys.readouterr().out
    assert f"guessed NH = C/64 = {C // 64}" in printed and "--num-heads N" in printed, printed
    # not a released size: named by its parameter count, in llm.c's pattern
    (default,) = [p.name for p in tmp_path.glob("gpt2_*M.bin")]
    assert printed.startswith("note: ") and f"wrote {default}: " in printed, printed
    made = (tmp_path / default).read_bytes()
    # the default output exists: refused (nothing written) unless named with -o
    assert cv.main([str(src), "--num-heads", str(NH)]) == 2
    err = capsys.readouterr().err
    assert f"{default} exists; pass -o {default} to replace it" in err, err
    assert (tmp_path / default).read_bytes() == made
    assert cv.main([str(src), "-o", default, "--num-heads", str(NH)]) == 0
    assert "guessed" not in capsys.readouterr().out
    assert ck.read_model_header(tmp_path / default)[0].num_heads == NH


def test_default_output_is_named_by_the_models_size():
    """llm.c's names for the released sizes; before, every size was written as gpt2_124M.bin, which
    the trainer and sample then read by default as if it were the 124M model."""
    assert [cv.default_model_file(PRESETS[n]) for n in ("d12", "d24", "d36", "d48")] == [
        "gpt2_124M.bin", "gpt2_350M.bin", "gpt2_774M.bin", "gpt2_1558M.bin"]
    assert num_parameters(PRESETS["d2"]) == 6_868_480 and cv.default_model_file(PRESETS["d2"]) == "gpt2_6.87M.bin"
    # the 124M shape with a longer context is not the released model: named by its own count
    longer = GPT2Config(max_seq_len=2048)
    assert num_parameters(longer) == 125_262_336 and cv.default_model_file(longer) == "gpt2_125M.bin"


def test_errors(tmp_path, capsys):
    t = hf_tensors(buffers=False)
    missing = dict(t)
    del missing["h.1.mlp.c_fc.bias"]
    with pytest.raises(ConvertError, match=r"missing tensor 'h\.1\.mlp\.c_fc\.bias'"):
        cv.hf_to_llmc(missing, num_heads=NH)
    wrong = dict(t)
    wrong["h.0.mlp.c_fc.weight"] = t["h.0.mlp.c_fc.weight"].T.copy()  # already (out, in)
    with pytest.raises(ConvertError, match=r"'h\.0\.mlp\.c_fc\.weight' has shape \(256, 64\), expected \(64, 256\)"):
        cv.hf_to_llmc(wrong, num_heads=NH)
    extra = dict(t)
    extra["h.0.attn.q_proj.weight"] = np.zeros((C, C), np.float32)
    with pytest.raises(ConvertError, match=r"unexpected tensors .*h\.0\.attn\.q_proj\.weight"):
        cv.hf_to_llmc(extra, num_heads=NH)
    with pytest.raises(ConvertError, match=r"missing tensor 'wte\.weight'"):
        cv.hf_to_llmc({k: v for k, v in t.items() if k != "wte.weight"}, num_heads=NH)
    gap = {k: v for k, v in t.items() if not k.startswith("h.0.")}
    with pytest.raises(ConvertError, match=r"numbered 0\.\.L-1; found \[1\]"):
        cv.hf_to_llmc(gap, num_heads=NH)
    with pytest.raises(ConvertError, match="must be divisible by num_heads 5"):
        cv.hf_to_llmc(t, num_heads=5)
    odd = hf_tensors(L=1, C=48, buffers=False)
    with pytest.raises(ConvertError, match="pass --num-heads"):
        cv.hf_to_llmc(odd)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"definitely not safetensors")
    with pytest.raises(ConvertError, match=r"bad\.safetensors: cannot read safetensors file"):
        cv.convert(bad, tmp_path / "x.bin")
    assert cv.main([str(bad), "-o", str(tmp_path / "x.bin")]) == 2
    assert "cannot read safetensors file" in capsys.readouterr().err
    assert cv.main([str(tmp_path / "absent.safetensors"), "-o", str(tmp_path / "x.bin")]) == 2
    assert "absent.safetensors" in capsys.readouterr().err
    assert not (tmp_path / "x.bin").exists()


def test_cli_errors_name_the_input_file(tmp_path, capsys):
    # "error: missing tensor 'h.1.ln_2.bias'" named no file; an llm.c token file given as the weights
    # was "cannot read safetensors file: ... header too large"; an integer tensor was converted silently
    from llmcupy.data import write_tokens

    out = tmp_path / "out.bin"
    t = hf_tensors(buffers=False)
    cases = []
    missing = tmp_path / "missing.safetensors"
    save_file({k: v for k, v in t.items() if k != "h.1.ln_2.bias"}, str(missing))
    cases.append((missing, f"error: {missing}: missing tensor 'h.1.ln_2.bias'"))
    shape = tmp_path / "shape.safetensors"
    save_file({**t, "h.0.attn.c_attn.weight": t["h.0.attn.c_attn.weight"].T.copy()}, str(shape))
    cases.append((shape, f"error: {shape}: tensor 'h.0.attn.c_attn.weight' has shape (192, 64), expected (64, 192)"))
    ints = tmp_path / "ints.safetensors"
    save_file({**t, "h.0.ln_1.bias": np.zeros(C, np.int64)}, str(ints))
    cases.append((ints, f"error: {ints}: tensor 'h.0.ln_1.bias' holds int64 values; GPT-2 weights are floating point"))
    # wte and wpe, read before the per-layer tensors, were cast without that check
    for key, shape in (("wte.weight", (V, C)), ("wpe.weight", (MAXT, C))):
        int_embedding = tmp_path / f"int_{key}.safetensors"
        save_file({**t, key: np.ones(shape, np.int32)}, str(int_embedding))
        cases.append((int_embedding, f"error: {int_embedding}: tensor {key!r} holds int32 values; GPT-2 weights are "
                                     "floating point"))
    tokens = tmp_path / "train.bin"
    write_tokens(tokens, np.arange(10))
    cases.append((tokens, f"error: {tokens}: it is an llm.c token (data) file, not GPT-2 weights"))
    for src, expected in cases:
        assert cv.main([str(src), "-o", str(out), "--num-heads", str(NH)]) == 2, src
        err = capsys.readouterr().err
        assert err.startswith(expected) and len(err.splitlines()) == 1, err
        assert not out.exists()
    with pytest.raises(ConvertError, match=f"{ints.name}: tensor 'h.0.ln_1.bias' holds int64"):
        cv.convert(ints, out, num_heads=NH)


def test_a_truncated_safetensors_file_is_named_truncated(tmp_path, capsys):
    # a partial download by hand said "cannot read safetensors file: Error while deserializing header:
    # incomplete metadata, file not fully covered"
    src = tmp_path / "model.safetensors"
    save_file(hf_tensors(buffers=False), str(src))
    data = src.read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(data[:len(data) - 1000])
    assert cv.main([str(cut), "-o", str(tmp_path / "x.bin"), "--num-heads", str(NH)]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: {cut}: truncated safetensors file: its header needs {len(data)} bytes, the file has "
                   f"{len(data) - 1000} (1000 missing); download it again\n"), err
    assert not (tmp_path / "x.bin").exists()


def test_cli_refuses_outputs_it_cannot_write_or_that_are_its_input(tmp_path, capsys):
    src = tmp_path / "model.safetensors"
    save_file(hf_tensors(), str(src))
    model = tmp_path / "model.bin"
    assert cv.main([str(src), "-o", str(model), "--num-heads", str(NH)]) == 0
    state = tmp_path / "state.npz"
    config, params = ck.read_model(model)
    ck.save_training_state(state, ck.TrainingState(config=config, params=params, step=0))
    state_bytes = state.read_bytes()
    capsys.readouterr()

    def refused(argv, *needles):
        assert cv.main([str(a) for a in argv]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and all(n in err for n in needles), err

    # -o naming the input replaced the training state (its AdamW moments and step) by a model file
    refused([state, "-o", state], f"-o {state} is the input file", "Give -o another file")
    assert state.read_bytes() == state_bytes
    refused([src, "--safetensors", src], f"--safetensors {src} is the input file")
    # a folder, or a path under a file, was reported naming a hidden temporary file / "File exists"
    refused([model, "-o", tmp_path], f"-o {tmp_path}: it is a folder")
    refused([model, "-o", model / "x.bin"], f"-o {model / 'x.bin'}: {model} is not a folder")
    refused([model, "-o", tmp_path / "a.bin", "--safetensors", tmp_path / "a.bin"], "-o and --safetensors both name")
    # the config.json written beside --safetensors: naming it as the export kept only the JSON (exit 0,
    # the weights replaced), -o naming it replaced the JSON by the model file, and a folder there left
    # the weights without their config.json ("config.json is a folder", a file the user never named)
    export = tmp_path / "hf"
    refused([model, "--safetensors", export / "config.json"], f"--safetensors {export / 'config.json'}: convert "
            "writes the export's config.json under that name beside it; name the weights e.g. model.safetensors")
    refused([model, "--safetensors", export / "model.safetensors", "-o", export / "config.json"],
            f"-o {export / 'config.json'} is the config.json written beside --safetensors")
    (export / "config.json").mkdir(parents=True)
    refused([model, "--safetensors", export / "model.safetensors"],
            f"--safetensors {export / 'model.safetensors'}: the config.json beside it: it is a folder")
    assert not (export / "model.safetensors").exists()
    # --num-heads is the safetensors input's; one that disagrees with a model file's NH was ignored
    refused([model, "-o", tmp_path / "b.bin", "--num-heads", NH * 2], f"holds a model with NH = {NH}")
    assert not (tmp_path / "b.bin").exists()
    assert cv.main([str(model), "-o", str(tmp_path / "c.bin"), "--num-heads", str(NH)]) == 0


def _write_bf16_safetensors(path, tensors, extra=None):
    """A safetensors file with BF16 tensors, by its published layout (NumPy cannot write bfloat16);
    ``extra`` maps more names to (safetensors dtype, array of that dtype's width), stored as they are."""
    header, blobs, offset = {}, [], 0
    stored = {name: ("BF16", ck.fp32_to_bf16(np.asarray(a, np.float32)).astype("<u2")) for name, a in tensors.items()}
    for name, (dtype, a) in {**stored, **(extra or {})}.items():
        blob = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def test_bf16_safetensors_are_widened_exactly(tmp_path, capsys):
    # "cannot read safetensors file: data type 'bfloat16' not understood": a BF16 export was refused
    t = hf_tensors(buffers=False)
    src = tmp_path / "bf16.safetensors"
    _write_bf16_safetensors(src, t)
    out = tmp_path / "bf16.bin"
    assert cv.main([str(src), "-o", str(out), "--num-heads", str(NH)]) == 0
    # one line, not Python's two (llmcupy's source file and line, then that line's code)
    err = capsys.readouterr().err
    assert err == f"warning: {src}: BF16 weights, widened to fp32 (the values keep bf16 precision)\n", err
    config, params = ck.read_model(out)
    rounded = {k: ck.bf16_to_fp32(ck.fp32_to_bf16(np.asarray(v, np.float32))).reshape(v.shape) for k, v in t.items()}
    ref_config, ref = cv.hf_to_llmc(rounded, num_heads=NH)
    assert config == ref_config and np.array_equal(params, ref)
    # a BF16 file with a broken header is still one clear error
    src.write_bytes(src.read_bytes()[:200])
    assert cv.main([str(src), "-o", str(tmp_path / "x.bin"), "--num-heads", str(NH)]) == 2
    assert "cannot read safetensors file" in capsys.readouterr().err


def test_a_bf16_file_may_carry_its_mask_buffers_in_any_dtype(tmp_path, capsys):
    # transformers saved GPT-2's causal-mask buffer attn.bias as BOOL (U8 in older versions); in a
    # BF16 export that was "tensor 'h.0.attn.bias' is BOOL; GPT-2 weights must be F32, F16 or BF16",
    # though the buffer is ignored. An integer weight is still refused, now by name, as in an F32 file.
    t = hf_tensors(buffers=False)
    mask = np.tril(np.ones((MAXT, MAXT), np.uint8))[None, None]
    for dtype in ("BOOL", "U8"):
        src = tmp_path / f"bf16_{dtype}.safetensors"
        _write_bf16_safetensors(src, t, extra={"h.0.attn.bias": (dtype, mask), "h.1.attn.bias": (dtype, mask)})
        out = tmp_path / f"{dtype}.bin"
        assert cv.main([str(src), "-o", str(out), "--num-heads", str(NH)]) == 0, capsys.readouterr().err
        rounded = {k: ck.bf16_to_fp32(ck.fp32_to_bf16(v)).reshape(v.shape) for k, v in t.items()}
        assert np.array_equal(ck.read_model(out)[1], cv.hf_to_llmc(rounded, num_heads=NH)[1])
    capsys.readouterr()
    src = tmp_path / "bf16_int_weight.safetensors"
    _write_bf16_safetensors(src, {k: v for k, v in t.items() if k != "h.0.ln_1.bias"},
                            extra={"h.0.ln_1.bias": ("I64", np.zeros(C, np.int64))})
    assert cv.main([str(src), "-o", str(tmp_path / "x.bin"), "--num-heads", str(NH)]) == 2
    err = capsys.readouterr().err
    assert f"{src}: tensor 'h.0.ln_1.bias' holds int64 values; GPT-2 weights are floating point" in err, err
    assert not (tmp_path / "x.bin").exists()


def _pytorch_checkpoints(folder):
    """Files laid out as torch.save writes them, without needing torch: the zip archive of PyTorch
    >= 1.6 (``<name>/data.pkl`` and its storages) and the legacy pickle stream, which opens with
    protocol 2's marker and the pickled magic number 0x1950a86a20f9469cfc6c."""
    import zipfile

    zipped = folder / "pytorch_model.bin"
    with zipfile.ZipFile(zipped, "w") as z:
        for member, data in (("data.pkl", b"\x80\x02}q\x00."), ("version", b"3\n"), ("data/0", bytes(64))):
            z.writestr(f"pytorch_model/{member}", data)
    legacy = folder / "legacy_pytorch_model.bin"
    legacy.write_bytes(bytes.fromhex("80028a0a6cfc9c46f9206aa85019") + b".\x80\x02M\xe9\x03." + bytes(64))
    return zipped, legacy


def test_a_pytorch_checkpoint_is_named_as_one(tmp_path, capsys):
    # Hugging Face's pytorch_model.bin given to convert (or to sample/train -e) was "not an llmcupy
    # training-state file: no 'meta' member", or in the legacy format "cannot read safetensors file:
    # ... header too large" and "bad magic number 176816768"
    from llmcupy import sample

    for src in _pytorch_checkpoints(tmp_path):
        expected = (f"error: {src}: it is a PyTorch checkpoint (torch.save, like Hugging Face's pytorch_model.bin), "
                    "which llmcupy does not read; convert the model's model.safetensors instead (transformers' "
                    "save_pretrained writes one)\n")
        assert cv.main([str(src), "-o", str(tmp_path / "x.bin")]) == 2
        err = capsys.readouterr().err
        assert err == expected, err
        assert not (tmp_path / "x.bin").exists()
        assert sample.main(["-e", str(src), "-n", "1"]) == 2
        assert capsys.readouterr().err == expected
        with pytest.raises(ck.CheckpointError, match="it is a PyTorch checkpoint"):
            ck.load_training_state(src)   # --resume


def _hugging_face_logits(t, tokens, num_heads):
    """GPT-2's forward pass written over Hugging Face's tensors as they are stored (Conv1D: x @ W + b
    with W (in, out); the causal mask read from the attn.bias buffer; logits by the tied wte), in
    PyTorch: an oracle that shares no code, and no layout, with llmcupy."""
    import math

    import torch

    F = torch.nn.functional
    w = {k.removeprefix("transformer."): torch.from_numpy(np.asarray(v, np.float32)) for k, v in t.items()}
    C = w["wte.weight"].shape[1]
    T, hs = len(tokens), C // num_heads
    x = w["wte.weight"][tokens] + w["wpe.weight"][:T]
    for l in range(len({k.split(".")[1] for k in w if k.startswith("h.")})):
        h = lambda name: w[f"h.{l}.{name}"]  # noqa: E731
        a = F.layer_norm(x, (C,), h("ln_1.weight"), h("ln_1.bias"), 1e-5)
        q, k, v = ((a @ h("attn.c_attn.weight") + h("attn.c_attn.bias")).split(C, -1))
        q, k, v = (z.view(T, num_heads, hs).transpose(0, 1) for z in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hs)
        att = att.masked_fill(h("attn.bias")[0, 0, :T, :T] == 0, float("-inf")).softmax(-1)
        x = x + (att @ v).transpose(0, 1).reshape(T, C) @ h("attn.c_proj.weight") + h("attn.c_proj.bias")
        a = F.layer_norm(x, (C,), h("ln_2.weight"), h("ln_2.bias"), 1e-5)
        a = F.gelu(a @ h("mlp.c_fc.weight") + h("mlp.c_fc.bias"), approximate="tanh")
        x = x + a @ h("mlp.c_proj.weight") + h("mlp.c_proj.bias")
    x = F.layer_norm(x, (C,), w["ln_f.weight"], w["ln_f.bias"], 1e-5)
    return (x @ w["lm_head.weight"].T).numpy()


def test_converted_hugging_face_weights_give_its_logits(tmp_path):
    # The placement tests compare tensors with tensors; this runs a Hugging Face GPT2LMHeadModel file
    # (prefixed keys, tied lm_head, mask buffers) through convert and our model, against the oracle above.
    # Tolerance: both sides are FP32 and differ only in summation order (sums of at most 4C = 256 terms,
    # relative rounding ~1e-6 at |logits| ~ 0.5; measured max 2.5e-7); 1e-5 is llmcupy's model-vs-PyTorch
    # logits bound (tests/test_model.py), while c_proj left untransposed moves them by 0.7.
    pytest.importorskip("torch")
    from llmcupy.model import GPT2
    from llmcupy.runtime import backend

    def scaled(key, a):   # GPT-2-like magnitudes; c_attn larger, so that attention is far from uniform
        if ".ln_" in key or "ln_f." in key:
            return (1.0 + 0.1 * a) if key.endswith("weight") else 0.1 * a
        return a * (0.3 if "c_attn.weight" in key else 0.02 if a.ndim == 2 else 0.1)

    t = {k: scaled(k, v).astype(np.float32) for k, v in hf_tensors(prefix="transformer.", buffers=False).items()}
    for l in range(L):   # the buffers as transformers saves them: a 0/1 lower-triangular mask, the masked score
        t[f"transformer.h.{l}.attn.bias"] = np.tril(np.ones((MAXT, MAXT), np.float32))[None, None]
        t[f"transformer.h.{l}.attn.masked_bias"] = np.array(-1e4, np.float32)
    t["lm_head.weight"] = t["transformer.wte.weight"].copy()
    src, out = tmp_path / "model.safetensors", tmp_path / "model.bin"
    save_file(t, str(src))
    assert cv.main([str(src), "-o", str(out), "--num-heads", str(NH)]) == 0
    config, params = ck.read_model(out)
    tokens = np.random.default_rng(1).integers(0, V, size=8)
    model = GPT2(config, params)
    model.forward(tokens[None].astype(np.int32))
    ours = backend.to_numpy(model.logits())[0]
    ref = _hugging_face_logits(t, tokens, NH)
    assert ours.shape == ref.shape == (8, V)
    assert np.abs(ref).max() > 0.1   # not a vanishing signal that any layout would match
    np.testing.assert_allclose(ours, ref, atol=1e-5, rtol=1e-5)


def test_a_sharded_checkpoint_converts_from_its_index(tmp_path, capsys):
    # transformers' save_pretrained splits a model over max_shard_size (5 GB: GPT-2 XL in fp32) into
    # model-0000N-of-0000M.safetensors and model.safetensors.index.json; the index was "cannot read
    # safetensors file: ... header too large", a shard "missing tensor 'wte.weight': not a GPT-2 checkpoint"
    t = hf_tensors()
    names = sorted(t)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for shard, keys in shards.items():
        save_file({k: t[k] for k in keys}, str(tmp_path / shard))
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 0},
                                 "weight_map": {k: shard for shard, keys in shards.items() for k in keys}}))
    out = tmp_path / "model.bin"
    assert cv.main([str(index), "-o", str(out), "--num-heads", str(NH)]) == 0, capsys.readouterr().err
    config, params = ck.read_model(out)
    ref_config, ref = cv.hf_to_llmc(t, num_heads=NH)
    assert config == ref_config and np.array_equal(params, ref)
    capsys.readouterr()

    def refused(src, expected):
        assert cv.main([str(src), "-o", str(tmp_path / "x.bin"), "--num-heads", str(NH)]) == 2
        err = capsys.readouterr().err
        assert err == f"error: {expected}\n", err
        assert not (tmp_path / "x.bin").exists()

    shard = tmp_path / "model-00001-of-00002.safetensors"
    refused(shard, f"{shard}: missing tensor 'wte.weight': not a GPT-2 checkpoint; it is one shard of a sharded "
                   f"checkpoint: give its index, {index}")
    shard.rename(tmp_path / "moved.safetensors")
    refused(index, f"{index}: its shard model-00001-of-00002.safetensors is not beside it; download every shard "
                   "the index names")
    index.write_text(json.dumps({"metadata": {}}))
    refused(index, f"{index}: not a safetensors index (model.safetensors.index.json): it has no weight_map")


def test_a_safetensors_file_given_as_a_model_says_to_convert_it(tmp_path, capsys):
    # sample/train -e model.safetensors said "bad magic number 2688 (expected 20240326): not an llm.c
    # model file": the header length of the safetensors file read as llm.c's magic number
    from llmcupy import sample

    src = tmp_path / "model.safetensors"
    save_file(hf_tensors(), str(src))
    expected = (f"{src}: it is a safetensors file (Hugging Face weights), not an llm.c model file; convert it first: "
                f"python -m llmcupy.convert {src} -o model.bin, then give model.bin")
    with pytest.raises(ck.CheckpointError) as exc:
        ck.read_model_any(src)
    assert str(exc.value) == expected
    assert sample.main(["-e", str(src), "-n", "1"]) == 2
    assert capsys.readouterr().err == f"error: {expected}\n"
