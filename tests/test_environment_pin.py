"""The default environment judges the newest release kvconform claims.

``make run`` and ``make test`` judge the vLLM that constraints.txt pins. A new user's first
run should judge the newest release kvconform claims (the upper end of the Makefile's
``CLAIMED_RELEASES``, the releases ``make campaigns``' matrix and the release lock hold green), not
an older one that happens to be pinned. These tests fail when the claimed range moves on and
the pin, the README or the lock lags behind it.
"""

from __future__ import annotations

import re

from packaging.version import Version
from vllm_copy import REPO

from kvconform.matrix.lock import LOCK_FILE, read_lock


def _claimed_range() -> tuple[str, str]:
    makefile = (REPO / "Makefile").read_text()
    match = re.search(r"^CLAIMED_RELEASES \?= (\S+)\.\.(\S+)$", makefile, re.MULTILINE)
    assert match, "the Makefile sets CLAIMED_RELEASES ?= LOW..HIGH"
    return match.group(1), match.group(2)


def _pinned_vllm() -> str:
    pins = re.findall(r"^vllm==(\S+)$", (REPO / "constraints.txt").read_text(), re.MULTILINE)
    assert len(pins) == 1, f"constraints.txt pins vllm exactly once, found {pins}"
    return pins[0]


def test_the_pin_is_the_newest_claimed_release():
    _, newest = _claimed_range()
    assert _pinned_vllm() == newest, (
        f"constraints.txt pins vLLM {_pinned_vllm()} but kvconform claims releases up to "
        f"{newest}: make run should judge {newest} (pin it, then make constraints)"
    )


def test_the_readme_and_the_makefile_name_the_pinned_release():
    pinned = _pinned_vllm()
    readme = (REPO / "README.md").read_text()
    assert f"pinned: vLLM {pinned}" in readme, "README's first command names the pinned vLLM"
    assert f"constraints.txt (vLLM {pinned}" in (REPO / "Makefile").read_text()


def test_the_lock_spans_the_claimed_range():
    low, high = _claimed_range()
    releases = read_lock(REPO / LOCK_FILE).releases
    assert releases[0] == low and releases[-1] == high, (
        f"the release lock holds {releases[0]}..{releases[-1]} green; the Makefile claims "
        f"{low}..{high}: run make release-matrix to renew it"
    )
    assert Version(high) == max(Version(r) for r in releases)
