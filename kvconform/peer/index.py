"""Where a release's source distribution lives, read off the package index's simple page.

The simple repository API is the index's plainest answer to "which files does
project X have": one page per project listing every file with its address and
its digest. PEP 691 serves it as JSON (``application/vnd.pypi.simple.v1+json``),
PEP 503 as HTML, one ``<a>`` per file whose ``href`` ends in
``#sha256=<hex>``. :func:`parse_simple_page` reads either, so a mirror that
serves only HTML works as well as PyPI. :func:`sdist_of` picks the one
``vllm-X.tar.gz`` of a version, refusing a yanked file or one without a sha256
(a download that cannot be checked is not used).

The index is ``$KVCONFORM_PEER_INDEX`` when set, else PyPI's.
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit, urlunsplit

from kvconform.errors import UsageError, VllmUnavailable

DEFAULT_INDEX = "https://pypi.org/simple/"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"
_ACCEPT = f"{JSON_TYPE}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"


@dataclass(frozen=True)
class IndexFile:
    """One file of a project as the simple page lists it."""

    filename: str
    url: str
    sha256: str | None
    yanked: bool = False


def index_url() -> str:
    return os.environ.get("KVCONFORM_PEER_INDEX") or DEFAULT_INDEX


def project_page_url(project: str, index: str | None = None) -> str:
    base = index or index_url()
    normalized = re.sub(r"[-_.]+", "-", project).lower()  # PEP 503's normalized name
    return urljoin(base if base.endswith("/") else base + "/", f"{normalized}/")


def fetch_simple_page(
    project: str, index: str | None = None, timeout: float = 60
) -> list[IndexFile]:
    """Every file the index lists for ``project`` (one request)."""
    url = project_page_url(project, index)
    request = urllib.request.Request(url, headers={"Accept": _ACCEPT})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            content_type = response.headers.get("Content-Type", "")
            body = response.read()
            final_url = response.geturl()
    except OSError as exc:
        raise VllmUnavailable("?", f"the package index's page {url}", str(exc)) from None
    return parse_simple_page(body.decode("utf-8"), content_type, final_url)


def parse_simple_page(text: str, content_type: str, page_url: str) -> list[IndexFile]:
    """The files of one simple page, JSON (PEP 691) or HTML (PEP 503); addresses made absolute."""
    if content_type.split(";")[0].strip() == JSON_TYPE or text.lstrip().startswith("{"):
        data = json.loads(text)
        return [
            IndexFile(
                filename=entry["filename"],
                url=urljoin(page_url, entry["url"]),
                sha256=(entry.get("hashes") or {}).get("sha256"),
                yanked=bool(entry.get("yanked")),
            )
            for entry in data.get("files", [])
        ]
    parser = _Anchors()
    parser.feed(text)
    files = []
    for href, attributes, label in parser.anchors:
        absolute = urljoin(page_url, href)
        parts = urlsplit(absolute)
        digest = None
        match = re.fullmatch(r"sha256=([0-9a-fA-F]{64})", parts.fragment)
        if match:
            digest = match.group(1).lower()
        url = urlunsplit(parts._replace(fragment=""))
        name = label.strip() or parts.path.rsplit("/", 1)[-1]
        files.append(IndexFile(name, url, digest, "data-yanked" in attributes))
    return files


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.anchors: list[tuple[str, dict[str, str | None], str]] = []
        self._open: tuple[str, dict[str, str | None]] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            attributes = dict(attrs)
            self._open = (attributes.get("href") or "", attributes)
            self._text = []

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._open is not None:
            href, attributes = self._open
            if href:
                self.anchors.append((href, attributes, "".join(self._text)))
            self._open = None


def sdist_of(files: list[IndexFile], version: str, project: str = "vllm") -> IndexFile:
    """The source distribution ``<project>-<version>.tar.gz`` among ``files``."""
    wanted = {f"{project}-{version}.tar.gz", f"{project.replace('-', '_')}-{version}.tar.gz"}
    found = [f for f in files if f.filename in wanted]
    if not found:
        raise UsageError(f"the package index lists no {project}-{version}.tar.gz")
    sdist = found[0]
    if sdist.yanked:
        raise UsageError(f"{sdist.filename} is yanked on the package index")
    if not sdist.sha256:
        raise VllmUnavailable(version, f"a sha256 for {sdist.filename} on the package index")
    return sdist
