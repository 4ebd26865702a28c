"""One place per concept: group types, methods and checks are registries, read everywhere.

The registries (kvconform/model/group_types.py, kvconform/model/methods.py, the
Check records under kvconform/harness/checks/) are the only place that knows what
a group type, a speculative method or a check is. These tests fail when vLLM offers
something a registry lacks, when a registry entry is incomplete, and when any other
module spells a group type's or a method's name (a parallel table in the making).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kvconform.harness.checks import CHECKS, DEFAULT_CHECKS
from kvconform.model.group_types import GROUP_TYPES, NOT_BUILDABLE, group_type_for_class
from kvconform.model.methods import METHODS, REGISTRY_FILE, method_for, registry
from kvconform.model.kinds import KINDS
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
