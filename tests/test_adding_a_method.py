"""docs/adding-a-method.md, run as written: a vLLM with a new method, declared without a fork.

A copy of the installed vLLM gets a method its registry lacks (``orbit``, in vLLM's
method literal, with ``VllmConfig.num_lookahead_tokens`` returning k + 2 for it).
The test then takes the page's steps in order in that copy, as a vLLM developer would
in their checkout: each ``console`` block's ``$ kvconform ...`` commands are run and
every output line the page shows must be in the command's output (``...`` stands for
what varies), with the ``[exit N]`` it shows; each ``yaml`` block whose first line names
a file (``# tests/v1/.../methods.yaml``) is written there as shown; the page's "change
`A` to `B` in `FILE`" is made. So the page cannot drift from what kvconform does: without
a methods file the method is missing and the file to edit is named, with ``k + 2``
declared the scenario is green, with ``k + 1`` the lookahead check fails it.

The methods file's grammar and its errors are tested without vLLM below.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from kvconform.errors import ScenarioError
from kvconform.harness.loader import discover
from kvconform.harness.methods_file import find_methods_file, parse_methods, use_methods_for
from kvconform.model.methods import METHODS, expected_lookahead, extra_methods, use_methods

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "adding-a-method.md"

# The two edits of the page's step 1, to vLLM's own modules.
DECLARE = (
    "config/speculative.py",
    '    "custom_class",\n    EagleModelTypes,',
    '    "custom_class",\n    "orbit",\n    EagleModelTypes,',
)
LOOKAHEAD = (
    "config/vllm.py",
    "        if speculative_config is None:\n            return 0\n        dspark_fill_in",
    "        if speculative_config is None:\n            return 0\n"
    '        if speculative_config.method == "orbit":\n'
    "            return self.num_speculative_tokens + 2\n        dspark_fill_in",
)

_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
_EDIT = re.compile(r"change `([^`]+)`\s+to `([^`]+)` in `([^`]+)`")


def page_steps(text: str, cwd: Path) -> tuple[list, list]:
    """The page's steps in order (commands, files, edits) and, per command, what it shows."""
    found = [(m.start(), "block", m) for m in _BLOCK.finditer(text)]
    found += [(m.start(), "edit", m) for m in _EDIT.finditer(text)]
    steps: list = []
    shown: list[tuple[list[str], int]] = []
    for _, kind, match in sorted(found, key=lambda f: f[0]):
        if kind == "edit":
            old, new, file = match.groups()
            steps.append((str(cwd / file), old, new))
            continue
        language, body = match.groups()
        first = body.splitlines()[0]
        if language == "yaml" and re.fullmatch(r"# [\w./-]+/[\w.-]+\.yaml", first):
            file = first.removeprefix("# ")
            steps.append((str(cwd / file), None, body))
        elif language == "console":
            for chunk in body.split("$ ")[1:]:
                command, *lines = chunk.strip().splitlines()
                status = next(int(line[6:-1]) for line in lines if line.startswith("[exit "))
                steps.append(command)
                shown.append(([x for x in lines if not x.startswith("[exit ")], status))
    return steps, shown


def shows(output: str, line: str) -> bool:
    """The output has the line, whitespace runs made one and ``...`` matching anything."""
    pattern = re.escape(" ".join(line.split())).replace(re.escape("..."), ".*")
    return any(re.search(pattern, " ".join(have.split())) for have in output.splitlines())


@pytest.mark.slow
def test_the_page_runs_as_written(pristine_tree_033: Path, tmp_path: Path) -> None:
    # The page edits vLLM 0.33.0's files as they are written there.
    pristine_tree = pristine_tree_033
    from vllm_copy import run_kvconform_commands, tree_with_replacement

    text = PAGE.read_text(encoding="utf-8")
    for _, _, new in (DECLARE, LOOKAHEAD):  # the page shows vLLM's edits as the test makes them
        assert new.removesuffix("        dspark_fill_in") in text
    declared = tree_with_replacement(pristine_tree, tmp_path / "declared", *DECLARE)
    tree = tree_with_replacement(declared, tmp_path / "tree", *LOOKAHEAD)
    steps, shown = page_steps(text, tree)
    commands = [s for s in steps if isinstance(s, str)]
    assert [c.split()[1] for c in commands] == [
        "methods", "doctor", "methods", "doctor", "run", "run",
    ]  # fmt: skip
    assert sum(isinstance(s, tuple) and s[1] is None for s in steps) == 2  # two files
    assert sum(isinstance(s, tuple) and s[1] is not None for s in steps) == 1  # one edit
    done = run_kvconform_commands(steps, cwd=tree)
    assert len(done) == len(shown)
    for ran, (lines, status) in zip(done, shown, strict=True):
        output = str(ran["output"])
        missing = [line for line in lines if not shows(output, line)]
        assert not missing and ran["status"] == status, (
            f"{ran['command']}: exit {ran['status']} (the page shows {status}); "
            f"lines the page shows that the output lacks: {missing}\n{output[-4000:]}"
        )


