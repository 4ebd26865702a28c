"""The docs match the tree: what they name exists, and they cite nothing outside it.

The documents are README.md, scenarios/README.md and docs/**/*.md. The *code* of a
document is its fenced and indented blocks, its inline code spans (`...`, which may wrap
a line) and its link targets ([text](target)). The rules, one test each:

(a) **Paths.** A word of code (split at blanks, quotes, brackets, commas, ``=``) is a
    repository path when it starts with a top-level folder of the repository
    (``TOP_FOLDERS``) or is a top-level file (``TOP_FILES``). It must exist; a glob
    (``scenarios/warmup/*.yaml``) must match at least one file; ``FILE:LINE`` is checked
    as FILE; the ID of ``FILE::ID`` must be a scenario id of that scenario file or a test
    of that test module; ``REV:path`` (git's notation: the file at commit REV, for what a
    document says the tree was) must have existed at REV, where the history is at hand.
    Not checked: words with a placeholder (``<...>``, ``{...}``, ``...``, ``$VAR``); build
    outputs and caches (``build/``, ``.gpu/``, ``.venv/``, ``~/.cache/...``: no known
    folder starts them); paths of vLLM's own tree (``vllm/...``, and ``tests/v1/...``,
    vLLM's test layout: kvconform's ``tests/`` has no ``v1/`` folder, which a test below
    asserts). A link target is resolved from the linking document's folder; web links and
    in-page anchors are not checked.
(b) **Modules.** Every dotted name ``kvconform.a.b`` anywhere in a document names a
    module or package of the tree, found on disk (nothing is imported, so no vLLM), or,
    past its longest module prefix, a name that module binds at top level (def, class,
    assignment, import, or a name in its ``__all__``, which a module ``__getattr__`` may
    serve lazily) and, one level deeper, a name that class binds.
(c) **Commands.** In code, where a command starts (a line's start, after a ``$`` prompt,
    ``&&``, ``|``, ``-m`` or ``run``), ``kvconform WORD`` names a subcommand of
    :func:`kvconform.fronts.cli.build_parser` (``kvconform engine WORD`` one of
    ``engine``'s own) and ``make WORD`` a target of the Makefile. Elsewhere, as in a
    comment or a quoted message, the words are prose.
(d) **Nothing from outside.** No text file of README.md, scenarios/, docs/, kvconform/,
    tests/, tools/, ci/, benchmarks/, Makefile, pyproject.toml or conftest.py cites the
    notes kept beside the repository on the machine it was built on (a parent folder's
    ``shared/``, a ``shared/<note>`` path, a note's file name: ``NOTE_FILES`` with ``.md``,
    matched case-sensitively, since the repository's own ``docs/gpu.md`` is lower case), nor
    an absolute path of one machine: a build machine's work folder, root's home, a user's
    home (``/home/<user>/``, ``/Users/<user>/``); ``_OUTSIDE`` spells them. ``/tmp/...`` is
    allowed: every POSIX machine has it, and examples use it for scratch folders. What the
    product needs from such notes is restated in docs/.
(e) docs/architecture.md names every package under kvconform/ (``kvconform/a/b/`` or
    ``kvconform.a.b``) and every module at the top of the package (``kvconform/errors.py``).
(f) docs/cli.md names every subcommand (``kvconform NAME``), every long option of each,
    and every check (``CHECKS``, in backticks).

Each checker is a function over text that returns what it finds wrong; the tests at the
end feed each one a small bad sample and see it report it. The patterns below spell the
outside names with a character class (``[.]``) so that this file does not cite them.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path

import pytest

from kvconform.fronts.cli import build_parser
from kvconform.harness.checks import CHECKS

REPO = Path(__file__).resolve().parents[1]
TOP_FOLDERS = ("kvconform", "scenarios", "docs", "tests", "tools", "ci", "benchmarks")
TOP_FILES = ("README.md", "Makefile", "pyproject.toml", "constraints.txt", "conftest.py")
# Paths that look like the repository's but are vLLM's (its test tree's layout).
FOREIGN_PREFIXES = ("tests/v1/",)


def documents() -> list[Path]:
    return [REPO / "README.md", REPO / "scenarios" / "README.md"] + sorted(
        (REPO / "docs").rglob("*.md")
    )


# -- reading a document's code ------------------------------------------------------------

_FENCE = re.compile(r"^ {0,3}(```|~~~)[^\n]*\n(.*?)^ {0,3}\1[ \t]*$", re.M | re.S)
# An indented code block: lines indented by four spaces or a tab, after a blank line.
_INDENTED = re.compile(r"(?:\A|\n)[ \t]*\n((?:(?: {4,}|\t)[^\n]*(?:\n|\Z))+)")
# An inline code span: backticks, then text without a blank line, then as many backticks.
_SPAN = re.compile(r"(`+)((?:(?!\n\s*\n).)+?)\1", re.S)
_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def code_of(text: str) -> tuple[list[str], list[str]]:
    """(code pieces, link targets) of a Markdown text."""
    pieces = [m.group(2) for m in _FENCE.finditer(text)]
    prose = _FENCE.sub("", text)
    pieces += [m.group(1) for m in _INDENTED.finditer(prose)]
    prose = _INDENTED.sub("\n", prose)
    pieces += [m.group(2) for m in _SPAN.finditer(prose)]
    links = [m.group(1) for m in _LINK.finditer(_SPAN.sub("", prose))]
    return pieces, links


_SPLIT = re.compile(r"[\s'\"`,;()\[\]=|&]+")
_PLACEHOLDER = re.compile(r"[<>{}$]|\.\.\.|…")


_AT_COMMIT = re.compile(r"^([0-9a-f]{7,40}):(.+)$")


def path_words(code: str) -> Iterator[str]:
    """The words of ``code`` that name a repository path (rule a); ``REV:path`` kept whole."""
    for word in _SPLIT.split(code):
        at = _AT_COMMIT.match(word)
        if at:
            rev, word = at.groups()
        word = word.split("::")[0].split(":")[0].rstrip(".")
        word = word.removeprefix("./")
        if not word or _PLACEHOLDER.search(word):
            continue
        if word.startswith(FOREIGN_PREFIXES):
            continue
        if word in TOP_FILES or word.startswith(tuple(f"{t}/" for t in TOP_FOLDERS)):
            yield f"{rev}:{word}" if at else word


def missing_paths(text: str, document: Path, root: Path = REPO) -> list[str]:
    """Paths the document names that the tree does not have."""
    pieces, links = code_of(text)
    missing = [word for piece in pieces for word in path_words(piece) if not _exists(root, word)]
    for target in links:
        target = target.split("#")[0]
        if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target):  # web link, in-page anchor
            continue
        resolved = (document.parent / target).resolve()
        try:
            relative = resolved.relative_to(root.resolve()).as_posix()
        except ValueError:
            missing.append(f"{target} (outside the repository)")
            continue
        if not _exists(root, relative):
            missing.append(target)
    return missing


_NODE = re.compile(r"(?<![\w./-])((?:scenarios|tests)/[\w./-]+\.(?:ya?ml|py))::([^\s`'\"),;]+)")


def missing_node_ids(text: str, root: Path = REPO) -> list[str]:
    """``FILE::ID`` words in code whose ID the file does not define (rule a): a scenario id
    of a scenario file (loaded by kvconform's loader, which needs no vLLM), or a test
    function or class of a Python file."""
    from kvconform.harness.loader import load_file

    bad = []
    for piece in code_of(text)[0]:
        for file, node in _NODE.findall(piece):
            path = root / file
            if not path.is_file():
                continue  # missing_paths reports it
            if path.suffix == ".py":
                ids = set(_bound_names(path))
                node = re.split(r"::|\[", node)[0]
            else:
                ids = {scenario.id for scenario in load_file(path)}
            if node not in ids:
                bad.append(f"{file}::{node}")
    return bad


def _exists(root: Path, word: str) -> bool:
    at = _AT_COMMIT.match(word)
    if at:
        return _existed(root, *at.groups())
    if any(c in word for c in "*?"):
        return any(root.glob(word))
    return (root / word).exists()


@cache
def _existed(root: Path, rev: str, path: str) -> bool:
    """Whether ``path`` existed at commit ``rev``; True where the history is not at hand
    (no git, a shallow clone without that commit): nothing to hold the document to."""

    def git(*args: str) -> bool:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0

    if not git("cat-file", "-e", f"{rev}^{{commit}}"):
        return True
    return git("cat-file", "-e", f"{rev}:{path.rstrip('/')}")


# -- dotted module names -----------------------------------------------------------------

_DOTTED = re.compile(r"(?<![\w./-])kvconform(?:\.[A-Za-z_]\w*)+")


def module_file(dotted: str, root: Path = REPO) -> Path | None:
    """The file of module or package ``dotted`` in the tree, or None."""
    base = root.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def _bound_names(path: Path) -> dict[str, ast.AST]:
    """The names a module binds at top level (through if/try blocks too), with their node."""
    names: dict[str, ast.AST] = {}

    def visit(body: Iterable[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names[node.name] = node
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            names[name.id] = node
                exported = [t for t in node.targets if isinstance(t, ast.Name)]
                if [t.id for t in exported] == ["__all__"] and isinstance(node.value, ast.List):
                    # A name in __all__ may be served lazily (a module __getattr__).
                    for item in node.value.elts:
                        if isinstance(item, ast.Constant) and isinstance(item.value, str):
                            names.setdefault(item.value, node)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names[node.target.id] = node
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    names[(alias.asname or alias.name).split(".")[0]] = node
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return names


def _class_names(node: ast.ClassDef) -> set[str]:
    names: set[str] = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(item.name)
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
        elif isinstance(item, ast.Assign):
            names.update(t.id for t in item.targets if isinstance(t, ast.Name))
    return names


def unresolved_module_names(text: str, root: Path = REPO) -> list[str]:
    """Dotted ``kvconform.`` names in ``text`` that name nothing in the tree (rule b)."""
    bad = []
    for dotted in sorted(set(_DOTTED.findall(text))):
        parts = dotted.split(".")
        cut = max(n for n in range(1, len(parts) + 1) if module_file(".".join(parts[:n]), root))
        rest = parts[cut:]
        if not rest:
            continue
        path = module_file(".".join(parts[:cut]), root)
        assert path is not None
        node = _bound_names(path).get(rest[0])
        if node is None:
            bad.append(dotted)
        elif len(rest) > 1 and isinstance(node, ast.ClassDef):
            if rest[1] not in _class_names(node):
                bad.append(dotted)
    return bad


# -- commands ----------------------------------------------------------------------------


@cache
def subcommands() -> dict[str, tuple[str, ...]]:
    """Each subcommand of ``kvconform`` and the names of its own subcommands."""

    def children(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}

    return {name: tuple(children(p)) for name, p in children(build_parser()).items()}


@cache
def long_options() -> dict[str, tuple[str, ...]]:
    """Each subcommand's long options (``--x``), its own subcommands' included."""

    def options(parser: argparse.ArgumentParser) -> list[str]:
        found = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    found += options(child)
            found += [o for o in action.option_strings if o.startswith("--") and o != "--help"]
        return found

    top = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {name: tuple(dict.fromkeys(options(p))) for name, p in top.choices.items()}


# Where a word of code starts a command: a line's start (after a `$ ` prompt), or after
# `&&`, `||`, `|`, `-m` (python -m) or `run` (git bisect run). Elsewhere, as in a comment
# or a quoted message ("kvconform set ..."), the word is prose.
_AT_COMMAND = r"(?:^[ \t]*(?:\$[ \t]+)?|(?:&&|\|\||\||(?<![\w-])-m|(?<![\w-])run)[ \t]+)"
_COMMAND = re.compile(_AT_COMMAND + r"kvconform[ \t]+([a-z][\w-]*)(?:[ \t]+([a-z][\w-]*))?", re.M)


def unknown_commands(text: str) -> list[str]:
    """``kvconform WORD`` in the code of ``text`` that is no subcommand (rule c)."""
    known = subcommands()
    bad = []
    for piece in code_of(text)[0]:
        for match in _COMMAND.finditer(piece):
            name, sub = match.groups()
            if name not in known:
                bad.append(f"kvconform {name}")
            elif known[name] and sub is not None and sub not in known[name]:
                bad.append(f"kvconform {name} {sub}")
    return bad


@cache
def make_targets(makefile: Path = REPO / "Makefile") -> frozenset[str]:
    text = makefile.read_text(encoding="utf-8")
    return frozenset(re.findall(r"^([A-Za-z0-9_.-]+)[ \t]*:(?!=)", text, re.M))


_MAKE = re.compile(_AT_COMMAND + r"make((?:[ \t]+[^\s#;&|]+)+)", re.M)
_MAKE_OPTIONS_WITH_VALUE = {"-o", "-C", "-f", "-j", "-W", "--file", "--directory"}


def unknown_make_targets(text: str, targets: frozenset[str] | None = None) -> list[str]:
    """``make WORD`` in the code of ``text`` that is no Makefile target (rule c)."""
    targets = make_targets() if targets is None else targets
    bad = []
    for piece in code_of(text)[0]:
        for match in _MAKE.finditer(piece):
            words = match.group(1).split()
            skip = False
            for word in words:
                if skip:
                    skip = False
                    continue
                if word.startswith("-"):
                    skip = word in _MAKE_OPTIONS_WITH_VALUE
                    continue
                if "=" in word:
                    continue
                word = word.rstrip(".,:)")
                if re.fullmatch(r"[a-z][\w.-]*", word) and word not in targets:
                    bad.append(f"make {word}")
                break  # the first target; what follows is the target's arguments or prose
    return bad


# -- citations of what is not in the repository ------------------------------------------

NOTE_FILES = (
    "SLOT_ORACLE",
    "DESIGN",
    "VLLM_NOTES",
    "VLLM_TESTS",
    "MUTATION_NOTES",
    "SCHEDULER_MODE",
    "GPU",
)
_OUTSIDE = re.compile(
    r"\.\./share[d]\b"
    r"|\bshare[d]/(?:engine|seed|hooks|" + "|".join(NOTE_FILES) + r")\b"
    r"|(?<![\w/.-])(?:" + "|".join(NOTE_FILES) + r")[.]md\b"
    r"|(?<![\w.~-])/(?:wor[k]|roo[t])/"
    r"|(?<![\w.~-])/(?:hom[e]|User[s])/[A-Za-z_][\w.-]*/"
)
SCANNED = ("README.md", "scenarios", "docs", "kvconform", "tests", "tools", "ci", "benchmarks",
           "Makefile", "pyproject.toml", "conftest.py")  # fmt: skip


def outside_citations(text: str) -> list[tuple[int, str]]:
    """(line, what) for each citation of a file outside the repository (rule d)."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(0)) for m in _OUTSIDE.finditer(text)]


def scanned_files() -> Iterator[Path]:
    for name in SCANNED:
        path = REPO / name
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in files:
            if "__pycache__" in file.parts:
                continue
            try:
                file.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue  # binary data
            yield file


# -- the architecture and the command-line docs ------------------------------------------


def package_names(root: Path = REPO) -> list[str]:
    """Every package under kvconform/ and every module at its top, as paths."""
    package = root / "kvconform"
    names = [
        p.parent.relative_to(root).as_posix() + "/" for p in sorted(package.rglob("__init__.py"))
    ]
    names.remove("kvconform/")
    names += [p.relative_to(root).as_posix() for p in sorted(package.glob("*.py"))]
    return [n for n in names if not n.endswith(("/__init__.py", "/__main__.py"))]


def unnamed_packages(text: str, names: Iterable[str]) -> list[str]:
    """The packages and modules of ``names`` that ``text`` does not name (rule e)."""
    bad = []
    for name in names:
        bare = name.rstrip("/").removesuffix(".py")
        as_path = re.escape(name if name.endswith(".py") else bare) + r"(?![\w.])"
        as_dotted = re.escape(bare.replace("/", ".")) + r"(?![\w])"
        if not re.search(as_path, text) and not re.search(as_dotted, text):
            bad.append(name)
    return bad


def cli_doc_gaps(text: str) -> list[str]:
    """Subcommands, long options and checks that the text of docs/cli.md leaves out (rule f)."""
    code = "\n".join(code_of(text)[0])
    bad = [f"check {name}" for name in CHECKS if f"`{name}`" not in text]
    for name, children in subcommands().items():
        if not re.search(rf"kvconform[ \t]+{re.escape(name)}\b", code):
            bad.append(f"kvconform {name}")
        for child in children:
            if not re.search(rf"kvconform[ \t]+{re.escape(name)}[ \t]+{re.escape(child)}\b", code):
                bad.append(f"kvconform {name} {child}")
        for option in long_options()[name]:
            if not re.search(re.escape(option) + r"(?![\w-])", text):
                bad.append(f"kvconform {name} {option}")
    return bad


# -- the tests ---------------------------------------------------------------------------


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


@pytest.mark.parametrize("document", documents(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_path_a_document_names_exists(document: Path) -> None:
    text = _text(document)
    assert missing_paths(text, document) == [] and missing_node_ids(text) == []


@pytest.mark.parametrize("document", documents(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_module_a_document_names_exists(document: Path) -> None:
    assert unresolved_module_names(_text(document)) == []


@pytest.mark.parametrize("document", documents(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_command_a_document_names_exists(document: Path) -> None:
    text = _text(document)
    assert unknown_commands(text) == [] and unknown_make_targets(text) == []


def test_nothing_cites_a_file_outside_the_repository() -> None:
    found = {
        f"{path.relative_to(REPO)}:{line}": what
        for path in scanned_files()
        for line, what in outside_citations(_text(path))
    }
    assert found == {}, "restate what is needed in docs/ and cite that instead"


def test_the_architecture_names_every_package() -> None:
    assert unnamed_packages(_text(REPO / "docs" / "architecture.md"), package_names()) == []


def test_the_cli_doc_names_every_subcommand_and_option() -> None:
    assert cli_doc_gaps(_text(REPO / "docs" / "cli.md")) == []


def test_vllm_test_paths_are_not_the_repositorys() -> None:
    # FOREIGN_PREFIXES may skip them only while the repository has no such folder.
    assert not any((REPO / prefix).exists() for prefix in FOREIGN_PREFIXES)


# -- each checker can fail ---------------------------------------------------------------


def test_a_missing_path_is_reported(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "scenarios" / "warmup").mkdir(parents=True)
    (tmp_path / "scenarios" / "warmup" / "a.yaml").write_text("")
    document = tmp_path / "docs" / "x.md"
    text = (
        "See `scenarios/warmup/a.yaml` and `scenarios/warmup/*.yaml`, [here](../scenarios/)\n"
        "and `build/report/report.json`, `vllm/v1/core/kv_cache_manager.py`, `tests/v1/core`,\n"
        "`kvconform run scenarios/<name>.yaml`.\n"
        "```\nkvconform run scenarios/gone.yaml::some-id --report-dir build/x\n```\n"
        "Also `docs/gone.md:12`, `scenarios/spec/*.yaml` and [gone](gone.md#anchor)."
    )
    assert missing_paths(text, document, tmp_path) == [
        "scenarios/gone.yaml",
        "docs/gone.md",
        "scenarios/spec/*.yaml",
        "gone.md",
    ]


def test_a_path_at_a_commit_is_checked_against_that_commit() -> None:
    if _existed(REPO, "e4474e5", "kvconform/model/gone.py"):  # True: no history to ask
        pytest.skip("the repository's history (commit e4474e5) is not at hand")
    text = "`e4474e5:kvconform/model/lookahead.py`, `e4474e5:kvconform/model/gone.py`"
    assert missing_paths(text, REPO / "docs" / "x.md") == ["e4474e5:kvconform/model/gone.py"]


def test_an_unknown_scenario_or_test_id_is_reported(tmp_path: Path) -> None:
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "a.yaml").write_text(
        "name: a\nmatrix: {num_speculative_tokens: [1, 3]}\n"
        "speculative: {method: eagle, num_speculative_tokens: 1}\n"
        "requests: {r: {prompt_len: 4}}\nsteps: [{r: {prefill: 4}}]\n"
    )
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("def test_one():\n    pass\n")
    text = (
        "```\nkvconform run scenarios/a.yaml::a[k3] scenarios/a.yaml::a[k2]\n"
        "pytest tests/test_x.py::test_one tests/test_x.py::test_two[p]\n```\n"
        "and, indented after a blank line:\n\n    kvconform run scenarios/a.yaml::b\n"
    )
    assert missing_node_ids(text, tmp_path) == [
        "scenarios/a.yaml::a[k2]",
        "tests/test_x.py::test_two",
        "scenarios/a.yaml::b",
    ]


def test_an_unknown_module_or_attribute_is_reported(tmp_path: Path) -> None:
    package = tmp_path / "kvconform" / "model"
    package.mkdir(parents=True)
    (tmp_path / "kvconform" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "floors.py").write_text(
        "from x import y as imported\nclass FloorRule:\n    reason: str\n    def bind(self): ...\n"
        "TABLE = {}\n"
    )
    text = (
        "`kvconform.model.floors.FloorRule.reason`, kvconform.model.floors.TABLE, "
        "kvconform.model.floors.imported, kvconform.model.floors.FLOORS, "
        "kvconform.model.lookahead, kvconform.model.floors.FloorRule.gone, kvconform.model."
    )
    assert unresolved_module_names(text, tmp_path) == [
        "kvconform.model.floors.FLOORS",
        "kvconform.model.floors.FloorRule.gone",
        "kvconform.model.lookahead",
    ]


def test_an_unknown_command_or_make_target_is_reported() -> None:
    text = (
        "`kvconform run scenarios` and `kvconform engine record X`, then\n"
        "```\nkvconform groups build/report\nkvconform engine replay X\nmake -o x nightly lint\n"
        "make runall   # no such target\n```\n"
        "kvconform is a harness (prose, not code). `make test` `make VLLM=0.25.0 gpu-bundles`"
    )
    assert unknown_commands(text) == ["kvconform groups", "kvconform engine replay"]
    assert unknown_make_targets(text) == ["make runall", "make gpu-bundles"]


def test_a_citation_outside_the_repository_is_reported() -> None:
    note = "SLOT_ORACLE" + ".md"
    text = "\n".join(
        [
            "fine: docs/gpu.md, docs/slots.md, git clone --shared, /tmp/bug, ~/.cache/x",
            "see " + "../" + "shar" + "ed/GPU.md",
            "see " + "shar" + "ed/engine/README.md",
            "as " + note + " measured",
            "DESIGN" + ".md section 1",
            "at /wor" + "k/main/x and /roo" + "t/kvconform-engine/",
            "or /ho" + "me/alice/src",
        ]
    )
    assert [line for line, _ in outside_citations(text)] == [2, 3, 4, 5, 6, 6, 7]


def test_an_unnamed_package_is_reported(tmp_path: Path) -> None:
    for folder in ("kvconform", "kvconform/harness", "kvconform/harness/checks", "kvconform/peer"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "kvconform" / "errors.py").write_text("")
    names = package_names(tmp_path)
    assert names == [
        "kvconform/harness/",
        "kvconform/harness/checks/",
        "kvconform/peer/",
        "kvconform/errors.py",
    ]
    text = "`kvconform/harness/` (and kvconform.peer) with `kvconform/harness/checks.py`"
    assert unnamed_packages(text, names) == ["kvconform/harness/checks/", "kvconform/errors.py"]


def test_an_unnamed_subcommand_or_option_is_reported() -> None:
    text = _text(REPO / "docs" / "cli.md")
    without_mutate = re.sub(r"kvconform[ \t]+mutate", "kvconform", text)
    assert "kvconform mutate" in cli_doc_gaps(without_mutate)
    without_option = text.replace("--with-fuzz", "--fuzz")
    assert "kvconform mutate --with-fuzz" in cli_doc_gaps(without_option)
    without_check = text.replace("`sanity`", "sanity")
    assert cli_doc_gaps(without_check) == ["check sanity"]
