"""The corpus on the installed vLLM: what it covers, that it conforms, and that it exercises
what its scenarios claim (prefix hits, null columns, the max_model_len cap, rollback, pool
pressure) on the real allocator rather than merely passing.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvconform.fronts.cli import main
from kvconform.harness.drivers.trajectory import drive
from kvconform.harness.expectations import load_expectations
from kvconform.harness.loader import discover, load_paths
from kvconform.harness.runner import exit_status, run_all
from kvconform.model.floors import cdiv
from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.methods import expected_lookahead
from kvconform.model.results import Verdict
from kvconform.model.scenario import Scenario

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


@pytest.fixture(scope="module")
def corpus() -> list[Scenario]:
    loaded = load_paths([SCENARIOS])
    assert not loaded.errors, [str(e) for e in loaded.errors]
    return loaded.scenarios


def scenario(corpus: list[Scenario], scenario_id: str) -> Scenario:
    (found,) = [s for s in corpus if s.id == scenario_id]
    return found


def written_for(s: Scenario, version: str) -> bool:
    """Whether the scenario's ``vllm:`` requirement admits the release ``version``."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    if s.vllm_releases is None:
        return True
    release = Version(Version(version).base_version)
    return SpecifierSet(s.vllm_releases).contains(release, prereleases=True)


def lookahead_of(s: Scenario, vllm) -> int:
    if s.speculative is None:
        return 0
    spec = s.speculative
    table = expected_lookahead(
        vllm.canonical_method(spec.method), spec.num_speculative_tokens, spec.sample_from_anchor
    )
    assert table is not None
    return table if spec.num_lookahead_tokens is None else spec.num_lookahead_tokens


# -- coverage ----------------------------------------------------------------------------


def test_every_file_is_described_and_tagged(corpus):
    files = discover([SCENARIOS])
    assert len(files) >= 30
    for s in corpus:
        assert len(s.description) > 80, f"{s.id}: say what the scenario is about and why"
        assert s.tags, f"{s.id}: no tags"
        assert Path(s.file).stem == s.name, f"{s.file}: name and file name differ"


def test_every_group_type_the_installed_vllm_offers_is_covered(corpus, vllm):
    offered = set(vllm.offered_spec_classes())
    buildable = {name for name, t in GROUP_TYPES.items() if t.vllm_class in offered}
    used = {g.type for s in corpus for g in s.model.groups}
    assert buildable - used == set()
    modes = {g.options.get("mamba_cache_mode") for s in corpus for g in s.model.groups}
    assert {"none", "align"} <= modes
    assert any(s.model.max_encoder_len and s.model.groups for s in corpus)
    # Hybrids with several block sizes in one model.
    assert any(len({g.block_size for g in s.model.groups}) >= 3 for s in corpus)


def test_methods_cover_every_lookahead_family(corpus, vllm):
    methods = {vllm.canonical_method(s.speculative.method) for s in corpus if s.speculative}
    assert len(methods) >= 6
    assert {"eagle", "eagle3", "mtp", "draft_model", "dflash", "dspark", "ngram"} <= methods
    assert any(s.speculative is None for s in corpus)
    anchors = {s.speculative.sample_from_anchor for s in corpus if s.speculative}
    assert anchors == {True, False}


def test_edges_are_covered(corpus, vllm):
    def calls(s: Scenario):
        return [c for step in s.steps for c in step.calls]

    capped = [
        s
        for s in corpus
        if lookahead_of(s, vllm)
        and any(
            c.computed + c.scheduled + lookahead_of(s, vllm) > s.model.max_model_len
            for c in calls(s)
        )
    ]
    assert capped, "no step where max_model_len caps the lookahead"
    assert any(sum(c.rejected > 0 for c in calls(s)) >= 50 for s in corpus), "no long rollback"
    assert any(any(c.action.value == "preempt" for c in calls(s)) for s in corpus)
    assert any(
        s.model.enable_caching and any(r.prefix_from for r in s.requests.values()) for s in corpus
    )
    assert any(len(s.requests) >= 4 and s.model.num_blocks <= 32 for s in corpus)


# -- conformance -------------------------------------------------------------------------


