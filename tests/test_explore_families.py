"""``kvconform explore`` finds an injected bug of each invariant family (slow: vLLM in
fresh processes).

Issue 35's first "done when": ``kvconform explore --seed 0`` exits 1 with a reproducer on
a tree with an injected bug of each invariant family. One test per family: a one-line bug
put into a copy of vLLM's tree (:func:`vllm_copy.tree_with_replacement`), the explorer run
on it with seed 0, and then

* it exits 1, with a finding of the family's signature in ``explore-summary.json`` (its
  check, and for ``sanity`` the invariant; vLLM's frame for a crash), written as a
  reproducer of the family's kind (a scheduler workload; a startup or warmup document for
  those families) whose name the family's glob matches;
* that reproducer fails with ``kvconform run`` on the copy (the same message, or vLLM's
  same raise), and the unmodified vLLM (this process's) does not fail it with that
  signature: it is the bug, not the workload. (It need not exit 0 there: a shrunk workload
  may keep a finding the pinned vLLM has itself, docs/explore.md, as the KV-events one
  keeps a Mamba group's ``ceiling``.)

The allocator off-by-one (family ``floor``) is tests/test_explore.py's.

**Budgets.** Each run compares with the unmodified vLLM as it goes (``--baseline-src``, the
differential baseline of docs/explore.md): a failure the pinned vLLM shows on the same
workload is passed over, not counted. So each run stops at its first finding that the bug
makes (``--max-findings 1``), wherever seed 0 meets the pinned vLLM's own findings (#20's
sliding-window finding came first for the KV-events bug once the encoder sizes were drawn),
and the budget is only a bound for a slow machine. Drawing each example's kind first (startup
and warmup documents, one example in ten each) changed seed 0's sequence again; each entry's
comment says at which example its finding came before kinds and encoder sizes were drawn.

**Each fails when its invariant is removed.** Shown by hand once per family, not in CI: in
a copy of kvconform whose ``judge()`` drops the failures of the family's invariant (its
``detail["invariant"]``, or the whole check for ``ceiling`` and ``lookahead``), and whose
``signed_failures`` does not sign vLLM's raise as a ``crash`` for the crash family, each
family's test fails: the explorer reports another signature first (``agree`` for
``ceiling``, ``sanity / - / leaks blocks`` for ``conservation``, the pinned vLLM's own
``capacity / schedule`` at example 33 for the seven others). The four families added at
the fifth stop (the encoder's budget and cache, liveness, fairness, startup, warmup) were not
shown so by hand: each asserts its own invariant's message, which no other family writes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

import pytest
from vllm_copy import run_kvconform, tree_with_replacement

from kvconform.fuzz.findings import signatures
from kvconform.harness.checks.bookkeeping import STALE_ENTRY
from kvconform.harness.checks.ceiling import OVER_COLUMNS
from kvconform.harness.checks.conservation import NOT_CONSERVED
from kvconform.harness.checks.fairness import PASSED
from kvconform.harness.checks.liveness import NO_PROGRESS
from kvconform.harness.loader import load_text
from kvconform.harness.runner import run_scenario
from kvconform.model.observations import (
    ENCODER_BUDGET_EXCEEDED,
    ENCODER_CACHE_OVERFLOW,
    EVENTS_DIVERGE,
    FREED_IN_FLIGHT,
    NOT_ZEROED,
    STATS_DISAGREE,
)
from kvconform.oracles.vllm import Vllm


@dataclass(frozen=True)
class Family:
    """An invariant family's injected bug and the finding that must show it."""

    module: str  # under vllm/
    old: str  # the text the module holds once
    new: str  # its replacement: the bug
    signature: str  # the start of the finding's signature
    pattern: str  # the reproducer's file name
    kind: str = "scheduler"  # the kind of the reproducer (a startup or warmup document)


# --budget: only a bound for a slow machine; each run stops at its first finding.
BUDGET = 60


