"""vLLM's own tests, taken from the release's source distribution and cached.

The wheel on PyPI holds no tests; the source distribution ``vllm-X.tar.gz``
does. ``pip download --no-binary :all:`` would fetch it but then tries to build
it, so the archive is fetched directly from the address the index's simple
page gives (:mod:`kvconform.peer.index`). The download is resumable: bytes
land in ``vllm-X.tar.gz.part`` and a later attempt asks for the rest with an
HTTP ``Range``. The whole file is checked against the index's sha256 before
anything is unpacked; a mismatch deletes it.

Only ``tests/`` and the sdist's ``pyproject.toml`` (which holds pytest's
settings and markers) are unpacked, under ``<cache>/peer/<version>/suite/``.
The sdist's ``vllm/`` is never unpacked: beside ``tests/`` it would shadow the
installed, compiled package. Processes share one download through a file lock,
as :mod:`kvconform.harness.releases` does for wheels; ``suite/.complete``
marks a finished unpack.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from kvconform.errors import VllmUnavailable
from kvconform.paths import cache_dir
from kvconform.peer.index import IndexFile, fetch_simple_page, sdist_of

KEEP = ("tests/", "pyproject.toml")
_CHUNK = 1 << 20


def suite_dir(version: str) -> Path:
    return cache_dir("peer", version) / "suite"


def fetch_tests(version: str, find: Callable[[str], IndexFile] | None = None) -> Path:
    """The folder holding ``tests/`` and ``pyproject.toml`` of vLLM ``version``'s sdist.

    Downloads and unpacks once; later calls (and other processes) find it cached.
    ``find`` maps a version to its sdist's index entry (tests pass a canned one).
    """
    root = cache_dir("peer", version)
    target = root / "suite"
    with open(root / ".fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / ".complete").exists():
            return target
        entry = (find or _from_index)(version)
        archive = download(entry, root / "download")
        with tempfile.TemporaryDirectory(dir=root, prefix=".unpack-") as tmp:
            staging = Path(tmp) / "suite"
            unpack(archive, staging)
            (staging / ".complete").write_text(f"{entry.filename} sha256={entry.sha256}\n")
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
        archive.unlink()  # 47 MB: the unpacked tests are what is kept
    return target


def _from_index(version: str) -> IndexFile:
    return sdist_of(fetch_simple_page("vllm"), version)


def download(entry: IndexFile, folder: Path, timeout: float = 120) -> Path:
    """``entry``'s file in ``folder``, resumed from a ``.part`` file, its sha256 checked."""
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / entry.filename
    if final.exists() and sha256_of(final) == entry.sha256:
        return final
    part = folder / (entry.filename + ".part")
    have = part.stat().st_size if part.exists() else 0
    headers = {"Range": f"bytes={have}-"} if have else {}
    request = urllib.request.Request(entry.url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            resumed = have > 0 and response.status == 206
            with open(part, "ab" if resumed else "wb") as out:
                while chunk := response.read(_CHUNK):
                    out.write(chunk)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # nothing left to send: the .part is whole (or wrong)
            pass
        else:
            raise VllmUnavailable("?", entry.url, f"HTTP {exc.code}") from None
    except OSError as exc:
        raise VllmUnavailable("?", entry.url, f"{exc} (a later call resumes)") from None
    got = sha256_of(part)
    if got != entry.sha256:
        part.unlink()
        raise VllmUnavailable(
            "?", f"a verified {entry.filename}", f"sha256 {got} != the index's {entry.sha256}"
        )
    part.rename(final)
    return final


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def unpack(archive: Path, target: Path) -> None:
    """Only ``tests/`` and ``pyproject.toml`` of the sdist, its top folder stripped."""
    target.mkdir(parents=True)
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar:
            parts = PurePosixPath(member.name).parts
            if len(parts) < 2:
                continue
            inner = "/".join(parts[1:])
            if not (inner == KEEP[1] or inner.startswith(KEEP[0])):
                continue
            if not (member.isfile() or member.isdir()):
                continue  # no links or devices from an archive
            member.name = inner
            tar.extract(member, target, filter="data")
