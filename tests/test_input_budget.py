"""Hostile input stays cheap: each limit of a scenario document refuses its document before
anything is expanded, with its file, line, field and the limit, in well under 2 s and
300 MB; the other files still run; ``--input-limit`` raises a limit.

The two documents of issue 37 (``repeat: 1000000000``, an alias bomb under ``matrix``) are
the first two tests; each limit of :class:`~kvconform.harness.loader.budget.Limits` has its
own test, at the default limit and one past it.
"""

from __future__ import annotations

import json
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from kvconform.errors import ExitStatus, ScenarioError, UsageError
from kvconform.harness.loader import load_file, load_paths, load_text
from kvconform.harness.loader.budget import LIMITS, Limits, OverBudget

GOOD = """
model: {groups: [full_attention]}
requests: {a: {prompt_len: 20}}
steps: [{a: {prefill: 20}}, {a: finish}]
"""

REPEAT_BOMB = """
model: {groups: [full_attention]}
requests: {a: {prompt_len: 20}}
steps:
  - {a: {prefill: 20}}
  - repeat: 1000000000
    step: {a: decode}
"""


def alias_bomb(levels: int = 10, width: int = 9) -> str:
    """A YAML alias bomb under ``matrix``: ``width ** levels`` scalars once expanded."""
    lines = [
        "model: {groups: [full_attention]}",
        "requests: {a: {prompt_len: 20}}",
        "steps: [{a: {prefill: 20}}]",
        "matrix:",
        "  num_speculative_tokens:",
        "    - &x0 [" + ", ".join(["1"] * width) + "]",
    ]
    for level in range(1, levels):
        lines.append(f"    - &x{level} [" + ", ".join([f"*x{level - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def _refused_cheaply(text: str, tmp_path: Path) -> ScenarioError:
    """The document's one input error, found within 2 s and 300 MB (traced peak)."""
    path = tmp_path / "hostile.yaml"
    path.write_text(text, encoding="utf-8")
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(ScenarioError) as info:
            load_file(path)
        seconds = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seconds < 2.0, seconds
    assert peak < 300 * 2**20, peak
    return info.value


def test_a_billion_repeats_are_refused_before_unrolling(tmp_path):
    error = _refused_cheaply(REPEAT_BOMB, tmp_path)
    assert isinstance(error, OverBudget)
    assert error.where.file.endswith("hostile.yaml")
    assert (error.where.line, error.where.field) == (6, "steps[1].repeat")
    assert "1,000,000,001" in error.message and "limit of 20,000 (steps)" in error.message
    assert "--input-limit steps=N" in error.message


def test_an_alias_bomb_under_matrix_is_refused_without_expanding_it(tmp_path):
    error = _refused_cheaply(alias_bomb(), tmp_path)
    assert isinstance(error, OverBudget)
    assert "(yaml_nodes)" in error.message and "aliases expanded" in error.message
    assert error.where.line is not None and error.where.line >= 6
    assert (error.where.field or "").startswith("matrix.num_speculative_tokens")


def test_a_hostile_file_beside_a_good_one_leaves_the_good_one_running(tmp_path, capsys):
    from kvconform.fronts.cli import main

    (tmp_path / "good.yaml").write_text(GOOD, encoding="utf-8")
    (tmp_path / "repeat.yaml").write_text(REPEAT_BOMB, encoding="utf-8")
    (tmp_path / "bomb.yaml").write_text(alias_bomb(), encoding="utf-8")
    loaded = load_paths([tmp_path])
    assert [s.id for s in loaded.scenarios] == ["good"]
    assert sorted(Path(e.where.file).name for e in loaded.errors) == ["bomb.yaml", "repeat.yaml"]
    out = tmp_path / "report"
    status = main(["run", str(tmp_path), "--report-dir", str(out), "--progress", "off"])
    assert status == ExitStatus.BAD_INPUT
    report = json.loads((out / "report.json").read_text())
    assert [(s["id"], s["verdict"]) for s in report["scenarios"]] == [("good", "passed")]
    printed = capsys.readouterr().out
    assert "repeat.yaml:6: steps[1].repeat" in printed and "(yaml_nodes)" in printed


# -- one test per limit: the document at the limit loads, one past it is refused -------------


def _steps(count: int) -> str:
    return (
        "model: {groups: [full_attention], max_model_len: 100000}\n"
        "requests: {a: {prompt_len: 1}}\n"
        f"steps:\n  - {{a: {{prefill: 1}}}}\n  - repeat: {count - 1}\n    step: {{a: decode}}\n"
    )


def _matrix(cases: int) -> str:
    values = ", ".join(str(16 * (i + 1)) for i in range(cases))
    return GOOD + f"matrix: {{block_size: [{values}]}}\n"


def _requests(count: int) -> str:
    names = ", ".join(f"r{i}: {{prompt_len: 1}}" for i in range(count))
    return f"model: {{groups: [full_attention]}}\nrequests: {{{names}}}\nsteps: [{{r0: {{prefill: 1}}}}]\n"


def _tokens(count: int) -> str:
    return (
        f"model: {{groups: [full_attention], max_model_len: {count}}}\n"
        "requests: {a: {prompt_len: 20}}\nsteps: [{a: {prefill: 20}}]\n"
    )


def _blocks(count: int) -> str:
    return f"model: {{groups: [full_attention], num_blocks: {count}}}\n" + GOOD.split("\n", 2)[2]


def _nodes(count: int) -> str:
    # GOOD's document, plus a tags list that brings the nodes to ``count``.
    base = sum(1 for _ in _events(GOOD + "tags: []\n"))
    return GOOD + "tags: [" + ", ".join(["t"] * (count - base)) + "]\n"


def _events(text: str) -> list[object]:
    import yaml

    return [
        e
        for e in yaml.parse(text)
        if isinstance(e, (yaml.ScalarEvent, yaml.AliasEvent, yaml.CollectionStartEvent))
    ]


def _depth(levels: int) -> str:
    # The document and its steps list, then repeats around a decode: a repeat with
    # ``steps`` nests two levels (its mapping and its list), with ``step`` one.
    inner, remaining = "{a: decode}", levels - 3
    while remaining >= 2:
        inner, remaining = "{repeat: 1, steps: [" + inner + "]}", remaining - 2
    if remaining == 1:
        inner = "{repeat: 1, step: " + inner + "}"
    return GOOD.replace("{a: finish}", inner)


LIMIT_CASES: dict[str, tuple[Callable[[int], str], int, str]] = {
    # name: (a document asking for N, N that the test uses at the limit, the field named)
    "steps": (_steps, 20, "steps[1].repeat"),
    "matrix_cases": (_matrix, 6, "matrix"),
    "requests": (_requests, 12, "requests"),
    "tokens": (_tokens, 4096, "model.max_model_len"),
    "blocks": (_blocks, 64, "model.num_blocks"),
    "yaml_nodes": (_nodes, 60, ""),
    "yaml_depth": (_depth, 6, "steps[1]"),
}


@pytest.mark.parametrize("name", LIMIT_CASES)
def test_each_limit_refuses_one_past_it_and_can_be_raised(name, tmp_path):
    make, at_limit, field = LIMIT_CASES[name]
    token = LIMITS.set(Limits().raised([f"{name}={at_limit}"]))
    try:
        assert load_text(make(at_limit), "at.yaml")  # at the limit: loads
        with pytest.raises(OverBudget) as info:
            load_text(make(at_limit + 1), "past.yaml")
    finally:
        LIMITS.reset(token)
    error = info.value
    assert error.where.file == "past.yaml" and error.where.line is not None
    assert (error.where.field or "").startswith(field), error
    assert f"limit of {at_limit:,} ({name})" in error.message
    # The same document under the raised limit of load_paths' own argument loads.
    path = tmp_path / "past.yaml"
    path.write_text(make(at_limit + 1), encoding="utf-8")
    raised = load_paths([path], Limits().raised([f"{name}={at_limit + 1}"]))
    assert raised.errors == [] and raised.scenarios


def test_the_file_size_limit_is_checked_before_decoding(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_bytes(GOOD.encode() + b"# " + b"\xff" * 200 + b"\n")
    loaded = load_paths([path], Limits(bytes=100))
    (error,) = loaded.errors
    assert "(bytes)" in error.message and error.where.line == 1


def test_a_recursive_alias_is_refused(tmp_path):
    error = _refused_cheaply(GOOD + "tags: &t [a, *t]\n", tmp_path)
    assert "used inside its own anchor" in error.message and error.where.field == "tags[1]"


def test_input_limit_option_raises_a_limit_and_refuses_nonsense(tmp_path, capsys):
    from kvconform.fronts.cli import main

    path = tmp_path / "long.yaml"
    path.write_text(_steps(20_001), encoding="utf-8")
    assert load_paths([path]).errors  # past the default
    with pytest.raises(UsageError, match="no limit 'stepz'"):
        Limits().raised(["stepz=5"])
    with pytest.raises(UsageError, match="positive integer"):
        Limits().raised(["steps=-1"])
    assert main(["run", str(path), "--input-limit", "stepz=5", "--progress", "off"]) == 2
    assert "no limit 'stepz'" in capsys.readouterr().out
    # Under git bisect run, a usage error aborts (128), as argparse's own.
    assert main(["check", str(path), "--input-limit", "steps=x"]) == 128
