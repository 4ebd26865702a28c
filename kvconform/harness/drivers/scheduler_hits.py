"""What a scheduler run tells of its prefix-cache lookups: each first admission's hit beside
what the earlier requests its prompt begins with had scheduled before it (the facts the
``sanity`` check's hits family judges, :mod:`kvconform.harness.checks.hits`)."""

from __future__ import annotations

from kvconform.model.facts import Fact, HitSource, PrefixLookup
from kvconform.model.observations import Trajectory
from kvconform.model.prefix_hits import hit_rules, shared_prefix
from kvconform.model.scenario import RequestSpec, Scenario
from kvconform.oracles.scheduler import SchedulerRun, StepRecord


def lookup_facts(
    trajectory: Trajectory,
    record: SchedulerRun,
    scenario: Scenario,
    lines: dict[str, int | None],
) -> None:
    """One :class:`PrefixLookup` per first admission of a request whose prompt is its own
    tokens (no multimodal input, streaming session or remote KV), where prefix caching is on."""
    model = scenario.model
    if not model.enable_caching:
        return
    requests = scenario.requests
    limits = scenario.scheduler
    # A connector every request goes through, or vLLM's NixlConnector for remote prefills.
    connector = (limits is not None and limits.kv_connector is not None) or any(
        r.remote_prefill for r in requests.values()
    )
    groups, no_bound = hit_rules(model, connector)
    speculative = scenario.speculative
    # A drafter reads at most k tokens past a block: its lookahead hashes cover them, or the
    # EAGLE family drops the last matched block (with lookahead hashes disabled, and in
    # releases before them): which, is the release's and the method's, so both are bounded.
    k = speculative.num_speculative_tokens if speculative is not None else 0
    drop = speculative is not None
    lookahead = 0 if speculative is None or speculative.disable_lookahead_block_hashes else k
    retention = model.prefix_cache_retention_interval
    scheduled: dict[str, int] = {}  # prompt tokens each request had scheduled so far
    columns: dict[str, list[list[int]]] = {}  # per group, the block each column held last
    for event in record.events:
        if not isinstance(event, StepRecord):
            continue
        for row in event.requests:
            if row.phase != "new" or not _plain(requests[row.request]):
                continue
            sources = tuple(
                HitSource(
                    name,
                    requests[name].prompt_len,
                    shared,
                    tokens,
                    tuple(tuple(ids) for ids in columns[name]),
                )
                for name, tokens in scheduled.items()
                if name != row.request
                and _plain(requests[name])
                and (shared := shared_prefix(requests, name, row.request)) > 0
            )
            trajectory.facts.append(
                Fact(
                    event.step,
                    lines.get(row.request),
                    row.request,
                    "schedule",
                    PrefixLookup(
                        row.cached,
                        row.prompt_len,
                        groups,
                        retention,
                        drop,
                        lookahead,
                        k,
                        no_bound,
                        sources,
                        record.null_block,
                    ),
                )
            )
        # This step's rows count for the lookups of later steps only.
        for row in event.requests:
            done = min(row.computed + row.scheduled - row.drafts, row.prompt_len)
            scheduled[row.request] = max(scheduled.get(row.request, 0), done)
            held = columns.setdefault(row.request, [[] for _ in row.block_ids])
            for table, ids in zip(held, row.block_ids, strict=True):
                for column, block in enumerate(ids):
                    if column >= len(table):
                        table.append(block)
                    elif block != record.null_block:
                        table[column] = block


def _plain(request: RequestSpec) -> bool:
    """A prompt of token ids alone, computed here: what the hit rules speak of."""
    return not (request.mm_inputs or request.stream or request.remote_prefill)