# -- the methods file, without vLLM --------------------------------------------------------


@pytest.fixture
def restore_registry():
    previous = use_methods(())
    yield
    use_methods(previous)


def entry(**fields: str) -> str:
    base = {"name": "orbit", "lookahead": "k + 2", "reason": "writes two bonus queries too"}
    base.update({"draft": "none"}, **fields)
    return "- " + "\n  ".join(f"{k}: {v}" for k, v in base.items() if v != "<omit>") + "\n"


@pytest.mark.parametrize(
    ("formula", "slots"),
    [("k", [1, 3]), ("k + 2", [3, 5]), ("k-1", [0, 2]), ("2 * k + 1", [3, 7]), ("0", [0, 0])],
)
def test_the_formula_grammar(formula: str, slots: list[int]) -> None:
    (method,) = parse_methods(entry(lookahead=formula), "m.yaml")
    assert [method.lookahead(k) for k in (1, 3)] == slots


def test_per_layout_rules_and_drafts() -> None:
    text = entry(lookahead="{anchor: k, fill_in: k + 1}", draft="one-layer")
    text += entry(name="ring", draft="Qwen2ForCausalLM")
    orbit, ring = parse_methods(text, "m.yaml")
    assert (orbit.lookahead(3, True), orbit.lookahead(3, False)) == (3, 4)
    assert orbit.anchor_layouts and orbit.has_draft_model and orbit.draft is not None
    assert ring.draft is not None and ring.draft.architecture == "Qwen2ForCausalLM"
    assert orbit.source == "m.yaml:1" and ring.source == "m.yaml:5"


@pytest.mark.parametrize(
    ("text", "where", "says"),
    [
        (entry(lookahead="k * 2"), "m.yaml:2: [0].lookahead", "not a lookahead formula"),
        (entry(lookahead="k - 2"), "m.yaml:2: [0].lookahead", "negative for k = 1"),
        (entry(draft="GPT2"), "m.yaml:4: [0].draft", "an architecture"),
        (entry(reason="k"), "m.yaml:3: [0].reason", "in words"),
        (entry(draft="<omit>"), "m.yaml:1: [0].draft", "missing"),
        (entry(colour="red"), "m.yaml:5: [0].colour", "unknown field"),
        (entry(name="eagle"), "m.yaml:1: [0].name", "built-in method"),
        (entry() + entry(), "m.yaml:5: [1].name", "declared twice"),
        ("name: orbit\n", "m.yaml:1", "a list of entries"),
    ],
)
def test_errors_name_file_line_and_field(text: str, where: str, says: str) -> None:
    with pytest.raises(ScenarioError) as caught:
        parse_methods(text, "m.yaml")
    assert str(caught.value.where) == where and says in caught.value.message


def test_the_nearest_file_applies_and_is_no_scenario(tmp_path: Path, restore_registry) -> None:
    (tmp_path / ".git").mkdir()
    tree = tmp_path / "scenarios" / "methods"
    tree.mkdir(parents=True)
    (tmp_path / "scenarios" / "methods.yaml").write_text(entry(), encoding="utf-8")
    (tree / "orbit.yaml").write_text("name: x\n", encoding="utf-8")
    assert find_methods_file([tree / "orbit.yaml"]) == tmp_path / "scenarios" / "methods.yaml"
    assert discover([tmp_path / "scenarios"]) == [tree / "orbit.yaml"]
    assert "orbit" not in METHODS
    path, error = use_methods_for([tree / "orbit.yaml"])
    assert error is None and path is not None
    assert expected_lookahead("orbit", 3) == 5 and [m.name for m in extra_methods()] == ["orbit"]
    # Outside the tree (above the repository's root) no file applies: the built-ins alone.
    assert use_methods_for([tmp_path.parent]) == (None, None) and "orbit" not in METHODS


def test_a_broken_file_is_an_input_error_of_the_run(tmp_path: Path, restore_registry) -> None:
    from kvconform.harness.session import RunRequest, Session

    (tmp_path / ".git").mkdir()
    (tmp_path / "methods.yaml").write_text(entry(lookahead="k ** 2"), encoding="utf-8")
    (tmp_path / "s.yaml").write_text(
        textwrap.dedent("""
            name: s
            requests: {a: {prompt_len: 4}}
            steps: [{a: {prefill: 4}}]
        """),
        encoding="utf-8",
    )
    session = Session(RunRequest(paths=(str(tmp_path / "s.yaml"),)))
    selection = session.select()
    report = session.new_report(selection)
    (error,) = report.input_errors
    assert str(error.where) == f"{tmp_path / 'methods.yaml'}:2: [0].lookahead"
    assert "orbit" not in METHODS
