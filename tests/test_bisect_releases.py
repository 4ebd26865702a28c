"""Release bisection against real PyPI releases (downloaded once, cached outside the repo).

``scenarios/regressions/dspark-fill-in-lookahead.yaml`` conforms on 0.27.1 (no
``VllmConfig.num_lookahead_tokens`` yet, nothing to compare) and fails the lookahead check
on 0.28.0 (the property returns k for DSpark fill-in, which needs k + 1). Bisecting the two
must name 0.28.0 and the flipped scenario; the same range with ``--find-fix`` must refuse
with exit 2 and say why. The divergence is listed in scenarios/expectations.yaml for
0.28.0-0.31.0 (so nightly runs of those releases stay green), hence ``--no-expectations``:
hunting a listed divergence's origin means not excusing it. The release trees live in the user's kvconform cache, so a second
run of these tests downloads nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SCENARIO = REPO_ROOT / "scenarios" / "regressions" / "dspark-fill-in-lookahead.yaml"


def kvconform(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "kvconform", *args], capture_output=True, text=True, env=env
    )


@pytest.mark.network
@pytest.mark.slow
def test_bisect_releases_names_the_release_that_broke_dspark_fill_in():
    done = kvconform(
        "bisect", "--releases", "0.27.1..0.28.0", "--fresh", "--no-expectations", str(SCENARIO)
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "First bad (first nonconforming) release: 0.28.0  (last good: 0.27.1)" in out
    assert "dspark-fill-in-lookahead: passed -> failed" in out
    assert "VllmConfig.num_lookahead_tokens is 3 for method 'dspark'" in out
    probes = [line for line in out.splitlines() if line.startswith("probe ")]
    assert len(probes) == 2 and not any("[cached]" in line for line in probes)
    report_dirs = [line.split()[-1] for line in out.splitlines() if "/bisect/probes/" in line]
    assert len(report_dirs) == 2 and all(Path(d, "report.json").exists() for d in report_dirs)

    refused = kvconform(
        "bisect", "--releases", "0.27.1..0.28.0", "--find-fix", "--no-expectations", str(SCENARIO)
    )
    out = refused.stdout + refused.stderr
    assert refused.returncode == 2, out
    assert "cannot bisect: 0.27.1 is conform and 0.28.0 is nonconform" in out
    assert "drop --find-fix" in out
    assert all("[cached]" in line for line in out.splitlines() if line.startswith("probe "))
