"""One place per concept: group types, methods and checks are registries, read everywhere.

The registries (kvconform/model/group_types.py, kvconform/model/methods.py, the
Check records under kvconform/harness/checks/) are the only place that knows what
a group type, a speculative method or a check is. These tests fail when vLLM offers
something a registry lacks, when a registry entry is incomplete, and when any other
module spells a group type's or a method's name (a parallel table in the making). The
scenario kinds (kvconform/model/kinds.py) and the parties (kvconform/model/parties.py)
are registries too: no other module compares or maps them as string literals.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from kvconform.harness.checks import CHECKS, DEFAULT_CHECKS
from kvconform.harness.loader import load_paths
from kvconform.model.group_types import GROUP_TYPES, NOT_BUILDABLE, group_type_for_class
from kvconform.model.kinds import EVERY_KIND_WITH_GROUPS, KINDS, Kind, kind_of
from kvconform.model.methods import METHODS, REGISTRY_FILE, method_for, registry
from kvconform.model.observations import Trajectory
from kvconform.model.parties import PARTIES, Party
from kvconform.model.recording import Recording, dumps, loads
from kvconform.model.tiny_model import ARCHITECTURES

ROOT = Path(__file__).resolve().parents[1]
REGISTRIES = {"kvconform/model/group_types.py", REGISTRY_FILE}


def _spelled_names(path: Path, names: set[str]) -> list[tuple[int, str]]:
    """String constants of ``path`` that are exactly one of ``names``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
    ]


def test_only_the_registries_spell_group_type_and_method_names() -> None:
    names = set(GROUP_TYPES) | set(METHODS)
    spelled = {
        str(path.relative_to(ROOT)): found
        for path in sorted((ROOT / "kvconform").rglob("*.py"))
        if str(path.relative_to(ROOT)) not in REGISTRIES and (found := _spelled_names(path, names))
    }
    assert spelled == {}, (
        "these modules name group types or methods; read the registry instead "
        f"(GroupType / Method attributes): {spelled}"
    )


def test_the_scan_sees_a_spelled_name(tmp_path: Path) -> None:
    # The scan above must be able to fail: a module comparing a type name is caught.
    module = tmp_path / "bad.py"
    module.write_text('def f(g):\n    return g.type == "mamba"\n', encoding="utf-8")
    assert _spelled_names(module, set(GROUP_TYPES)) == [(2, "mamba")]


def test_every_group_type_entry_is_complete() -> None:
    for name, group_type in GROUP_TYPES.items():
        assert group_type.modes <= set(KINDS), name
        assert len(group_type.floor.reason) > 20 and group_type.floor.family, name
        required = {n for n, o in group_type.options.items() if o.required}
        # The fuzzer can draw it and probe it: otherwise it drops out of the search.
        assert required <= {n for n, o in group_type.options.items() if o.draw is not None}, name
        assert required <= set(group_type.probe_options()), name
        if group_type.speculative_blocks is not None:
            assert group_type.speculative_blocks in group_type.options, name
        if group_type.reads is not None:
            assert group_type.reads[1] in group_type.options, name
    # The kinds that build groups from a plain decoder take at least full attention.
    for kind in ("scheduler", "engine"):
        assert any(kind in t.modes for t in GROUP_TYPES.values()), kind


def test_every_method_entry_is_complete() -> None:
    for name, method in METHODS.items():
        assert method.name == name
        assert len(method.rule.reason) > 20 and method.rule.formula, name
        assert method.lookahead(3, True) >= 0 and method.lookahead(3, False) >= 0, name
        assert method.target.architecture in ARCHITECTURES, name
        assert method.draft is None or method.draft.architecture in ARCHITECTURES, name
    ranks = [m.fuzz_rank for m in METHODS.values() if m.fuzz_rank is not None]
    assert len(ranks) == len(set(ranks)), "two methods share a fuzz rank"


def test_a_method_declared_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="declared twice"):
        registry([METHODS["eagle"]])


def test_every_check_record_is_complete() -> None:
    assert set(DEFAULT_CHECKS) < set(CHECKS)
    for name, check in CHECKS.items():
        assert check.name == name and len(check.judges) > 20, name
        assert callable(check.find) and callable(check.blame) and callable(check.signature)


def test_every_method_vllm_declares_has_an_entry(vllm) -> None:
    missing = sorted(
        {
            vllm.canonical_method(m)
            for m in vllm.declared_methods()
            if method_for(vllm.canonical_method(m)) is None
        }
    )
    assert missing == [], f"vLLM {vllm.version} declares methods without an entry: {missing}"


