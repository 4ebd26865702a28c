"""kvconform.peer's fetching: the index's simple page, the sha256 check, a resumed download,
and an unpack that keeps only tests/ and pyproject.toml."""

from __future__ import annotations

import hashlib
import http.server
import io
import tarfile
import threading
from collections.abc import Iterator

import pytest

from kvconform.errors import UsageError, VllmUnavailable
from kvconform.peer import fetch
from kvconform.peer.index import IndexFile, parse_simple_page, project_page_url, sdist_of

SHA = "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112"

JSON_PAGE = """{"meta": {"api-version": "1.1"}, "name": "vllm", "files": [
 {"filename": "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
  "url": "https://files.example/8b/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
  "hashes": {"sha256": "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa"}},
 {"filename": "vllm-0.33.0.tar.gz", "url": "../../packages/f7/25/vllm-0.33.0.tar.gz",
  "hashes": {"sha256": "SHA"}, "yanked": false},
 {"filename": "vllm-0.32.0.tar.gz", "url": "https://files.example/vllm-0.32.0.tar.gz",
  "hashes": {}, "yanked": "broken build"}
]}""".replace("SHA", SHA)

HTML_PAGE = f"""<!DOCTYPE html><html><body><h1>Links for vllm</h1>
<a href="https://files.example/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl#sha256={"0" * 64}"
   data-requires-python="&lt;3.15,&gt;=3.11">vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl</a><br/>
<a href="../../packages/f7/25/vllm-0.33.0.tar.gz#sha256={SHA}">vllm-0.33.0.tar.gz</a><br/>
<a href="https://files.example/vllm-0.32.0.tar.gz#sha256={"1" * 64}" data-yanked="">vllm-0.32.0.tar.gz</a>
</body></html>"""

PAGE_URL = "https://pypi.example/simple/vllm/"


@pytest.mark.parametrize(
    ("text", "content_type"),
    [(JSON_PAGE, "application/vnd.pypi.simple.v1+json"), (HTML_PAGE, "text/html; charset=utf-8")],
    ids=["pep691-json", "pep503-html"],
)
def test_the_simple_page_gives_the_sdist_its_address_and_digest(text, content_type):
    files = parse_simple_page(text, content_type, PAGE_URL)
    assert len(files) == 3
    sdist = sdist_of(files, "0.33.0")
    assert sdist.filename == "vllm-0.33.0.tar.gz"
    assert sdist.url == "https://pypi.example/packages/f7/25/vllm-0.33.0.tar.gz"  # made absolute
    assert sdist.sha256 == SHA
    assert not sdist.yanked


@pytest.mark.parametrize(
    ("text", "content_type"),
    [(JSON_PAGE, "application/vnd.pypi.simple.v1+json"), (HTML_PAGE, "text/html")],
    ids=["pep691-json", "pep503-html"],
)
def test_a_yanked_or_missing_sdist_is_refused(text, content_type):
    files = parse_simple_page(text, content_type, PAGE_URL)
    with pytest.raises(UsageError, match="yanked"):
        sdist_of(files, "0.32.0")
    with pytest.raises(UsageError, match="no vllm-0.31.0.tar.gz"):
        sdist_of(files, "0.31.0")


def test_an_sdist_without_a_digest_is_not_used():
    files = [IndexFile("vllm-0.33.0.tar.gz", "https://x/vllm-0.33.0.tar.gz", None)]
    with pytest.raises(VllmUnavailable, match="sha256"):
        sdist_of(files, "0.33.0")


def test_the_project_page_address_uses_the_normalized_name():
    assert project_page_url("Foo_Bar.baz", "https://i.example/simple") == (
        "https://i.example/simple/foo-bar-baz/"
    )


# -- the archive --------------------------------------------------------------------------------


def _sdist_bytes() -> bytes:
    """A small vllm-9.9.9.tar.gz laid out like the real one."""
    members = {
        "vllm-9.9.9/pyproject.toml": b"[tool.pytest.ini_options]\nmarkers = []\n",
        "vllm-9.9.9/tests/__init__.py": b"",
        "vllm-9.9.9/tests/v1/core/test_x.py": b"def test_x():\n    pass\n",
        "vllm-9.9.9/vllm/__init__.py": b"raise ImportError('the sdist vllm/ must not be used')\n",
        "vllm-9.9.9/setup.py": b"",
    }
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("vllm-9.9.9/tests/escape")
        link.type = tarfile.SYMTYPE
        link.linkname = "/etc/passwd"
        tar.addfile(link)
    return buffer.getvalue()


class _RangeHandler(http.server.BaseHTTPRequestHandler):
    """Serves one body, honouring ``Range: bytes=N-`` as a real file host does."""

    body = b""
    ranges: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - the handler's protocol
        wanted = self.headers.get("Range")
        type(self).ranges.append(wanted or "")
        start = int(wanted.split("=")[1].rstrip("-")) if wanted else 0
        self.send_response(206 if wanted else 200)
        self.send_header("Content-Length", str(len(self.body) - start))
        self.end_headers()
        self.wfile.write(self.body[start:])

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def served() -> Iterator[tuple[str, bytes, list[str]]]:
    body = _sdist_bytes()
    handler = type("Handler", (_RangeHandler,), {"body": body, "ranges": []})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/vllm-9.9.9.tar.gz", body, handler.ranges
    finally:
        server.shutdown()


def test_a_download_resumes_from_its_part_file_and_is_checked(tmp_path, served):
    url, body, ranges = served
    entry = IndexFile("vllm-9.9.9.tar.gz", url, hashlib.sha256(body).hexdigest())
    (tmp_path / "vllm-9.9.9.tar.gz.part").write_bytes(body[:100])  # an interrupted attempt
    got = fetch.download(entry, tmp_path)
    assert ranges == ["bytes=100-"]
    assert got.read_bytes() == body
    assert not (tmp_path / "vllm-9.9.9.tar.gz.part").exists()


def test_a_download_with_the_wrong_digest_is_deleted(tmp_path, served):
    url, _, _ = served
    entry = IndexFile("vllm-9.9.9.tar.gz", url, "0" * 64)
    with pytest.raises(VllmUnavailable, match="sha256"):
        fetch.download(entry, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_fetch_tests_unpacks_only_the_tests_and_pyproject(tmp_path, monkeypatch, served):
    monkeypatch.setenv("KVCONFORM_CACHE", str(tmp_path / "cache"))
    url, body, _ = served
    entry = IndexFile("vllm-9.9.9.tar.gz", url, hashlib.sha256(body).hexdigest())
    suite = fetch.fetch_tests("9.9.9", find=lambda version: entry)
    assert suite == tmp_path / "cache" / "peer" / "9.9.9" / "suite"
    kept = sorted(p.relative_to(suite).as_posix() for p in suite.rglob("*") if p.is_file())
    assert kept == [".complete", "pyproject.toml", "tests/__init__.py", "tests/v1/core/test_x.py"]
    assert not (suite / "vllm").exists()  # it would shadow the installed, compiled vLLM
    assert not (suite.parent / "download" / "vllm-9.9.9.tar.gz").exists()  # not kept

    def refuse(version: str) -> IndexFile:
        raise AssertionError("a cached suite is not fetched again")

    assert fetch.fetch_tests("9.9.9", find=refuse) == suite
