"""The PyPI releases of vLLM, in version order, from pip's own index view.

``pip index versions vllm`` asks the index pip is configured for (a mirror, an
extra index), so a bisection sees the releases the user can install. The list
is cached for a day in ``~/.cache/kvconform/bisect/vllm-releases.json``; when
pip cannot reach its index, a stale cached list is used and said so.
Pre-releases and development releases are left out unless asked for.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from packaging.version import InvalidVersion, Version

from kvconform.errors import UsageError
from kvconform.paths import cache_dir

PACKAGE = "vllm"
MAX_AGE_S = 24 * 3600


def _cache_file() -> Path:
    return cache_dir("bisect") / f"{PACKAGE}-releases.json"


def query_index() -> list[str]:
    """Every version pip's index offers (pre-releases included), unordered."""
    base = [sys.executable, "-m", "pip", "index", "versions", PACKAGE, "--pre"]
    base += ["--disable-pip-version-check"]
    done = subprocess.run([*base, "--json"], capture_output=True, text=True)
    if done.returncode == 0:
        try:
            return list(json.loads(done.stdout)["versions"])
        except (ValueError, KeyError):
            pass
    done = subprocess.run(base, capture_output=True, text=True)  # pip without --json
    match = re.search(r"Available versions:\s*(.+)", done.stdout)
    if done.returncode != 0 or not match:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise UsageError(
            f"cannot list {PACKAGE} releases: `pip index versions {PACKAGE}` failed"
            + (f": {lines[-1]}" if lines else "")
        )
    return [v.strip() for v in match.group(1).split(",") if v.strip()]


def list_releases(
    refresh: bool = False,
    say: Callable[[str], None] = print,
    query: Callable[[], list[str]] = query_index,
) -> list[str]:
    """Every version on the index, oldest first, from the cache when it is recent."""
    path = _cache_file()
    cached = None
    try:
        cached = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    if cached and not refresh and time.time() - cached.get("fetched", 0) < MAX_AGE_S:
        return ordered(cached["versions"])
    try:
        versions = query()
    except UsageError:
        if not cached:
            raise
        say(f"note: pip's index is unreachable; using the release list cached at {path}")
        return ordered(cached["versions"])
    path.write_text(json.dumps({"fetched": time.time(), "versions": versions}) + "\n")
    return ordered(versions)


def ordered(versions: list[str]) -> list[str]:
    parsed = []
    for text in versions:
        try:
            parsed.append((Version(text), text))
        except InvalidVersion:
            continue
    return [text for _, text in sorted(parsed)]


def parse_range(text: str) -> tuple[str, str]:
    first, sep, last = text.partition("..")
    if not sep or not first or not last:
        raise UsageError(f"--releases: expected A..B (like 0.25.0..0.33.0), got {text!r}")
    for end in (first, last):
        try:
            Version(end)
        except InvalidVersion:
            raise UsageError(f"--releases: {end!r} is not a version") from None
    if Version(first) >= Version(last):
        raise UsageError(f"--releases: {first} is not older than {last}; write OLDER..NEWER")
    return first, last


def releases_between(versions: list[str], first: str, last: str, pre: bool = False) -> list[str]:
    """The releases from ``first`` to ``last`` inclusive, oldest first."""
    known = {Version(v): v for v in ordered(versions)}
    for end in (first, last):
        if Version(end) not in known:
            near = [v for v in known.values() if v.startswith(end.rsplit(".", 1)[0])]
            hint = f" (nearby: {', '.join(near)})" if near else ""
            raise UsageError(f"--releases: {PACKAGE} {end} is not on pip's index{hint}")
    low, high = Version(first), Version(last)
    chosen = [
        text
        for version, text in known.items()
        if low <= version <= high
        and (pre or not (version.is_prerelease or version.is_devrelease))
        or version in (low, high)
    ]
    return ordered(chosen)