def test_every_spec_class_vllm_offers_has_an_entry_or_a_reason(vllm) -> None:
    missing = [
        name
        for name in vllm.offered_spec_classes()
        if group_type_for_class(name) is None and name not in NOT_BUILDABLE
    ]
    assert missing == [], f"vLLM {vllm.version} offers spec classes without an entry: {missing}"


# -- kinds and parties ------------------------------------------------------------------

# The registries spell kind and party names; every other module reads Kind and Party.
SPELL_KINDS_AND_PARTIES = {"kvconform/model/kinds.py", "kvconform/model/parties.py"}
# Calls that take a party, and where (a blame, a record's party, the data flow).
PARTY_ARGUMENT = {"blame": 0, "named": 1, "upstream_of": 0, "failure_at": 5}


def _words(node: ast.AST) -> str:
    """The name a node reads, lower-cased: ``scenario.kind`` -> ``kind``, ``PARTIES`` ->
    ``parties``; empty for anything else."""
    if isinstance(node, ast.Name):
        return node.id.lower()
    if isinstance(node, ast.Attribute):
        return node.attr.lower()
    if isinstance(node, ast.Call):
        return _words(node.func)
    return ""


def _constants(node: ast.AST, names: set[str]) -> list[str]:
    """The names of ``names`` that ``node`` spells: a string constant, or a tuple, list or
    set of them (all of ``names``, an empty list otherwise); ``frozenset({...})`` too."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value] if node.value in names else []
    if isinstance(node, ast.Call) and _words(node.func) in ("frozenset", "set", "tuple"):
        return _constants(node.args[0], names) if len(node.args) == 1 else []
    if isinstance(node, ast.Tuple | ast.List | ast.Set) and node.elts:
        found = [_constants(e, names) for e in node.elts]
        if all(len(f) == 1 for f in found):
            return [f[0] for f in found]
    return []


def _spelled_as_literals(tree: ast.AST, names: set[str], about: tuple[str, ...]) -> list[int]:
    """Lines where a name of ``names`` is compared or mapped as a string literal: compared
    with (or tested for membership in) something whose name holds one of ``about``; passed
    as a keyword of such a name; subscripted from such a mapping; the key of a mapping, or
    the members of a collection, made of such names only (two or more)."""
    lines: list[int] = []

    def about_it(node: ast.AST) -> bool:
        return any(word in _words(node) for word in about)

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(about_it(o) for o in operands) and any(_constants(o, names) for o in operands):
                lines.append(node.lineno)
        elif isinstance(node, ast.keyword) and node.arg and any(w in node.arg for w in about):
            if _constants(node.value, names):
                lines.append(node.value.lineno)
        elif isinstance(node, ast.Subscript) and about_it(node.value):
            if _constants(node.slice, names):
                lines.append(node.lineno)
        elif isinstance(node, ast.Call) and _words(node.func) in PARTY_ARGUMENT:
            at = PARTY_ARGUMENT[_words(node.func)]
            if "part" in about and len(node.args) > at and _constants(node.args[at], names):
                lines.append(node.lineno)
        elif isinstance(node, ast.Call) and _words(node.func) == "get" and node.args:
            key = node.args[0]
            named_key = isinstance(key, ast.Constant) and any(w in str(key.value) for w in about)
            if (about_it(key) or named_key) and any(_constants(a, names) for a in node.args[1:]):
                lines.append(node.lineno)
        elif isinstance(node, ast.Dict) and len(node.keys) >= 2:
            if all(k is not None and _constants(k, names) for k in node.keys):
                lines.append(node.lineno)
        elif isinstance(node, ast.Tuple | ast.List | ast.Set) and len(node.elts) >= 2:
            if len(_constants(node, names)) == len(node.elts):
                lines.append(node.lineno)
    return sorted(set(lines))


KIND_NAMES = {k.value for k in Kind}
PARTY_NAMES = {p.value for p in Party}


def kind_and_party_literals(path: Path) -> list[tuple[int, str]]:
    """Where ``path`` compares or maps a kind or a party as a string literal."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    kinds = _spelled_as_literals(tree, KIND_NAMES, ("kind",))
    parties = _spelled_as_literals(tree, PARTY_NAMES, ("part",))
    return sorted({(line, "kind") for line in kinds} | {(line, "party") for line in parties})


