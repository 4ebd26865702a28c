"""Whose code raised: describe_crash puts an exception on vLLM (a ``crash``, a finding) or
on kvconform's own code (``internal``, exit 3), by the innermost frame that is either's.

The tracebacks are fabricated: code compiled under the file name of a module of vLLM's
tree (a folder of tmp_path standing for it) or of kvconform's package, so that no vLLM is
imported.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import kvconform
from kvconform.fuzz.findings import signatures
from kvconform.harness.runner import conclude, crash_kind, describe_crash, exit_status
from kvconform.model.observations import Trajectory
from kvconform.model.results import ErrorKind, ScenarioResult, Verdict

PACKAGE = Path(kvconform.__file__).resolve().parent


def raised_through(*files: Path, error: Exception) -> BaseException:
    """The exception raised by the last of ``files``, each file's code calling the next's,
    all on line 2 of theirs."""
    namespace: dict[str, Any] = {"error": error}
    for depth, file in reversed(list(enumerate(files))):
        call = "raise error" if depth == len(files) - 1 else f"frame_{depth + 1}()"
        source = f"def frame_{depth}():\n    {call}\n"
        exec(compile(source, str(file), "exec"), namespace)  # noqa: S102 - fabricated frames
    return _raised_by(namespace["frame_0"])


@pytest.fixture
def vllm(tmp_path) -> Any:
    return SimpleNamespace(location=str(tmp_path / "vllm"), version="0.33.0")


def test_an_exception_of_kvconforms_oracle_is_kvconforms_not_vllms(vllm):
    oracle = PACKAGE / "oracles" / "scheduler" / "inputs.py"
    driver = PACKAGE / "harness" / "drivers" / "scheduler.py"
    scheduler = Path(vllm.location) / "v1" / "core" / "sched" / "scheduler.py"
    # The driver calls vLLM's scheduler, then the oracle indexes what it recorded.
    exc = raised_through(driver, scheduler, driver, oracle, error=IndexError("list index"))
    text = describe_crash(exc, vllm)
    assert text == (
        "kvconform's scheduler oracle raised IndexError: list index at "
        "kvconform/oracles/scheduler/inputs.py:2 in frame_3 (an error of kvconform, not a "
        "finding on vLLM 0.33.0)"
    )
    assert crash_kind(text) is ErrorKind.INTERNAL


def test_an_exception_of_a_driver_names_the_driver(vllm):
    driver = PACKAGE / "harness" / "drivers" / "scheduler.py"
    text = describe_crash(raised_through(driver, error=KeyError("b")), vllm)
    assert text.startswith("kvconform's driver raised KeyError: 'b' at kvconform/harness/")


def test_an_exception_of_vllm_under_kvconforms_code_stays_vllms(vllm):
    driver = PACKAGE / "harness" / "drivers" / "scheduler.py"
    scheduler = Path(vllm.location) / "v1" / "core" / "sched" / "scheduler.py"
    text = describe_crash(raised_through(driver, scheduler, error=AssertionError("x")), vllm)
    assert text == (
        "vLLM 0.33.0 raised AssertionError: x at vllm/v1/core/sched/scheduler.py:2 in frame_1"
    )
    assert crash_kind(text) is ErrorKind.CRASH


def test_a_library_frame_under_vllm_leaves_it_vllms(vllm, tmp_path):
    # torch or the standard library raising under vLLM's call: vLLM's, at vLLM's frame.
    scheduler = Path(vllm.location) / "v1" / "core" / "kv_cache_manager.py"
    library = tmp_path / "site-packages" / "torch" / "functional.py"
    text = describe_crash(raised_through(scheduler, library, error=RuntimeError("shape")), vllm)
    assert text.startswith("vLLM 0.33.0 raised RuntimeError: shape at vllm/v1/core/")


def test_an_internal_error_exits_3_and_is_no_finding_also_when_judged_again(vllm):
    oracle = PACKAGE / "oracles" / "scheduler" / "stepping.py"
    text = describe_crash(raised_through(oracle, error=IndexError("x")), vllm)
    result = ScenarioResult("x", "f.yaml", Verdict.PASSED)
    # A recording keeps only the text (kvconform judge concludes from it): same kind.
    conclude(result, Trajectory(groups=(), lookahead=0, lookahead_source="test"), (), {}, text)
    assert (result.verdict, result.error_kind) == (Verdict.ERROR, ErrorKind.INTERNAL)
    assert exit_status([result]) == 3
    vllms = ScenarioResult("y", "f.yaml", Verdict.ERROR, error_kind=ErrorKind.CRASH)
    assert exit_status([result, vllms]) == 1


def raised_in(file: Path, source: str, error: Exception) -> BaseException:
    """The exception ``run()``, defined by ``source`` compiled under ``file``'s name, raises."""
    namespace: dict[str, Any] = {"error": error, "fail": _fail}
    exec(compile(source, str(file), "exec"), namespace)  # noqa: S102 - fabricated frames
    return _raised_by(namespace["run"])


