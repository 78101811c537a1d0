"""Downloads against a local HTTP server (no internet needed)."""

import dataclasses
import functools
import hashlib
import http.server
import os
import shutil
import socket
import threading
from pathlib import Path

import numpy as np
import pytest

import gen_inputs

from llmcupy import download as dl
from llmcupy.download import DownloadError

# the README's optional real-data checks: LLMCUPY_TEST_DATA names the folder (as in test_data.py; this
# file ignored it, so its two checks skipped in every checkout not placed beside a shared/data)
SHARED_DATA = Path(os.environ.get("LLMCUPY_TEST_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")
TEXT = SHARED_DATA / "tinyshakespeare.txt"
BPE = SHARED_DATA / "gpt2.tiktoken"


class _Handler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep test output clean
        pass

    def do_GET(self):
        self.server.requests.append(self.path)
        if self.path == "/short.bin":  # promises more bytes than it sends
            self.send_response(200)
            self.send_header("Content-Length", "1000")
            self.end_headers()
            self.wfile.write(b"x" * 100)
            self.wfile.flush()
            self.close_connection = True
            return
        super().do_GET()


@pytest.fixture
def server(tmp_path, monkeypatch):
    """Serves tmp_path/'srv' on 127.0.0.1 at a free port; yields (base_url, folder, requests)."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv(dl.BASE_ENV, raising=False)
    root = tmp_path / "srv"
    root.mkdir()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, directory=str(root)))
    httpd.requests = []
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", root, httpd.requests
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _payload(n=300_000):
    return np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8).tobytes()


def test_download_file_with_progress(server, tmp_path, capsys):
    base, root, requests = server
    data = _payload()
    (root / "blob.bin").write_bytes(data)
    dest = tmp_path / "out" / "blob.bin"
    got = dl.download_file(f"{base}/blob.bin", dest, sha256=hashlib.sha256(data).hexdigest(),
                           chunk_size=64 * 1024)
    assert got == dest and dest.read_bytes() == data
    err = capsys.readouterr().err
    assert "blob.bin" in err and "100%" in err and "293k" in err  # tqdm bar: name, percent, KiB total
    assert requests == ["/blob.bin"]
    assert not list(dest.parent.glob(".*.tmp"))


def test_download_file_quiet(server, tmp_path, capsys):
    base, root, _ = server
    (root / "a.txt").write_bytes(b"hello")
    dl.download_file(f"{base}/a.txt", tmp_path / "a.txt", progress=False)
    assert (tmp_path / "a.txt").read_bytes() == b"hello"
    assert capsys.readouterr().err == ""


def test_http_404(server, tmp_path):
    base, _, _ = server
    with pytest.raises(DownloadError, match=r"download of http://127\.0\.0\.1:\d+/missing\.bin failed: HTTP 404"):
        dl.download_file(f"{base}/missing.bin", tmp_path / "missing.bin", progress=False)
    assert not list(tmp_path.glob("*missing*"))


def test_connection_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("http_proxy", raising=False)
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    url = f"http://127.0.0.1:{_free_port()}/x.bin"
    with pytest.raises(DownloadError, match=r"cannot reach http://127\.0\.0\.1:\d+/x\.bin: .*[Cc]onnection refused.*--base-url"):
        dl.download_file(url, tmp_path / "x.bin", progress=False)
    assert not list(tmp_path.iterdir())


def test_checksum_mismatch_keeps_old_file(server, tmp_path):
    base, root, _ = server
    (root / "f.bin").write_bytes(b"new content")
    dest = tmp_path / "f.bin"
    dest.write_bytes(b"old content")
    with pytest.raises(DownloadError, match="checksum mismatch .* nothing was written"):
        dl.download_file(f"{base}/f.bin", dest, sha256="0" * 64, progress=False)
    assert dest.read_bytes() == b"old content"
    assert [p.name for p in tmp_path.iterdir() if p.name != "srv"] == ["f.bin"]


def test_incomplete_body(server, tmp_path):
    base, _, _ = server
    with pytest.raises(DownloadError, match="(incomplete: 100 of 1000 bytes|broke off)"):
        dl.download_file(f"{base}/short.bin", tmp_path / "short.bin", progress=False)
    assert not (tmp_path / "short.bin").exists()


def test_interrupt_leaves_nothing(server, tmp_path, monkeypatch):
    base, root, _ = server
    (root / "big.bin").write_bytes(_payload())

    class Interrupting(dl.tqdm):
        def update(self, n=1):
            raise KeyboardInterrupt

    monkeypatch.setattr(dl, "tqdm", Interrupting)
    with pytest.raises(KeyboardInterrupt):
        dl.download_file(f"{base}/big.bin", tmp_path / "big.bin", progress=False, chunk_size=1024)
    assert [p.name for p in tmp_path.iterdir()] == ["srv"]


def test_base_url_resolution(monkeypatch):
    remote = dl.SOURCES["tinyshakespeare"][0]
    monkeypatch.delenv(dl.BASE_ENV, raising=False)
    assert dl.resolve_url(remote) == remote.url
    assert remote.url.startswith("https://raw.githubusercontent.com/karpathy/char-rnn/")
    assert dl.resolve_url(remote, "http://mirror/x/") == "http://mirror/x/input.txt"
    monkeypatch.setenv(dl.BASE_ENV, "http://env-mirror")
    assert dl.resolve_url(remote) == "http://env-mirror/input.txt"
    assert dl.resolve_url(dl.SOURCES["gpt2"][0]) == "http://env-mirror/model.safetensors"


GPT2_REVISION = "607a30d783dfa663caf39e06633721c8d4cfcd7e"
GPT2_SHA256 = "248dfc3911869ec493c76e65bf2fcf7f615828b0254c12b473182f0f81d3a707"  # LFS hash at that revision


def test_gpt2_source_is_pinned():
    [remote] = dl.SOURCES["gpt2"]
    assert remote.url == (f"https://huggingface.co/openai-community/gpt2/resolve/{GPT2_REVISION}"
                          "/model.safetensors")
    assert GPT2_REVISION in remote.url and "/resolve/main/" not in remote.url
    assert remote.sha256 == GPT2_SHA256
    assert remote.remote_name == remote.filename == "model.safetensors"  # what a mirror serves


def _fake_gpt2(monkeypatch, data: bytes):
    """The gpt2 source as it is (pinned URL, file names), but expecting ``data``'s own sha256, so
    that a local server can stand in for Hugging Face without the real 548 MB file."""
    [remote] = dl.SOURCES["gpt2"]
    monkeypatch.setitem(dl.SOURCES, "gpt2",
                        (dataclasses.replace(remote, sha256=hashlib.sha256(data).hexdigest()),))


def test_gpt2_via_env_mirror_and_cli(server, tmp_path, monkeypatch, capsys):
    base, root, requests = server
    (root / "model.safetensors").write_bytes(b"fake weights")
    _fake_gpt2(monkeypatch, b"fake weights")
    monkeypatch.setenv(dl.BASE_ENV, base)
    out = tmp_path / "gpt2"
    assert dl.main(["gpt2", "--out", str(out), "--quiet"]) == 0
    assert (out / "model.safetensors").read_bytes() == b"fake weights"
    capsys.readouterr()
    assert dl.main(["gpt2", "--out", str(out), "--quiet"]) == 0  # present and checked: kept, no request
    assert requests == ["/model.safetensors"]
    logged = capsys.readouterr().out
    assert "is present: checking its sha256" in logged and "already present, sha256 ok" in logged
    assert dl.main(["gpt2", "--out", str(out), "--quiet", "--force"]) == 0
    assert len(requests) == 2
    (root / "model.safetensors").unlink()
    assert dl.main(["gpt2", "--out", str(tmp_path / "other"), "--quiet"]) == 2
    assert "HTTP 404" in capsys.readouterr().err


def test_gpt2_wrong_file_is_refused(server, tmp_path, monkeypatch, capsys):
    """A mirror serving anything but the pinned file (here an HTML error page) fails the pinned
    sha256: nothing is written, and a file already there is kept."""
    base, root, requests = server
    page = b"<!DOCTYPE html><html><body>502 Bad Gateway</body></html>"
    (root / "model.safetensors").write_bytes(page)
    out = tmp_path / "gpt2"
    assert dl.main(["gpt2", "--out", str(out), "--quiet", "--base-url", base]) == 2
    err = capsys.readouterr().err
    assert "checksum mismatch" in err and GPT2_SHA256 in err and "nothing was written" in err, err
    assert not out.exists() or not list(out.iterdir())
    # a present file with the wrong hash is fetched again; the wrong download does not replace it
    out.mkdir(exist_ok=True)
    (out / "model.safetensors").write_bytes(b"truncated weights")
    assert dl.main(["gpt2", "--out", str(out), "--quiet", "--base-url", base]) == 2
    logged = capsys.readouterr()
    assert "does not match: downloading again" in logged.out and "checksum mismatch" in logged.err
    assert [p.name for p in out.iterdir()] == ["model.safetensors"]
    assert (out / "model.safetensors").read_bytes() == b"truncated weights"
    assert requests == ["/model.safetensors"] * 2


@pytest.fixture
def shared_text():
    if not TEXT.is_file():
        pytest.skip(f"optional real-data check: set LLMCUPY_TEST_DATA to a folder holding tinyshakespeare.txt "
                    f"(not found: {TEXT})")
    return TEXT


def test_tinyshakespeare_download_checks_sha256(server, tmp_path, shared_text, capsys):
    base, root, requests = server
    shutil.copy(shared_text, root / "input.txt")
    out = tmp_path / "ts"
    [path] = dl.download("tinyshakespeare", out, base_url=base, progress=False)
    assert path == out / "tinyshakespeare.txt" and path.stat().st_size == 1115394
    assert dl.sha256_of(path) == dl.SOURCES["tinyshakespeare"][0].sha256
    dl.download("tinyshakespeare", out, base_url=base, progress=False)
    assert "already present, sha256 ok" in capsys.readouterr().out and len(requests) == 1
    path.write_bytes(b"damaged")
    dl.download("tinyshakespeare", out, base_url=base, progress=False)
    assert "does not match" in capsys.readouterr().out and len(requests) == 2
    assert dl.sha256_of(path) == dl.SOURCES["tinyshakespeare"][0].sha256
    # a mirror serving other bytes fails the check and writes nothing
    (root / "input.txt").write_bytes(b"not shakespeare")
    with pytest.raises(DownloadError, match="checksum mismatch"):
        dl.download("tinyshakespeare", tmp_path / "ts2", base_url=base, progress=False)
    assert not (tmp_path / "ts2" / "tinyshakespeare.txt").exists()


def test_data_cli_downloads_then_tokenises(server, tmp_path, shared_text, capsys):
    from llmcupy import data
    from llmcupy.data import token_count

    if not BPE.is_file():
        pytest.skip(f"optional real-data check: set LLMCUPY_TEST_DATA to a folder holding gpt2.tiktoken "
                    f"(not found: {BPE})")
    base, root, _ = server
    shutil.copy(shared_text, root / "input.txt")
    out = tmp_path / "ts"
    assert data.main(["tinyshakespeare", "--out", str(out), "--bpe", str(BPE), "--base-url", base]) == 0
    assert token_count(out / "tiny_shakespeare_val.bin") == 32768
    assert token_count(out / "tiny_shakespeare_train.bin") == 305260
    assert "downloading" in capsys.readouterr().out


def test_an_out_folder_that_is_a_file_is_refused_before_downloading(tmp_path, capsys):
    # it said only "FILE: File exists", and only after reaching the server
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert dl.main(["tinyshakespeare", "--out", str(afile), "--base-url", "http://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert f"--out {afile}: it is a file; give a folder" in err and "cannot reach" not in err, err


def test_data_cli_offline_says_to_give_a_local_copy_with_input(tmp_path, capsys, monkeypatch):
    # "download the file by hand" did not say how python -m llmcupy.data then takes it
    from llmcupy import data

    monkeypatch.delenv("http_proxy", raising=False)
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    bpe = gen_inputs.write_tiny_bpe(tmp_path / "tiny.tiktoken")
    assert data.main(["tinyshakespeare", "--out", str(tmp_path / "ts"), "--bpe", str(bpe),
                      "--base-url", f"http://127.0.0.1:{_free_port()}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot reach ") and len(err.splitlines()) == 1, err
    assert err.rstrip().endswith("by hand); then give it with --input FILE"), err


def test_a_folder_where_the_file_goes_is_named_before_downloading(tmp_path, capsys):
    # it said "checking its sha256 (0.0 MB)", then "OUT/model.safetensors is a folder; give a file"
    (tmp_path / "model.safetensors").mkdir()
    assert dl.main(["gpt2", "--out", str(tmp_path), "--base-url", "http://127.0.0.1:1"]) == 2
    out, err = capsys.readouterr()
    assert err == (f"error: {tmp_path / 'model.safetensors'} is a folder where the download goes; remove it, or "
                   "give another --out\n"), err
    assert "sha256" not in out and "downloading" not in out, out


def test_unknown_name():
    with pytest.raises(ValueError, match="unknown download"):
        dl.download("gpt3")
    with pytest.raises(SystemExit):
        dl.main(["gpt3"])
