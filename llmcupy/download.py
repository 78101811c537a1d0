"""python -m llmcupy.download: fetch the public files the trainer starts from.

CLI::

    python -m llmcupy.download {gpt2,tinyshakespeare} [--out DIR] [--base-url URL] [--force] [--quiet]

* ``tinyshakespeare``: the raw corpus (char-rnn's ``input.txt``) -> ``DIR/tinyshakespeare.txt``
  (default ``DIR`` = ``data/tinyshakespeare``), sha256-checked.
* ``gpt2``: Hugging Face's ``openai-community/gpt2`` ``model.safetensors`` (GPT-2 124M,
  548,105,171 bytes) at the pinned revision ``607a30d783dfa663caf39e06633721c8d4cfcd7e``, sha256-checked
  against that revision's LFS hash -> ``DIR/model.safetensors`` (default ``data/gpt2``); convert it
  with ``python -m llmcupy.convert``.

Files stream to a temporary file beside the destination with a tqdm progress bar, are checked
(length against Content-Length, sha256) and only then renamed into place; a failed or interrupted
download, or one with the wrong sha256 (a mirror's HTML error page, a truncated or different copy),
leaves no file and keeps a file already there. A present file is kept if its sha256 matches (hashing
the ~548 MB weights takes a second or two) and downloaded again if not; ``--force`` always downloads.

Mirrors and tests: ``--base-url URL`` or the environment variable ``LLMCUPY_DOWNLOAD_BASE`` replace
every file's public URL by ``URL/<last path component of the public URL>`` (``input.txt``,
``model.safetensors``), e.g. a folder served with ``python -m http.server``; a mirror's files must
have the same sha256 as the public ones.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from .fileio import atomic_write

BASE_ENV = "LLMCUPY_DOWNLOAD_BASE"


class DownloadError(RuntimeError):
    """A download failed: unreachable host, HTTP error, short body or wrong checksum."""


class Unreachable(DownloadError):
    """The host cannot be reached (offline, no DNS, refused): the file may be fetched by hand."""


@dataclass(frozen=True)
class RemoteFile:
    url: str
    filename: str                 # name in the output folder
    sha256: str | None = None     # None: not known, not checked

    @property
    def remote_name(self) -> str:
        return urllib.parse.urlsplit(self.url).path.rsplit("/", 1)[-1]


GPT2_REVISION = "607a30d783dfa663caf39e06633721c8d4cfcd7e"   # openai-community/gpt2 on Hugging Face

SOURCES: dict[str, tuple[RemoteFile, ...]] = {
    "tinyshakespeare": (
        RemoteFile("https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
                   "tinyshakespeare.txt",
                   "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"),
    ),
    "gpt2": (
        # pinned to one revision of the repository ("main" could move), checked against the sha256
        # of that revision's LFS object (548,105,171 bytes)
        RemoteFile(f"https://huggingface.co/openai-community/gpt2/resolve/{GPT2_REVISION}/model.safetensors",
                   "model.safetensors",
                   "248dfc3911869ec493c76e65bf2fcf7f615828b0254c12b473182f0f81d3a707"),
    ),
}
DEFAULT_OUT = {"tinyshakespeare": os.path.join("data", "tinyshakespeare"), "gpt2": os.path.join("data", "gpt2")}


def sha256_of(path, chunk_size: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            h.update(chunk)
    return h.hexdigest()


def resolve_url(remote: RemoteFile, base_url: str | None = None) -> str:
    """The URL to fetch: the public one, or ``base/<remote name>`` with a base URL (argument, else
    $LLMCUPY_DOWNLOAD_BASE)."""
    base = base_url or os.environ.get(BASE_ENV)
    if not base:
        return remote.url
    return base.rstrip("/") + "/" + remote.remote_name


def download_file(url: str, dest, *, sha256: str | None = None, progress: bool | None = True,
                  timeout: float = 60.0, chunk_size: int = 1 << 20, desc: str | None = None) -> Path:
    """Streams ``url`` into ``dest`` (atomically), checking the length and the sha256 if given."""
    dest = Path(dest)
    request = urllib.request.Request(url, headers={"User-Agent": "llmcupy-download"})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as e:
        raise DownloadError(f"download of {url} failed: HTTP {e.code} {e.reason}") from e
    except urllib.error.URLError as e:
        reason = getattr(e.reason, "strerror", None) or e.reason
        raise Unreachable(f"cannot reach {url}: {reason} (offline? use --base-url or {BASE_ENV} "
                          f"to point at a mirror, or download the file by hand)") from e
    except (OSError, http.client.HTTPException) as e:
        raise DownloadError(f"cannot download {url}: {e}") from e
    with response:
        length = response.headers.get("Content-Length")
        total = int(length) if length and length.isdigit() else None
        digest = hashlib.sha256()
        received = 0
        with atomic_write(dest) as f, tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024,
                                           desc=desc or dest.name,
                                           # progress None: a bar only on a terminal (no \r clutter in logs)
                                           disable=None if progress is None else not progress) as bar:
            while True:
                try:
                    chunk = response.read(chunk_size)
                except (OSError, http.client.HTTPException) as e:
                    raise DownloadError(f"download of {url} broke off after {received} bytes: {e}") from e
                if not chunk:
                    break
                f.write(chunk)
                digest.update(chunk)
                received += len(chunk)
                bar.update(len(chunk))
            if total is not None and received != total:
                raise DownloadError(f"download of {url} is incomplete: {received} of {total} bytes")
            if sha256 is not None and digest.hexdigest() != sha256.lower():
                raise DownloadError(f"checksum mismatch for {url}: sha256 {digest.hexdigest()}, "
                                    f"expected {sha256.lower()}; nothing was written")
    return dest


def download(name: str, out_dir=None, *, base_url: str | None = None, progress: bool | None = True,
             force: bool = False, log=print) -> list[Path]:
    """Fetches the files of ``name`` ("gpt2" or "tinyshakespeare") into ``out_dir``."""
    if name not in SOURCES:
        raise ValueError(f"unknown download {name!r}; choose one of {', '.join(sorted(SOURCES))}")
    out = Path(out_dir if out_dir is not None else DEFAULT_OUT[name])
    paths = []
    for remote in SOURCES[name]:
        dest = out / remote.filename
        if dest.is_dir():   # the sha256 check, then the save, would fail on it with "is a folder; give a file"
            raise DownloadError(f"{dest} is a folder where the download goes; remove it, or give another --out")
        if dest.exists() and not force:
            if remote.sha256 is None:
                log(f"{dest} already present (not checked: no known sha256; --force downloads again)")
                paths.append(dest)
                continue
            # hashing the GPT-2 weights (~548 MB) takes a second or two: say so before it starts
            log(f"{dest} is present: checking its sha256 ({dest.stat().st_size / 1e6:.1f} MB) ...")
            if sha256_of(dest) == remote.sha256:
                log(f"{dest} already present, sha256 ok")
                paths.append(dest)
                continue
            log(f"{dest} is present but its sha256 does not match: downloading again")
        url = resolve_url(remote, base_url)
        log(f"downloading {url} -> {dest}")
        paths.append(download_file(url, dest, sha256=remote.sha256, progress=progress, desc=remote.filename))
    return paths


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmcupy.download",
                                     description="Download GPT-2 weights or the Tiny Shakespeare text.")
    parser.add_argument("name", choices=sorted(SOURCES))
    parser.add_argument("--out", metavar="DIR",
                        help="output folder (default data/<name>, relative to the current folder)")
    parser.add_argument("--base-url", metavar="URL",
                        help=f"fetch URL/<file name> instead of the public URL (or set {BASE_ENV})")
    parser.add_argument("--force", action="store_true", help="download even if the file is present")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    from .fileio import output_folder_problem

    out = args.out if args.out is not None else DEFAULT_OUT[args.name]
    problem = output_folder_problem(out)
    if problem:   # before the download, not after it
        print(f"error: --out {out}: {problem}", file=sys.stderr)
        return 2
    try:
        download(args.name, args.out, base_url=args.base_url, progress=False if args.quiet else None,
                 force=args.force)
    except (DownloadError, OSError) as e:
        from ._cli import fail

        return fail(e)   # a failed download or an unwritable folder: 2
    return 0


if __name__ == "__main__":
    from llmcupy._cli import run_main

    sys.exit(run_main(main))