def test_only_the_registries_spell_kinds_and_parties() -> None:
    spelled = {
        rel: found
        for path in sorted((ROOT / "kvconform").rglob("*.py"))
        if (rel := str(path.relative_to(ROOT))) not in SPELL_KINDS_AND_PARTIES
        and (found := kind_and_party_literals(path))
    }
    assert spelled == {}, (
        "these modules compare or map a scenario kind or a party as a string; read Kind, "
        f"Party and their registries (KINDS, PARTIES) instead: {spelled}"
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('def f(s):\n    return s.kind == "warmup"\n', [(2, "kind")]),
        ('def f(s):\n    return s.kind in ("engine", "startup")\n', [(2, "kind")]),
        ('LIVE = {"scheduler": "scheduler", "engine": "engine"}\n', [(1, "kind"), (1, "party")]),
        ('def f(r):\n    return Failure("x", party="live")\n', [(2, "party")]),
        ('def f(r):\n    return r.party or "predicted"\n', []),  # not a comparison
        ('def f(r):\n    return r.party == "config"\n', [(2, "party")]),
        ('def f(r):\n    return PARTY_NAMES["warmup"]\n', [(2, "party")]),
        ('def f(r):\n    return Blame("config", "x")\n', [(2, "party")]),
        ('def f(r):\n    return BY_KIND.get(r.kind, "trajectory")\n', [(2, "kind")]),
        ('def f(entry):\n    return entry.get("kind", "trajectory")\n', [(2, "kind")]),
        ('PARTIES = ("live", "warmup")\n', [(1, "party")]),
        # A YAML section or a check that shares a name is no kind or party.
        ('def f(top):\n    return top.raw("scheduler")\n', []),
        ('CHECKS = ("agree", "slots")\n', []),
        ('def f(t, o):\n    return failure_at("slots", t, o, "m", None, Party.SLOTS)\n', []),
    ],
)
def test_the_scan_sees_a_kind_or_party_literal(
    tmp_path: Path, source: str, expected: list[tuple[int, str]]
) -> None:
    module = tmp_path / "bad.py"
    module.write_text(source, encoding="utf-8")
    assert kind_and_party_literals(module) == expected



def test_every_kind_has_a_loader_a_driver_and_a_live_party() -> None:
    from kvconform.harness.drivers import DRIVERS
    from kvconform.harness.loader.kinds import LOADERS

    assert set(KINDS) == set(Kind) == set(LOADERS) == set(DRIVERS)
    for kind, entry in KINDS.items():
        assert entry.kind is kind
        assert len(entry.description) > 20 and entry.sections, kind
        assert entry.live_party in Party and Party.LIVE in entry.recorded, kind
        assert set(entry.recorded) <= set(PARTIES), kind
        assert kind_of(entry.spec.__new__(entry.spec)) is kind, kind
    assert len({e.spec for e in KINDS.values()}) == len(KINDS), "two kinds share a spec"
    # The kinds that take the scenario's own groups take every group type (GroupType.modes).
    for kind in EVERY_KIND_WITH_GROUPS:
        assert all(
            kind in t.modes for t in GROUP_TYPES.values() if t.modes >= EVERY_KIND_WITH_GROUPS
        )


def test_every_corpus_scenario_carries_its_kinds_spec() -> None:
    loaded = load_paths([str(ROOT / "scenarios")])
    assert loaded.errors == []
    assert {s.kind for s in loaded.scenarios} == set(Kind), "the corpus has every kind"
    for scenario in loaded.scenarios:
        assert isinstance(scenario.spec, KINDS[scenario.kind].spec), scenario.id
        views = [scenario.warmup, scenario.scheduler, scenario.engine, scenario.startup]
        assert sum(v is not None for v in views) == (scenario.kind != Kind.TRAJECTORY)


def test_every_party_entry_is_complete() -> None:
    assert set(PARTIES) == set(Party)
    for name, code in PARTIES.items():
        assert code.name is name and code.description and code.function, name
        assert code.file.startswith("vllm/") and code.file.endswith(".py"), name
        assert set(code.reads) <= set(Party), name


def test_kinds_and_parties_are_written_as_their_names() -> None:
    # Recordings, report.json and the reports' text keep the plain names they had.
    assert json.dumps({Party.LIVE: [Kind.WARMUP]}) == '{"live": ["warmup"]}'
    assert f"{Party.DFLASH_SLOTS} {Kind.SCHEDULER}" == "dflash_slots scheduler"
    assert {"live": 1}[Party.LIVE] == 1 and Kind("engine") is Kind.ENGINE
    assert f"{Party.LIVE!r} {[Kind.STARTUP]}" == "'live' ['startup']"
    enums = Trajectory((), 0, "vllm", parties=(Party.LIVE, Party.WARMUP))
    strings = Trajectory((), 0, "vllm", parties=("live", "warmup"))
    as_enums = dumps(Recording("x", "x.yaml", Kind.WARMUP, enums))
    assert as_enums == dumps(Recording("x", "x.yaml", "warmup", strings))
    assert loads(as_enums) == Recording("x", "x.yaml", "warmup", strings)
