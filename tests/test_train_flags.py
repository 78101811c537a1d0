"""The trainer refuses bad or contradictory flags up front (exit 2, one line naming the flag or file),
before the model is allocated or a step is trained, and does what the flags it accepts say.

* output locations (``--save-path``, ``-o``) are checked at start-up;
* ``--save-path P`` without ``--save-every`` saves the final state to P;
* contradictory kernel or step flags are refused, identical repeats pass;
* missing data and a T the attention version refuses say what works instead;
* a negative learning rate and a block size the version does not run are refused before allocation;
  a sample longer than T is announced; ``sample -n`` must not be negative.

Every run here is in-process (``llmcupy.train.main``) on a d1/d2 model with tiny random token files.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from llmcupy import checkpoint as ckpt
from llmcupy.data import write_tokens

from _helpers import run_train


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("tokens")
    rng = np.random.default_rng(3)
    write_tokens(d / "train.bin", rng.integers(0, 50257, 400))
    write_tokens(d / "val.bin", rng.integers(0, 50257, 100))
    return ["-i", d / "train.bin", "-j", d / "val.bin"]


def tiny(data, steps=1):
    """Steps of d1 at B=1, T=16, without validation or samples: a fraction of a second each."""
    return ["--init", "d1", "-b", 1, "-t", 16, "-v", 0, "-s", 0, "--steps", steps] + data


def refused_before_work(rc, out, err, *needles):
    """Exit 2, the needles in the one-line error, and nothing allocated or trained."""
    assert rc == 2, out + err
    assert all(n in err for n in needles), err
    assert len(err.strip().splitlines()) == 1, err
    assert "allocated" not in out and "step    1" not in out, out


# -- output locations ----------------------------------------------------------------------------


def test_unwritable_output_locations_are_refused_at_start_up(data, tmp_path):
    missing = tmp_path / "no_such_dir" / "log.txt"
    refused_before_work(*run_train(tiny(data) + ["-o", missing]),
                        f"-o {missing}: the folder {missing.parent} does not exist")
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    refused_before_work(*run_train(tiny(data) + ["--save-every", 1, "--save-path", not_a_folder / "st.npz"]),
                        f"--save-path {not_a_folder / 'st.npz'}: {not_a_folder} is not a folder")
    refused_before_work(*run_train(tiny(data) + ["--save-every", 1, "--save-path", tmp_path]),
                        f"--save-path {tmp_path}: it is a folder")
    # a folder nobody can create files in (root may write anywhere else, not in /proc)
    refused_before_work(*run_train(tiny(data) + ["--save-every", 1, "--save-path", "/proc/st.npz"]),
                        "--save-path /proc/st.npz: cannot create a file in /proc")
    assert not list(tmp_path.glob("**/.llmcupy-write-check*"))   # the probe leaves nothing behind
    # a FIFO or device (--save-path /dev/null) passed the check, then the save after training
    # replaced it by a regular file (or, now, atomic_write refuses it: after the work)
    import os
    import stat

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    refused_before_work(*run_train(tiny(data) + ["--save-path", fifo]),
                        f"--save-path {fifo}: it exists and is not a regular file")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_missing_folders_of_the_save_path_are_made(data, tmp_path):
    state = tmp_path / "a" / "b" / "st.npz"
    rc, out, err = run_train(tiny(data) + ["--save-every", 1, "--save-path", state])
    assert rc == 0, err
    assert ckpt.load_training_state(state).step == 1


def test_outputs_never_overwrite_the_files_the_run_reads(data, tmp_path):
    # -o truncates its file: naming the train data there wiped it before the first batch was read
    # (the run then failed on a 0-byte token file); --save-path over the -e model replaced it
    train = tmp_path / "train.bin"
    train.write_bytes(data[1].read_bytes())
    before = train.read_bytes()
    argv = ["--init", "d1", "-b", 1, "-t", 16, "-v", 0, "-s", 0, "--steps", 1, "-i", train, "-j", data[3]]
    refused_before_work(*run_train(argv + ["-o", train]), f"-o {train} is the file -i reads")
    refused_before_work(*run_train(argv[:-4] + ["-i", data[1], "-j", train, "-o", train]),
                        f"-o {train} is the file -j reads")
    assert train.read_bytes() == before
    model = tmp_path / "model.bin"
    cfg = ckpt.GPT2Config.preset("d1")
    from llmcupy.config import init_params
    ckpt.write_model(model, cfg, init_params(cfg, seed=0))
    model_bytes = model.read_bytes()
    refused_before_work(*run_train(["-e", model] + argv[2:] + ["--save-path", model]),
                        f"--save-path {model} is the file -e reads", "Give --save-path another file")
    assert model.read_bytes() == model_bytes
    same = tmp_path / "both"
    refused_before_work(*run_train(argv + ["-o", same, "--save-path", same]), "-o and --save-path both name")


# -- --save-path without --save-every ------------------------------------------------------------


def test_save_path_alone_saves_the_final_state(data, tmp_path):
    state = tmp_path / "final.npz"
    rc, out, err = run_train(tiny(data, steps=2) + ["--save-path", state])
    assert rc == 0, err
    assert out.count("saved the training state") == 1 and f"at step 2 to {state}" in out
    s = ckpt.load_training_state(state)
    assert s.step == 2 and s.m is not None and s.v is not None


def test_benchmark_refuses_to_save(data, tmp_path):
    refused_before_work(*run_train(tiny(data) + ["--benchmark", "--save-path", tmp_path / "s.npz"]),
                        "--benchmark saves no training state")


# -- contradictory kernel and step flags -----------------------------------------------------------


@pytest.mark.parametrize("flags,needles", [
    (["--fused", "--attention-forward-kernel", 1],
     ["--attention-forward-kernel 1 chooses a version of attention_forward", "flash_attention_forward (--fused)"]),
    (["--kernel", "flash_attention_forward=1", "--kernel", "attention_backward=7"],
     ["--kernel attention_backward=7", "flash_attention_forward (--kernel flash_attention_forward=1) runs instead"]),
    (["--layernorm-forward-kernel", 3, "--kernel", "layernorm_forward=4"],
     ["--layernorm-forward-kernel 3 and --kernel layernorm_forward=4 choose layernorm_forward differently"]),
    (["--kernel", "layernorm_forward=3", "--kernel", "layernorm_forward=4"],
     ["--kernel layernorm_forward=3 and --kernel layernorm_forward=4"]),
    (["--kernel", "layernorm_forward=3:256", "--kernel", "layernorm_forward=3:512"],
     ["--kernel layernorm_forward=3:256 and --kernel layernorm_forward=3:512"]),
], ids=["fused-vs-replaced", "fusion-flag-vs-replaced", "flag-vs-kernel", "kernel-twice", "two-block-sizes"])
def test_contradictory_kernel_choices_are_refused(data, flags, needles):
    refused_before_work(*run_train(tiny(data) + flags), *needles)


def test_steps_and_its_alias_x_must_agree(data):
    rc, out, err = run_train(tiny(data) + ["-x", 3])          # tiny() gives --steps 1
    assert rc == 2 and "--steps 1 and -x 3 contradict each other; give one" in err, err
    rc, out, err = run_train(tiny(data) + ["--matmul-kernel", 2, "--matmul-kernel", 3])
    assert rc == 2 and "--matmul-kernel 2 and --matmul-kernel 3 contradict" in err, err


def test_repeating_the_same_choice_is_accepted(data):
    rc, out, err = run_train(tiny(data) + ["-x", 1, "--layernorm-forward-kernel", 3, "--layernorm-forward-kernel", 3,
                                           "--kernel", "layernorm_forward=3:256", "--kernel", "layernorm_forward=3"])
    assert rc == 0, err
    assert re.search(r"^  layernorm_forward +3 ", out, re.M) and "step    1/1" in out, out


# -- errors that say what works instead ------------------------------------------------------------


def test_missing_default_data_says_how_to_get_it(data, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                  # no data/tinyshakespeare here
    rc, out, err = run_train(["--init", "d1", "-b", 1, "-t", 16, "-x", 1])
    refused_before_work(rc, out, err, "no token files match 'data/tinyshakespeare/tiny_shakespeare_train.bin'",
                        "python -m llmcupy.data tinyshakespeare", "-i")
    rc, out, err = run_train(["--init", "d1", "-b", 1, "-t", 16, "-x", 1, "-i", data[1]])
    refused_before_work(rc, out, err, "tiny_shakespeare_val.bin' (the validation data); give it with -j", "-v 0")


def test_a_seq_len_the_attention_version_refuses_names_what_runs_it(data):
    argv = ["--init", "d1", "-b", 1, "-t", 13, "-v", 0, "-s", 0, "--steps", 1] + data
    refused_before_work(*run_train(argv), "attention_forward version 4: T = 13 must be a multiple of 4",
                        "--attention-forward-kernel 1 or 2 or 3", "--fused")
    rc, out, err = run_train(argv + ["--attention-forward-kernel", 3])
    assert rc == 0 and "step    1/1" in out, err


# -- smaller checks -------------------------------------------------------------------------------


@pytest.mark.parametrize("flags,needle", [
    (["-l", -1], "-l/--lr must be a finite number >= 0 (got -1)"),
    (["-l", "nan"], "-l/--lr must be a finite number >= 0"),
    (["--kernel", "layernorm_forward=3:7"],
     "--kernel layernorm_forward=3:7: layernorm_forward version 3 runs at block sizes 32, 64"),
    # these ended in a traceback (NumPy's seeding; an empty min() after zero timed steps)...
    (["--seed", -1], "--seed must be >= 0 (got -1)"),
    (["--benchmark", "--warmup", -1], "--warmup must not be negative (got -1)"),
    # ...or in a made-up number: -m 0 printed "val loss 0.000000" every -v steps and logged it
    (["-v", 1, "-m", 0], "-m 0 leaves no validation batch"),
    (["-v", -1], "-v/--val-every must not be negative"),
    (["-s", 1, "-g", 1], "-g 1 generates no token"),
], ids=["negative-lr", "nan-lr", "bad-block", "negative-seed", "negative-warmup",
        "no-val-batches", "negative-val-every", "empty-sample"])
def test_bad_values_are_refused_before_allocation(data, flags, needle):
    refused_before_work(*run_train(tiny(data) + flags), needle)


def test_a_benchmark_without_timed_steps_is_refused(data):
    # it ran the warm-up, then stopped with a traceback from min() of no times
    refused_before_work(*run_train(tiny(data, steps=0) + ["--benchmark"]), "--benchmark needs --steps >= 1")


def test_a_benchmark_with_a_log_is_refused(data, tmp_path):
    # -o was accepted and silently left unwritten
    log = tmp_path / "bench.log"
    refused_before_work(*run_train(tiny(data, steps=2) + ["--benchmark", "-o", log]), "--benchmark writes no log")
    assert not log.exists()


def test_a_sample_longer_than_the_context_is_announced_once(data):
    argv = ["--init", "d1", "-b", 1, "-t", 16, "-v", 0, "-s", 1, "-g", 300, "--steps", 1] + data
    rc, out, err = run_train(argv)
    assert rc == 0, err
    assert out.count("note: -g 300 is longer than -t 16: each sample stops at 16 tokens") == 1, out


def test_sample_refuses_a_negative_token_count(capsys):
    from llmcupy import sample

    with pytest.raises(SystemExit) as exc:
        sample.main(["--init", "d1", "-n", "-3"])
    assert exc.value.code == 2
    assert "-n/--num-tokens must not be negative (got -3)" in capsys.readouterr().err


def test_sample_refuses_the_seed_xorshift_cannot_leave(capsys):
    # --seed 0 sampled token 0 every time (xorshift's zero state stays zero): empty-looking output, exit 0
    from llmcupy import sample

    for seed in ("0", str(2**64)):
        with pytest.raises(SystemExit) as exc:
            sample.main(["--init", "d1", "-n", "3", "--seed", seed])
        assert exc.value.code == 2
        assert f"--seed {seed}: xorshift's state 0 never changes" in capsys.readouterr().err


def test_ctrl_c_during_a_step_says_which_saved_state_resumes(data, tmp_path, monkeypatch):
    # it said only "interrupted"; the user had to guess whether (and where) a state was saved
    from llmcupy.model import GPT2

    real = GPT2.train_step

    def step(self, x, y, lr, b1, b2, eps, wd, t):
        if t == 3:
            raise KeyboardInterrupt   # as Ctrl-C inside the step
        return real(self, x, y, lr, b1, b2, eps, wd, t)

    monkeypatch.setattr(GPT2, "train_step", step)
    state = tmp_path / "st.npz"
    rc, out, err = run_train(tiny(data, steps=5) + ["--save-every", 2, "--save-path", state])
    assert rc == 130, out + err
    assert f"interrupted during step 3 (the last state saved is in {state}, at step 2)" in err, err
    assert ckpt.load_training_state(state).step == 2
    rc, out, err = run_train(tiny(data, steps=5))
    assert rc == 130 and "interrupted during step 3 (no training state was saved by this run)" in err, err


def test_a_tokenizer_smaller_than_the_vocabulary_is_refused_before_training(data, tmp_path):
    # it trained, then stopped at the first sample with a traceback (ValueError: invalid token id)
    from llmcupy.tokenizer import Tokenizer

    small = tmp_path / "tok300.bin"
    Tokenizer([bytes([i % 256]) for i in range(300)], eot_id=299).save(small)
    argv = ["--init", "d1", "-b", 1, "-t", 16, "-v", 0, "-s", 1, "-g", 8, "--steps", 2, "--tokenizer", small] + data
    refused_before_work(*run_train(argv), f"{small}: the tokenizer has 300 tokens, fewer than the model's "
                                          "vocabulary of 50257")


def test_a_model_without_the_start_token_is_refused_before_training_and_sampling(tmp_path, capsys):
    # a model of 300 tokens trained, then stopped at the first sample with "input token id 50256 at
    # (0, 0) is outside the vocabulary [0, 300)" (samples start from <|endoftext|>); sample said the same
    from llmcupy import sample
    from llmcupy.config import GPT2Config, init_params

    cfg = GPT2Config(max_seq_len=64, vocab_size=300, num_layers=1, num_heads=2, channels=64)
    model = tmp_path / "v300.bin"
    ckpt.write_model(model, cfg, init_params(cfg))
    tokens = tmp_path / "t300.bin"
    write_tokens(tokens, np.random.default_rng(0).integers(0, 300, 400))
    expected = (f"{model}: the model's vocabulary has 300 tokens, without <|endoftext|> (id 50256), which "
                "starts every sample")
    argv = ["-e", model, "-b", 1, "-t", 16, "-v", 0, "-s", 1, "--steps", 2, "-i", tokens]
    refused_before_work(*run_train(argv), expected, "-s 0")
    rc, out, err = run_train(argv[:-6] + ["-s", 0, "--steps", 1, "-i", tokens])   # no samples: it trains
    assert rc == 0 and "step    1/1" in out, err
    assert sample.main(["-e", str(model), "-n", "2", "-t", "8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {expected}") and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("where,value", [("rng", "x"), ("rng", [1, 2]), ("train", None), ("B", "x"), ("B", []),
                                         ("shard_indices", 10**20)])
def test_resuming_a_state_with_damaged_metadata_is_one_line(data, tmp_path, where, value):
    # valid JSON with a wrong value in it ended in an AttributeError, ValueError, TypeError or
    # OverflowError traceback
    state = tmp_path / "st.npz"
    assert run_train(tiny(data) + ["--save-path", state])[0] == 0
    st = ckpt.load_training_state(state)
    if where == "rng":
        st.rng = value
    elif where == "train":
        st.loaders["train"] = value
    else:
        st.loaders["train"][where] = value
    damaged = tmp_path / "damaged.npz"
    ckpt.save_training_state(damaged, st)
    argv = ["--resume", damaged, "-v", 0, "-s", 0, "--steps", 3] + data
    refused_before_work(*run_train(argv), f"error: {damaged}: ")


def test_a_failed_save_names_the_file_and_the_state_left(data, tmp_path, monkeypatch):
    # a full disk said only "error: No space left on device": no file, no word on the last good state
    import errno

    real, calls = ckpt.save_training_state, []

    def full_disk(path, state):
        calls.append(state.step)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, state)

    monkeypatch.setattr(ckpt, "save_training_state", full_disk)
    state = tmp_path / "st.npz"
    rc, out, err = run_train(tiny(data, steps=3) + ["--save-every", 1, "--save-path", state])
    assert rc == 2, out + err
    assert (f"--save-path {state}: saving the training state at step 2 failed (No space left on device); "
            f"the last state saved is in {state}, at step 1") in err, err
    assert ckpt.load_training_state(state).step == 1


def test_a_full_disk_during_the_write_itself_names_the_file_once(data, tmp_path, monkeypatch):
    # the write (not the whole save) fails: atomic_write names the file, which the message names already
    import errno

    real, calls = np.savez, []

    def full_disk(f, **arrays):
        calls.append(1)
        if len(calls) == 2:
            f.write(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        real(f, **arrays)

    monkeypatch.setattr(np, "savez", full_disk)
    state = tmp_path / "st.npz"
    rc, out, err = run_train(tiny(data, steps=3) + ["--save-every", 1, "--save-path", state])
    assert rc == 2, out + err
    assert (f"error: --save-path {state}: saving the training state at step 2 failed (No space left on "
            f"device); the last state saved is in {state}, at step 1") in err, err
    assert ckpt.load_training_state(state).step == 1
    assert [p.name for p in tmp_path.iterdir()] == ["st.npz"]   # no temporary left behind


def test_help_says_what_the_flags_take():
    # -e's help named only an llm.c .bin (it takes a training state too), -s did not say 0 turns
    # samples off, and --benchmark did not say how many steps it times by default
    from llmcupy.train import build_parser

    text = " ".join(build_parser().format_help().split())
    assert "llm.c model .bin, or a training state .npz (its model only), to start from" in text
    assert "generate a sample every N steps (0: no samples)" in text
    assert "over --steps steps (default 10)" in text


def test_sample_says_when_it_changes_the_context_window(capsys, tmp_path):
    # -t 6 ran with a window of 4 without a word (-n 0: the window is set up, no bytes are sampled)
    import gen_inputs
    from llmcupy import sample

    bpe = gen_inputs.write_tiny_bpe(tmp_path / "tiny.tiktoken")
    assert sample.main(["--init", "d1", "-n", "0", "-t", "6", "--bpe", str(bpe)]) == 0
    assert "note: -t 6 is not a multiple of 4" in capsys.readouterr().err
    assert sample.main(["--init", "d1", "-n", "0", "-t", "8", "--bpe", str(bpe)]) == 0
    assert "note" not in capsys.readouterr().err


def test_sample_runs_the_window_its_tokens_need_and_samples_the_same_tokens(monkeypatch, capsys):
    # every token ran a forward pass over the model's whole context (1024 positions for GPT-2: about
    # 45 s a token in the emulator) though a short sample reads a few; causal attention makes the
    # positions after the last real token irrelevant, so the short window gives the same tokens
    from llmcupy import sample
    from llmcupy.config import GPT2Config, init_params
    from llmcupy.model import GPT2

    cfg = GPT2Config.preset("d1")
    params = init_params(cfg, seed=3)
    widths = []
    real_forward = GPT2.forward
    monkeypatch.setattr(GPT2, "forward", lambda self, batch, *a, **k: widths.append(batch.shape[1]) or
                        real_forward(self, batch, *a, **k))
    context = [sample.EOT, 464, 3290, 11]   # 4 tokens, then 6 more: the last pass reads 9
    short = sample.generate(cfg, params, context, 6, None, 1337, None)
    assert set(widths) == {12}   # 9, up to a multiple of 4 (the attention softmax's need)
    widths.clear()
    assert sample.generate(cfg, params, context, 6, cfg.max_seq_len, 1337, None) == short
    assert set(widths) == {cfg.max_seq_len}
    widths.clear()
    sample.generate(cfg, params, [sample.EOT] * 250, 10, None, 1337, None)   # past the context: the model's
    assert set(widths) == {cfg.max_seq_len}
    capsys.readouterr()


def test_sample_says_when_the_prompt_is_longer_than_the_context_window(capsys, tmp_path):
    # a prompt of more tokens than the window was cut to its last T tokens without a word
    import gen_inputs
    from llmcupy import sample

    bpe = gen_inputs.write_tiny_bpe(tmp_path / "tiny.tiktoken")
    argv = ["--init", "d1", "-n", "0", "-t", "8", "--bpe", str(bpe)]
    assert sample.main(argv + ["--prompt", " ROMEO" * 7]) == 0   # 8 tokens with the leading <|endoftext|>
    assert "note" not in capsys.readouterr().err
    assert sample.main(argv + ["--prompt", " ROMEO" * 9]) == 0
    assert capsys.readouterr().err == ("note: the prompt is 10 tokens (with the leading <|endoftext|>), more than the "
                                       "context window of 8; the model sees only its last 8\n")


def test_sample_refuses_a_prompt_that_is_not_utf8(capsys):
    # a Latin-1 "café" from the shell reaches Python as a surrogate escape, and tiktoken turned it
    # into U+FFFD: the model continued "caf\ufffd" without a word
    from llmcupy import sample

    with pytest.raises(SystemExit) as exc:
        sample.main(["--init", "d1", "-n", "1", "--prompt", b"caf\xe9 au lait".decode("utf-8", "surrogateescape")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].endswith("--prompt: byte 0xe9 at character 3 is not UTF-8; give the text in UTF-8 "
                                         "(a terminal or file in another encoding sends other bytes)"), err


def test_sample_stops_at_endoftext_when_asked(capsysbinary, monkeypatch, tmp_path):
    # after <|endoftext|> the model starts an unrelated document; -n tokens were always generated,
    # so text out of a model ran on into the next one. --stop-at-eot ends the sample there; without
    # it the sampler keeps llm.c's rule (print the marker, go on). No tokenizer: token ids are printed.
    from llmcupy import sample
    from llmcupy import tokenizer as tk

    def offline(bpe_path=None):
        raise tk.TokenizerError("offline")

    monkeypatch.setattr(sample, "get_encoding", offline)
    monkeypatch.chdir(tmp_path)   # no gpt2_tokenizer.bin
    draws = iter([11, 50256, 13, 14])
    monkeypatch.setattr(sample, "sample_mult", lambda logits, coin: next(draws))
    assert sample.main(["--init", "d1", "-n", "4", "-t", "8", "--stop-at-eot"]) == 0
    out, err = capsysbinary.readouterr()
    assert out == b"11 \n" and b"note: <|endoftext|> after 1 token; stopped (--stop-at-eot)" in err, (out, err)
    draws = iter([11, 50256, 13, 14])
    assert sample.main(["--init", "d1", "-n", "4", "-t", "8"]) == 0
    assert capsysbinary.readouterr()[0] == b"11 50256 13 14 \n"


def test_sample_runs_offline_without_a_prompt(capsysbinary, tmp_path, monkeypatch):
    # Without a prompt nothing needs tiktoken's encoder, yet offline without --bpe the run stopped
    # with exit 2. Now it decodes with gpt2_tokenizer.bin if present (as the trainer does), else prints
    # token ids with a note; a prompt still needs the encoder and says so. (The tiny BPE's tokens are
    # not UTF-8, hence bytes.)
    import gen_inputs
    from llmcupy import sample
    from llmcupy import tokenizer as tk

    def offline(bpe_path=None):
        if bpe_path is None:
            raise tk.TokenizerError("cannot load tiktoken's GPT-2 encoding (offline)")
        return tk.encoding_from_file(bpe_path)

    def captured():
        out, err = capsysbinary.readouterr()
        return out, err.decode()

    monkeypatch.setattr(sample, "get_encoding", offline)
    monkeypatch.delenv(tk.BPE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert sample.main(["--init", "d1", "-n", "3", "-t", "8"]) == 0
    out, err = captured()
    assert "note: no tokenizer" in err and "printing token ids" in err
    assert len(out.split()) == 3 and all(t.isdigit() for t in out.split())

    assert sample.main(["--init", "d1", "-n", "3", "-t", "8", "--prompt", "hi"]) == 2
    assert "cannot load tiktoken's GPT-2 encoding" in captured()[1]

    bpe = gen_inputs.write_tiny_bpe(tmp_path / "tiny.tiktoken")
    tk.write_tokenizer(tmp_path / "gpt2_tokenizer.bin", tk.encoding_from_file(bpe))
    assert sample.main(["--init", "d1", "-n", "3", "-t", "8"]) == 0
    out, err = captured()
    assert "note" not in err and out.endswith(b"\n")
    with_file = out
    # the same tokens as decoding with the encoding itself: the table came from the file
    assert sample.main(["--init", "d1", "-n", "3", "-t", "8", "--bpe", str(bpe)]) == 0
    assert captured()[0] == with_file

    # a tokenizer file the user names must load; a short one is refused before sampling
    (tmp_path / "bad.bin").write_bytes(b"\0" * 10)
    assert sample.main(["--init", "d1", "-n", "3", "-t", "8", "--tokenizer", str(tmp_path / "bad.bin")]) == 2
    assert "bad.bin" in captured()[1]