def _raised_by(call: Any) -> BaseException:
    """The exception ``call()`` raises (it must raise)."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the fabricated exception is the subject
        return exc
    raise AssertionError("nothing raised")


def _fail(error: Exception) -> None:
    raise error


# Python 3.12 inlines these into the function that holds them (PEP 709); 3.11 runs each in a
# frame of its own, named <listcomp>, <dictcomp>, <setcomp>. The raise is on line 4.
COMPREHENSIONS = {
    "list": "[fail(error) for i in items]",
    "dict": "{i: fail(error) for i in items}",
    "set": "{fail(error) for i in items}",
    "nested": "[{i: [fail(error) for j in items] for i in items}]",
}


@pytest.mark.parametrize("form", sorted(COMPREHENSIONS))
def test_a_crash_in_a_comprehension_names_the_function_that_holds_it(vllm, form):
    # #21's crash: an IndexError inside a list comprehension of a nested function of
    # vllm/v1/worker/gpu/warmup.py. A nightly on Python 3.12 signed it with the function,
    # one on 3.11 with <listcomp>; the known entries must match on either.
    warmup = Path(vllm.location) / "v1" / "worker" / "gpu" / "warmup.py"
    source = (
        "def run():\n"
        "    items = [0]\n"
        "    def _run_decode_step():\n"
        f"        return {COMPREHENSIONS[form]}\n"
        "    return _run_decode_step()\n"
    )
    text = describe_crash(raised_in(warmup, source, IndexError("list index out of range")), vllm)
    assert text == (
        "vLLM 0.33.0 raised IndexError: list index out of range at "
        "vllm/v1/worker/gpu/warmup.py:4 in _run_decode_step"
    )
    result = ScenarioResult("x", "f.yaml", Verdict.ERROR, error_kind=ErrorKind.CRASH, error=text)
    assert [str(s) for s in signatures(result)] == [
        "crash / IndexError / vllm/v1/worker/gpu/warmup.py:4 _run_decode_step"
    ]


def test_a_crash_in_a_generator_expression_keeps_its_frame(vllm):
    # 3.12 still runs a generator expression in a frame of its own: <genexpr> on both.
    scheduler = Path(vllm.location) / "v1" / "core" / "sched" / "scheduler.py"
    source = "def run():\n    items = [0]\n    return list(\n        fail(error) for i in items)\n"
    text = describe_crash(raised_in(scheduler, source, KeyError("r")), vllm)
    assert text.endswith("at vllm/v1/core/sched/scheduler.py:4 in <genexpr>"), text


def test_a_comprehension_of_kvconforms_own_code_names_its_function_too(vllm):
    oracle = PACKAGE / "oracles" / "scheduler" / "inputs.py"
    source = (
        "def run():\n"
        "    items = [0]\n"
        "    def read():\n"
        "        return [fail(error) for i in items]\n"
        "    return read()\n"
    )
    text = describe_crash(raised_in(oracle, source, IndexError("x")), vllm)
    assert "at kvconform/oracles/scheduler/inputs.py:4 in read (" in text, text
