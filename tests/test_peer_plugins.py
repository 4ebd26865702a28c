"""kvconform.peer's pytest plugins, in a pytest of their own on fake test modules: the CPU
warmup un-skipping, the outcome records, the deselection, and the fallback to the installed
vLLM's compiled modules."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from kvconform.peer.plugins.tree import InstalledFallback

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]

# A stand-in for torch: like a machine without an accelerator, synchronize raises.
FAKE_TORCH = """
class _Accelerator:
    @staticmethod
    def synchronize(device=None):
        raise RuntimeError("Found no NVIDIA driver on your system")

accelerator = _Accelerator()
"""

# Shaped like tests/v1/worker/test_gpu_warmup_blocks.py: skipped module-wide without CUDA,
# and the code under test ends by synchronizing on the accelerator.
WARMUP_LIKE = """
import pytest
import torch

pytestmark = pytest.mark.skipif(True, reason="warmup synchronizes on the accelerator")

def warmup_kernels():
    torch.accelerator.synchronize()
    return "warmed"

def test_warmup_runs():
    assert warmup_kernels() == "warmed"

@pytest.mark.skipif(True, reason="a test's own skip stays")
def test_own_skip():
    pass
"""


@pytest.fixture
def peer_pytester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makepyfile(torch=FAKE_TORCH)
    pytester.mkpydir("sub")
    (pytester.path / "sub" / "test_warmup_like.py").write_text(WARMUP_LIKE)
    (pytester.path / "sub" / "test_other.py").write_text(WARMUP_LIKE)
    return pytester


def test_the_warmup_file_runs_without_cuda(peer_pytester: pytest.Pytester):
    result = peer_pytester.runpytest_subprocess(
        "-p", "kvconform.peer.plugins.cpu_warmup",
        "--peer-cpu-file", "sub/test_warmup_like.py",
        "-rs", "sub",
    )  # fmt: skip
    outcomes = result.parseoutcomes()
    # The named file's module skip is gone and its synchronize is a no-op; its own test
    # skip stays; the other file, shaped the same, stays skipped.
    assert outcomes == {"passed": 1, "skipped": 3}, result.stdout.str()
    result.stdout.fnmatch_lines(["*test_other.py*warmup synchronizes on the accelerator*"])
    result.stdout.fnmatch_lines(["*test_warmup_like.py*a test's own skip stays*"])


def test_without_the_plugin_the_warmup_file_is_skipped(peer_pytester: pytest.Pytester):
    result = peer_pytester.runpytest_subprocess("sub/test_warmup_like.py")
    assert result.parseoutcomes() == {"skipped": 2}


def test_the_synchronize_stub_does_not_outlive_the_file(peer_pytester: pytest.Pytester):
    (peer_pytester.path / "sub" / "test_zz_after.py").write_text(
        "import pytest, torch\n"
        "def test_real_synchronize_is_back():\n"
        "    with pytest.raises(RuntimeError):\n"
        "        torch.accelerator.synchronize()\n"
    )
    result = peer_pytester.runpytest_subprocess(
        "-p", "kvconform.peer.plugins.cpu_warmup",
        "--peer-cpu-file", "sub/test_warmup_like.py",
        "sub/test_warmup_like.py", "sub/test_zz_after.py",
    )  # fmt: skip
    assert result.parseoutcomes() == {"passed": 2, "skipped": 1}, result.stdout.str()


def test_records_and_deselection(peer_pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    peer_pytester.makepyfile(
        test_mixed="""
        import pytest

        def test_ok():
            pass

        def test_bad():
            assert 1 + 1 == 3, "arithmetic"

        def test_listed():
            raise RuntimeError("deselected, never run")

        @pytest.fixture
        def broken():
            raise ValueError("fixture fails")

        def test_setup_error(broken):
            pass
        """,
        test_unimportable="import no_such_module_anywhere\n",
    )
    record = peer_pytester.path / "record.jsonl"
    listed = peer_pytester.path / "deselect.txt"
    listed.write_text("test_mixed.py::test_listed\n")
    monkeypatch.setenv("KVCONFORM_PEER_RECORD", str(record))
    monkeypatch.setenv("KVCONFORM_PEER_DESELECT", str(listed))
    result = peer_pytester.runpytest_subprocess(
        "-p", "kvconform.peer.plugins.record", "-p", "kvconform.peer.plugins.deselect",
        "--continue-on-collection-errors", "test_mixed.py", "test_unimportable.py",
    )  # fmt: skip
    assert result.parseoutcomes()["deselected"] == 1
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    by_id = {(r["nodeid"], r.get("when")): r for r in lines}
    assert by_id[("test_unimportable.py", None)]["kind"] == "collect"
    assert "ModuleNotFoundError" in by_id[("test_unimportable.py", None)]["message"]
    assert by_id[("test_mixed.py::test_ok", "call")]["outcome"] == "passed"
    bad = by_id[("test_mixed.py::test_bad", "call")]
    assert bad["outcome"] == "failed" and bad["message"].startswith("AssertionError: arithmetic")
    setup = by_id[("test_mixed.py::test_setup_error", "setup")]
    assert setup["outcome"] == "failed" and "ValueError: fixture fails" in setup["message"]
    assert not any(r["nodeid"] == "test_mixed.py::test_listed" for r in lines)


def test_the_fallback_finds_only_what_the_tree_lacks(tmp_path: Path, monkeypatch):
    package = "kvconform_fake_vllm"  # shaped like vllm/, named so nothing real is touched
    installed = tmp_path / "installed" / package
    (installed / "sub").mkdir(parents=True)
    (installed / "_compiled.py").write_text("WHERE = 'installed'\n")
    (installed / "sub" / "_ext.py").write_text("WHERE = 'installed sub'\n")
    (installed / "own.py").write_text("WHERE = 'installed own'\n")
    tree = tmp_path / "tree" / package
    (tree / "sub").mkdir(parents=True)
    for folder in (tree, tree / "sub"):
        (folder / "__init__.py").write_text("")
    (tree / "own.py").write_text("WHERE = 'tree'\n")
    monkeypatch.syspath_prepend(str(tmp_path / "tree"))
    finder = InstalledFallback(installed, package)
    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, finder])
    try:
        assert importlib.import_module(f"{package}.own").WHERE == "tree"
        assert importlib.import_module(f"{package}._compiled").WHERE == "installed"
        assert importlib.import_module(f"{package}.sub._ext").WHERE == "installed sub"
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] == package]:
            del sys.modules[name]
    assert finder.find_spec("other.thing", None) is None
    assert InstalledFallback(installed).prefix == "vllm."


def test_light_cleanup_marks_every_test_with_vllms_own_marker(peer_pytester: pytest.Pytester):
    # Shaped like vLLM's tests/conftest.py: the teardown runs unless the test is marked.
    peer_pytester.makeconftest(
        """
        import pytest

        CLEANED = []

        @pytest.fixture()
        def should_do_global_cleanup_after_test(request) -> bool:
            return not request.node.get_closest_marker("skip_global_cleanup")

        @pytest.fixture(autouse=True)
        def cleanup_fixture(should_do_global_cleanup_after_test):
            yield
            if should_do_global_cleanup_after_test:
                CLEANED.append(1)
                raise RuntimeError("the global cleanup ran")
        """
    )
    peer_pytester.makepyfile(test_plain="def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    light = peer_pytester.runpytest_subprocess(
        "-p", "kvconform.peer.plugins.light_cleanup", "test_plain.py"
    )  # fmt: skip
    assert light.parseoutcomes() == {"passed": 2}, light.stdout.str()
    full = peer_pytester.runpytest_subprocess("test_plain.py")
    assert full.parseoutcomes() == {"passed": 2, "errors": 2}