FAMILIES: dict[str, Family] = {
    # Over-allocation: the base manager takes one block more than the tokens need on
    # every growth (tests/test_contract.py's OVER_ALLOCATE). Found at example 1.
    "ceiling": Family(
        "v1/core/single_type_kv_cache_manager.py",
        "        num_new_blocks = num_required_blocks - len(req_blocks)\n"
        "        if num_new_blocks <= 0:\n"
        "            return cow_blocks\n",
        "        num_new_blocks = num_required_blocks + 1 - len(req_blocks)\n"
        "        if num_new_blocks <= 0:\n"
        "            return cow_blocks\n",
        f"ceiling / {OVER_COLUMNS} / ",
        "explore-s0-*-ceiling-holds-more-columns-*.yaml",
    ),
    # Conservation: the manager's free() skips the request's first block (a slice off
    # by one), which stays neither free nor held. Found at example 1.
    "conservation": Family(
        "v1/core/single_type_kv_cache_manager.py",
        "        self.block_pool.free_blocks(reversed(self.pop_blocks_for_free(request_id)))\n",
        "        self.block_pool.free_blocks(reversed(self.pop_blocks_for_free(request_id)[1:]))\n",
        f"sanity / - / {NOT_CONSERVED}",
        "explore-s0-*-sanity-counts-other-blocks-free-and-held-*.yaml",
    ),
    # Lookahead: DFlash's config forgets the bonus query of fill-in drafting (k, not
    # k + 1 slots past the scheduled range), so every party reserves one slot short.
    # Found at example 3.
    "lookahead": Family(
        "v1/worker/gpu/spec_decode/dflash/config.py",
        "        return self.num_speculative_tokens + 1\n",
        "        return self.num_speculative_tokens\n",
        "lookahead / dflash",
        "explore-s0-*-lookahead-dflash.yaml",
    ),
    # Zeroing: vLLM stops recording its full-attention groups' new blocks for zeroing, so
    # in a model with Mamba layers the attention kernel reads what a freed state block
    # held (tests/test_contract.py's NO_ATTENTION_ZEROING). Found at example 3.
    "zeroing": Family(
        "v1/core/single_type_kv_cache_manager.py",
        "            and not isinstance(kv_cache_spec, CircularBufferSpec)",
        "            and not isinstance(kv_cache_spec, (CircularBufferSpec, FullAttentionSpec))",
        f"sanity / - / {NOT_ZEROED}",
        "explore-s0-*-sanity-leaves-a-new-block-off-the-worker-s-zeroing-*.yaml",
    ),
    # Bookkeeping: pop_blocks_for_free forgets the request's num_cached_block entry, a
    # map that then only grows (tests/test_contract.py's KEEPS_CACHED_COUNT). Found at
    # example 3.
    "bookkeeping": Family(
        "v1/core/single_type_kv_cache_manager.py",
        "        self.num_cached_block.pop(request_id, None)\n"
        "        self._partial_hit_reqs.pop(request_id, None)\n",
        "        self._partial_hit_reqs.pop(request_id, None)\n",
        f"sanity / - / {STALE_ENTRY}",
        "explore-s0-*-sanity-keeps-per-request-state-*.yaml",
    ),
    # Deferred frees: with a KV consumer connector and batches in flight, a finished
    # request's blocks go back to the pool one step early (the in-flight fence off by
    # one). Found at example 25.
    "deferred-free": Family(
        "v1/core/sched/scheduler.py",
        "            request.last_sched_seq <= self.processed_step_seq\n",
        "            request.last_sched_seq <= self.processed_step_seq + 1\n",
        f"sanity / - / {FREED_IN_FLIGHT}",
        "explore-s0-*-sanity-returns-a-request-s-blocks-while-a-step-*.yaml",
    ),
    # KV-cache events: evicting a cached block no longer announces BlockRemoved, so a
    # router following the events believes the prefix cache still holds it. Found at
    # example 9 before kinds were drawn; now after #14 (example 85), passed over as the
    # unmodified tree's.
    "kv-events": Family(
        "v1/core/block_pool.py",
        "        self._emit_block_removed_events(evicted_hashes)\n        return True\n",
        "        return True\n",
        f"sanity / - / {EVENTS_DIVERGE}",
        "explore-s0-*-sanity-announces-another-prefix-cache-*.yaml",
    ),
    # Stats: a prefix-cache lookup counts one query token fewer than the request has (as
    # if the last token, which is always recomputed, were no query), so the step's
    # SchedulerStats disagree with its admissions. Found at example 3.
    "stats": Family(
        "v1/core/kv_cache_manager.py",
        "            num_tokens=request.num_tokens,\n            num_hits=num_hits,\n",
        "            num_tokens=request.num_tokens - 1,\n            num_hits=num_hits,\n",
        f"sanity / - / {STATS_DISAGREE}",
        "explore-s0-*-sanity-reports-other-scheduler-stats-*.yaml",
    ),
    # Crash: Scheduler.schedule's closing check of its batch is one too strict (a full
    # batch of max_num_seqs requests raises). The finding names vLLM's frame: the
    # assertion's own line. Found at example 3.
    "crash": Family(
        "v1/core/sched/scheduler.py",
        "        assert len(self.running) <= self.max_num_running_reqs\n",
        "        assert len(self.running) < self.max_num_running_reqs\n",
        "crash / AssertionError / vllm/v1/core/sched/scheduler.py:{line} schedule",
        "explore-s0-*-crash-assertionerror-vllm-v1-core-sched-scheduler-py-*.yaml",
    ),
    # Encoder budget: a step's encoder budget is no longer charged for an input it
    # schedules, so one step runs the encoder on more embeddings than the budget allows.
    "encoder-budget": Family(
        "v1/core/sched/scheduler.py",
        "            num_embeds_to_schedule += num_encoder_embeds\n"
        "            encoder_compute_budget -= num_encoder_embeds\n",
        "            num_embeds_to_schedule += num_encoder_embeds\n",
        f"sanity / - / {ENCODER_BUDGET_EXCEEDED}",
        "explore-s0-*-sanity-runs-more-encoder-embeddings-*.yaml",
    ),
    # Encoder cache: an input evicted to make room is not announced to the worker
    # (free_encoder_mm_hashes), which keeps its output and outgrows the cache.
    "encoder-eviction": Family(
        "v1/core/encoder_cache_manager.py",
        "            self.freed.append(mm_hash)\n            self.num_free_slots += num_free_embeds\n",
        "            self.num_free_slots += num_free_embeds\n",
        f"sanity / - / {ENCODER_CACHE_OVERFLOW}",
        "explore-s0-*-sanity-keeps-more-encoder-embeddings-*.yaml",
    ),
    # Liveness: every fourth schedule() serves no running request although they fit the
    # pool (tests/test_liveness.py's STARVES_RUNNING).
    "liveness": Family(
        "v1/core/sched/scheduler.py",
        "        while req_index < len(self.running) and token_budget > 0:",
        "        while (\n"
        "            req_index < len(self.running) and token_budget > 0\n"
        "            and self.current_step % 4 != 0\n"
        "        ):",
        f"sanity / - / {NO_PROGRESS}",
        "explore-s0-*-sanity-schedules-nothing-*.yaml",
    ),
    # Fairness: the head of the waiting queue is deferred while another request waits
    # behind it, so a later arrival is admitted first (tests/test_liveness.py's
    # PASSES_THE_HEAD). Its running-queue twin (SKIPS_RUNNING) shows first as a step that
    # schedules nothing, the liveness family's.
    "fairness": Family(
        "v1/core/sched/scheduler.py",
        "                ready_to_schedule = self._handle_blocked_waiting_request(request)",
        "                ready_to_schedule = self._handle_blocked_waiting_request(request) and (\n"
        "                    len(request_queue) < 2\n"
        "                )",
        f"sanity / - / {PASSED}",
        "explore-s0-*-sanity-admits-a-later-request-*.yaml",
    ),
    # Startup planning: get_kv_cache_configs checks the pool (and auto-fits max_model_len)
    # against the whole memory again, the null block BlockPool keeps back counted as usable
    # (the second half of realbugs/patches/capacity-check-counts-null-block.patch). A
    # startup document at the edge (a pool of exactly one max_model_len request) shows it.
    "startup": Family(
        "v1/core/kv_cache_planning.py",
        "            avail_mem - _pool_bytes_per_block_from_builder(builder, vllm_config, groups)\n",
        "            avail_mem\n",
        "startup / accepts a pool ",
        "explore-s0-*-startup-accepts-*.yaml",
        kind="startup",
    ),
    # Warmup: the model runner's warmup reserves blocks without the speculative lookahead
    # (realbugs/patches/warmup-ignores-spec-lookahead.patch's lookahead half), so the
    # recorded warmup holds fewer blocks than the floor of what its drafter writes.
    "warmup": Family(
        "v1/worker/gpu/warmup.py",
        "    num_lookahead_tokens = vllm_config.num_lookahead_tokens\n",
        "    num_lookahead_tokens = 0\n",
        "floor / warmup / ",
        "explore-s0-*-floor-warmup-*.yaml",
        kind="warmup",
    ),
}