def test_corpus_conforms_with_every_known_divergence_listed_and_used(corpus, vllm):
    expectations = load_expectations(SCENARIOS / "expectations.yaml")
    results = list(run_all(corpus, vllm, expectations=expectations))
    # A scenario written for newer releases than the installed one says so (its vllm:
    # field): unsupported here by its own word, and the release matrix runs it there.
    newer = {s.id for s in corpus if not written_for(s, vllm.version)}
    bad = [
        f"{r.id}: {r.verdict.value} {r.headline()}"
        for r in results
        if not r.ok and not (r.id in newer and r.verdict is Verdict.UNSUPPORTED)
    ]
    assert not bad, "\n".join(bad)
    assert exit_status(results) == 0
    assert not [r.id for r in results if r.verdict is Verdict.XPASSED]
    for entry in expectations:
        assert entry.evidence, f"{entry.pattern}: no evidence"
        if entry.pattern.startswith("fuzz-probe-"):
            continue  # used by kvconform fuzz's probes (tests/test_fuzz.py checks them)
        assert any(entry.matches(r.id) for r in results), f"{entry.pattern} matches no scenario"
        if entry.vllm is not None and vllm.version not in entry.vllm:
            continue  # another release's divergence (tests/test_release_matrix.py runs them)
        assert any(entry.applies(r.id, vllm.version) for r in results), f"{entry.pattern} unused"


# -- the scenarios exercise what they claim ----------------------------------------------


def _first_tables(run):
    first: dict[str, list[int]] = {}
    for obs in run.observations:
        first.setdefault(obs.request, list(obs.block_ids or ()))
    return first


def test_prefix_caching_scenario_gets_real_hits(corpus, vllm):
    # b shares 96 prompt tokens (6 blocks) with a, c shares 64 (4 blocks).
    first = _first_tables(drive(scenario(corpus, "prefix-caching-shared-prefix[dflash]"), vllm))
    assert first["b"][:6] == first["a"][:6] and first["b"][6] != first["a"][6]
    assert first["c"][:4] == first["a"][:4] and first["c"][4] != first["a"][4]
    # With EAGLE the scheduler builds the manager with lookahead block hashes (0.33:
    # each hash also covers the next token, which the drafter's KV depends on), so
    # the 6th shared block of b, followed by a token a does not have, is no hit.
    eagle = _first_tables(drive(scenario(corpus, "prefix-caching-shared-prefix[eagle]"), vllm))
    assert eagle["b"][:5] == eagle["a"][:5] and eagle["b"][5] != eagle["a"][5]


def test_sliding_window_scenario_drops_blocks_out_of_the_window(corpus, vllm):
    run = drive(scenario(corpus, "sliding-window-rollback-keeps-window[eagle]"), vllm)
    columns = [list(o.block_ids or ()) for o in run.observations]
    assert any(run.null_block in ids for ids in columns)
    # Column counts never shrink: a null keeps its column.
    counts = [len(ids) for ids in columns]
    assert counts == sorted(counts)


def test_max_model_len_scenario_reaches_the_cap(corpus, vllm):
    s = scenario(corpus, "max-model-len-caps-lookahead[dflash]")
    run = drive(s, vllm)
    limit, block = s.model.max_model_len, s.model.groups[0].block_size
    capped = [
        o
        for o in run.observations
        if o.group == 0 and o.computed + o.scheduled + o.lookahead > limit
    ]
    assert capped
    assert all(o.live == cdiv(limit, block) for o in capped)


def test_long_rollback_scenario_needs_the_running_maximum(corpus, vllm):
    run = drive(scenario(corpus, "long-rollback-run-holds-blocks[eagle]"), vllm)
    shrinking = [
        o
        for o in run.observations
        if o.predicted is not None and o.predicted_max is not None and o.predicted < o.predicted_max
    ]
    assert shrinking, "no step needed fewer blocks than an earlier one"
    assert all(o.live == o.predicted_max for o in shrinking)


def test_pool_pressure_scenario_runs_the_pool_nearly_dry(corpus, vllm):
    run = drive(scenario(corpus, "pool-pressure-requests-take-turns"), vllm)
    assert min(e.free_before for e in run.events) <= 2
    assert run.final_free_blocks == run.num_blocks - 1


def test_an_overfull_pool_is_exit_2_naming_the_step_and_the_rest_runs(vllm, tmp_path, capsys):
    folder = tmp_path / "scenarios"
    folder.mkdir()
    source = (SCENARIOS / "regressions" / "pool-pressure-requests-take-turns.yaml").read_text()
    assert source.count("num_blocks: 20") == 1
    (folder / "too-small.yaml").write_text(source.replace("num_blocks: 20", "num_blocks: 14"))
    (folder / "fine.yaml").write_text(
        (SCENARIOS / "methods" / "no-speculation-plain-decode.yaml").read_text()
    )
    status = main(["run", str(folder), "--report-dir", str(tmp_path / "report"), "-v"])
    out = capsys.readouterr().out
    assert status == 2
    assert re.search(
        r"too-small\.yaml:\d+: steps\[\d+\]\.[a-d]: by the floor's own arithmetic .* of "
        r"request '[a-d]' needs \d+ .*, but the pool of 14 blocks has \d+ to give",
        out,
    ), out
    assert "Traceback" not in out
    assert re.search(r"PASSED +no-speculation-plain-decode", out)