def _signature(family: Family, tree: Path) -> str:
    """The signature's start; ``{line}`` is where the bug sits in the copy (a crash's frame)."""
    text = (tree / "vllm" / family.module).read_text(encoding="utf-8")
    line = text[: text.index(family.new)].count("\n") + 1
    return family.signature.format(line=line)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_explore_finds_the_injected_bug_of_each_invariant_family(
    name: str, tmp_path: Path, vllm: Vllm, pristine_tree: Path
) -> None:
    family = FAMILIES[name]
    tree = tree_with_replacement(
        pristine_tree, tmp_path / "tree", family.module, family.old, family.new
    )
    out = tmp_path / "found"
    explore = run_kvconform(
        "explore", "--vllm-src", tree, "--baseline-src", pristine_tree, "--budget", BUDGET,
        "--seed", 0, "--max-findings", 1, "--out", out, cwd=tmp_path,
    )  # fmt: skip
    assert explore.returncode == 1, explore.stdout + explore.stderr
    summary = json.loads((out / "explore-summary.json").read_text())
    signature = _signature(family, tree)
    found = [f for f in summary["findings"] if f["signature"].startswith(signature)]
    assert found, (signature, [f["signature"] for f in summary["findings"]], explore.stdout)
    for n, finding in enumerate(found):
        repro = Path(finding["file"])
        assert repro.parent == out and fnmatch(repro.name, family.pattern), repro.name
        text = repro.read_text()
        assert f"kind: {family.kind}" in text and f"--vllm-src {tree}" in text
        # kvconform run reproduces it on the copy: the same failure, or vLLM's same raise.
        report_dir = tmp_path / f"copy-{n}"
        again = run_kvconform("run", repro, "--vllm-src", tree, "--report-dir", report_dir,
                              cwd=tmp_path)  # fmt: skip
        assert again.returncode == 1, again.stdout + again.stderr
        (reported,) = json.loads((report_dir / "report.json").read_text())["scenarios"]
        said = [f["message"] for f in reported["failures"]] + [reported["error"] or ""]
        assert finding["message"] in said, (finding["message"], said)
        # The unmodified vLLM (this process's) does not fail it so: the bug, not the workload.
        # (Not necessarily exit 0: a shrunk workload may still hold a finding the pinned
        # vLLM has itself, docs/explore.md, such as a Mamba group's ceiling.)
        (scenario,) = load_text(text, str(repro))
        on_pristine = [str(s) for s in signatures(run_scenario(scenario, vllm))]
        assert not [s for s in on_pristine if s.startswith(signature)], on_pristine
