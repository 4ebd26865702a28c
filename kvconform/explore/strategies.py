"""Hypothesis strategies of explored documents: scheduler workloads drawn by swarm
testing, startup and warmup documents.

:func:`workloads` first draws the example's kind (:data:`KIND_SHARES`, among those
the space offers): a startup document (:func:`startup_document`) or a warmup
document (:func:`warmup_document`) is drawn whole; a ``kind: scheduler`` scenario
document (a plain dict in the v1 format, as a file would load into) is drawn in
two stages, as swarm testing does (Groce et al., ISSTA 2012):

1. **The features.** Each of :data:`FEATURES` is drawn on or off, independently,
   with even odds. A feature that is off is absent from the whole example, so
   one example exercises a few features hard instead of every feature a little,
   and combinations that one feature's presence would crowd out (a roomy pool
   and preemption, stop tokens and long outputs) each get examples of their own.
2. **The workload** within them: the model (KV-cache groups), the scheduler's
   settings, and the requests with their arrivals, shared prefixes, acceptance
   patterns, loads, multimodal inputs, stops and aborts.

**Legal by construction.** Every rule the loader checks for scheduler scenarios
(``kvconform/harness/loader/scheduler.py``; scenarios/README.md, *Scheduler
scenarios*) is kept while drawing: aborts and pauses only where they are
offered, no multimodal input on a request that loads its KV, budgets at least
``max_num_seqs`` (and ``max_model_len`` without chunked prefill), and so on. A
document the loader refuses is a bug of this module, not a finding.

**Judged by invariants only.** The fields whose value a person derives by hand
(``expect_hit``, ``expect_chunks``, ``expect_loaded``, ``expect_rejected``, a
reset's ``succeeds``) are never drawn: the explorer has no hand to derive them
with. Every registered check judges each example from what was recorded.

**Pools.** The pool holds, besides the null block, what one request of
``max_model_len`` tokens can hold in every group (its columns plus the
speculative blocks), so a drawn workload always fits one request at a time and
the pool never runs dry for want of room (an example whose pool runs dry is
rejected, not reported). With the ``tight_pool`` feature that is all it holds
(requests preempt one another); otherwise a drawn multiple more.

**Shrinking.** Hypothesis shrinks towards the first option and towards zero:
every feature off, one full-attention group, block size 16, one request of a
short prompt arriving at once, all drafts accepted, the synchronous scheduler.
A shrunk reproducer names only what the failure needs.
"""

from __future__ import annotations

import json
import zlib
from math import lcm
from random import Random
from typing import Any

from hypothesis import strategies as st

from kvconform.explore.draws import BOOLS, DrawFn, cdiv, ints, one_of
from kvconform.explore.requests import draw_requests, widest_reach
from kvconform.explore.space import ExploreSpace, runs_without_caching
from kvconform.model.floors import FloorInput
from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.kinds import KINDS, Kind
from kvconform.model.methods import method_for

# The swarm's features, in the order they are drawn (docs/explore.md says what each turns on).
FEATURES = (
    "hybrid",  # more than one KV-cache group, of any type the scheduler takes
    "speculative",  # a speculative method and k
    "acceptance",  # acceptance patterns other than all (with speculative)
    "prefix_caching",  # prefix caching stated on, and requests sharing prefixes
    "no_caching",  # prefix caching stated off (when prefix_caching is off)
    "no_chunked_prefill",  # chunked prefill off
    "async_scheduling",  # AsyncScheduler, in lockstep or overlapped
    "priority",  # the priority policy, with priorities
    "tight_pool",  # the pool holds one max_model_len request and no more
    "few_seqs",  # max_num_seqs 1..2
    "small_budget",  # max_num_batched_tokens near max_num_seqs
    "long_prefill",  # long_prefill_token_threshold (and its adaptive floor)
    "remote_kv",  # requests whose KV loads asynchronously (NixlConnector), some failing
    "sync_connector",  # a connector loading every prompt synchronously (DecodeBenchConnector)
    "multimodal",  # multimodal inputs, repeated items, disable_chunked_mm_input, encoder sizes
    "stops",  # stop tokens and EOS before max_tokens
    "aborts",  # client aborts (synchronous scheduling only)
    "pauses",  # the engine pausing new requests (synchronous scheduling only)
    "arrivals",  # requests arriving over time
    "stats",  # log_stats, KV-cache events, per-request spec-decode metrics
    "follow_ups",  # a conversation's next turn: an earlier prompt resent, once it can have ended
    # Chosen after the workload from its checksum (LATE_FEATURES: seeds keep their workloads):
    "group_block_sizes",  # attention groups of a hybrid take 1, 2 or 4 times the block size
    "retention",  # a positive prefix-cache retention interval (with prefix caching)
    "no_lookahead_hashes",  # disable_lookahead_block_hashes (with speculative): the block drop
)
# The features added after the first version: chosen after the workload is drawn, from its
# checksum (_late_features), so that every seed keeps the workloads it drew before them.
LATE_FEATURES = ("group_block_sizes", "retention", "no_lookahead_hashes")

# The kinds of document drawn, with their shares of the examples (out of the sum): the
# scheduler's workloads most of the time, then vLLM's startup planning and its warmup.
KIND_SHARES: tuple[tuple[Kind, int], ...] = (
    (Kind.SCHEDULER, 8),
    (Kind.STARTUP, 1),
    (Kind.WARMUP, 1),
)


@st.composite
def feature_sets(draw: DrawFn) -> dict[str, bool]:
    """Stage 1: which features this example has (each on with even odds; the late ones are
    chosen by :func:`workload` after the rest of the example)."""
    return {name: draw(BOOLS) for name in FEATURES if name not in LATE_FEATURES}


@st.composite
def workloads(draw: DrawFn, space: ExploreSpace, name: str = "explore") -> dict[str, Any]:
    """One scenario document: its kind first (where the space offers more than the
    scheduler's), then, for a scheduler workload, its features and the workload within
    them; a startup or a warmup document is drawn whole."""
    kind = draw_kind(draw, space)
    if kind == Kind.STARTUP:
        return startup_document(draw, space, name)
    if kind == Kind.WARMUP:
        return warmup_document(draw, space, name)
    on = draw(feature_sets())
    return workload(draw, space, on, name)


def draw_kind(draw: DrawFn, space: ExploreSpace) -> Kind:
    """The kind of the example, by :data:`KIND_SHARES` among those the space offers.

    A kind the space does not offer falls to the scheduler's; a space of scheduler workloads
    only draws nothing here (its examples are what they were before kinds were drawn).
    Hypothesis shrinks the draw towards the scheduler, but a candidate of another kind
    than the failure first met never counts as reproducing it (the search loop compares
    the documents' kinds, :func:`kvconform.fuzz.search.search`): an example shrinks within
    its kind.
    """
    offered = space.kinds()
    if offered == (Kind.SCHEDULER,):
        return Kind.SCHEDULER
    ticket = draw(ints(0, sum(share for _, share in KIND_SHARES) - 1))
    for kind, share in KIND_SHARES:
        if ticket < share:
            return kind if kind in offered else Kind.SCHEDULER
        ticket -= share
    raise AssertionError("KIND_SHARES covers every ticket")


def workload(draw: DrawFn, space: ExploreSpace, on: dict[str, bool], name: str) -> dict[str, Any]:
    """Stage 2: the workload within the features ``on``."""
    block_size = draw(one_of(space.block_sizes))
    groups = _draw_groups(draw, space, on, block_size)
    # A conversation's later turns carry the earlier ones: with follow-ups, twice the context.
    most = space.max_blocks_per_len * (2 if on["follow_ups"] else 1)
    max_model_len = block_size * draw(ints(3, most)) - draw(ints(0, 2))
    model: dict[str, Any] = {"block_size": block_size, "max_model_len": max_model_len}

    speculative: dict[str, Any] | None = None
    k = 0
    if on["speculative"] and space.methods:
        method = draw(one_of(space.methods))
        k = draw(ints(1, space.max_speculative_tokens))
        speculative = {"method": method, "num_speculative_tokens": k}
    stated = method_options(draw, speculative, Kind.SCHEDULER)

    sync = not on["async_scheduling"]
    scheduler: dict[str, Any] = {"mode": "sync" if sync else draw(one_of(("overlapped", "async")))}
    scheduler.update(stated.get("scheduler", {}))
    max_num_seqs = draw(ints(1, 2)) if on["few_seqs"] else draw(ints(3, 6))
    scheduler["max_num_seqs"] = max_num_seqs
    # A Mamba group runs with prefix caching (below), and vLLM requires chunked prefill
    # for Mamba prefix caching (MambaModelConfig; the loader refuses it off).
    recurrent = not all(runs_without_caching(group) for group in groups)
    if on["no_chunked_prefill"] and not recurrent:
        scheduler["enable_chunked_prefill"] = False
        budget = max_model_len + draw(ints(0, 2 * block_size))
    elif on["small_budget"]:
        budget = max(max_num_seqs, draw(ints(2, 3 * block_size)))
    else:
        budget = draw(ints(4 * block_size, 16 * block_size))
    budget = max(budget, max_num_seqs)
    scheduler["max_num_batched_tokens"] = budget
    if on["long_prefill"]:
        scheduler["long_prefill_token_threshold"] = draw(ints(1, max_model_len))
        if space.adaptive_threshold and draw(BOOLS):
            scheduler["long_prefill_token_threshold_adaptive"] = True
    if on["priority"]:
        scheduler["policy"] = "priority"
    remote = on["remote_kv"]
    if on["sync_connector"] and not remote:
        scheduler["kv_connector"] = "decode_bench"
    if on["multimodal"] and draw(BOOLS) and not recurrent:
        # Not with Mamba "align" (prefix caching), which vLLM refuses it for (VllmConfig).
        scheduler["disable_chunked_mm_input"] = True
    if on["stats"]:
        if "kv_connector" not in scheduler:
            scheduler["log_stats"] = True
        model["kv_cache_events"] = True
        if speculative is not None and space.spec_decode_metrics:
            scheduler["spec_decode_metrics"] = draw(one_of(("none", "summary", "detailed")))
    if on["pauses"] and sync:
        begin = draw(ints(1, 6))
        scheduler["pause"] = [{"at": begin, "resume_at": begin + draw(ints(1, 6))}]

    if on["prefix_caching"] or recurrent:
        # vLLM sets a Mamba group's block size only with prefix caching on
        # (--mamba-block-size needs --enable-prefix-caching), so a hybrid Mamba model
        # runs with it on, as vLLM enables it for such models by default.
        model["enable_caching"] = True
    elif on["no_caching"]:
        model["enable_caching"] = False
    connector = remote or "kv_connector" in scheduler
    model["num_blocks"] = _pool(draw, on, groups, block_size, max_model_len, k, connector)
    model["groups"] = groups

    opening = min(max_model_len - 1, 2 * block_size + widest_reach(groups))
    requests = draw_requests(
        draw, on, scheduler, max_model_len, block_size, k, len(groups), opening
    )
    items = [i["length"] for r in requests.values() for i in r.get("mm_inputs", ())]
    if items and scheduler.get("enable_chunked_prefill", True) and draw(BOOLS):
        # Encoder pressure: a step's encoder budget and the encoder cache from a token up to
        # a few items' worth. vLLM raises both to the largest item (compute_mm_encoder_budget),
        # so the smallest draws are exactly one item: every schedule of an item then competes
        # for the budget, and every item a live request still needs for the cache. Not
        # without chunked prefill: vLLM sizes both from the token budget, at least
        # max_model_len there, so a whole prompt's items always fit one step; a smaller
        # stated size would hold a prompt back forever, a configuration vLLM cannot have.
        scheduler["max_num_encoder_input_tokens"] = draw(ints(1, 2 * max(items)))
        scheduler["encoder_cache_size"] = draw(ints(1, 3 * max(items)))
    if remote and any("remote_prefill" in r for r in requests.values()) and draw(BOOLS):
        scheduler["kv_load_failure_policy"] = draw(one_of(("fail", "recompute")))

    _late_features(on, model, speculative, requests)

    doc: dict[str, Any] = {"name": name, "kind": "scheduler", "model": model}
    if speculative is not None:
        doc["speculative"] = speculative
    doc["scheduler"] = scheduler
    doc["requests"] = requests
    return doc


def method_options(
    draw: DrawFn, speculative: dict[str, Any] | None, kind: Kind
) -> dict[str, dict[str, Any]]:
    """Draw the settings the method's registry entry declares (``Method.options``: DSpark's
    layout, MTP's modules), each from its legal values for k, the default first; a value
    of the ``speculative`` section goes into ``speculative``, the others are returned by
    section. A setting of a section the ``kind`` has not (MTP's modules outside scheduler
    scenarios) is not drawn; a default is not stated."""
    if speculative is None:
        return {}
    entry = method_for(speculative["method"])
    if entry is None:
        return {}
    k = int(speculative["num_speculative_tokens"])
    sections = {"speculative", *KINDS[kind].sections}
    stated: dict[str, dict[str, Any]] = {}
    for option in entry.options:
        if option.section not in sections:
            continue
        values = option.values(k)
        value = draw(one_of(tuple(values))) if len(values) > 1 else values[0]
        if value == values[0]:
            continue
        if option.section == "speculative":
            speculative[option.name] = value
        else:
            stated.setdefault(option.section, {})[option.name] = value
    return stated


def startup_document(draw: DrawFn, space: ExploreSpace, name: str) -> dict[str, Any]:
    """A ``kind: startup`` document: a model's groups handed to vLLM's startup planning
    with the memory profiled near the edge of one ``max_model_len`` request.

    The groups: one of the types startup scenarios take on this vLLM, or (half the time)
    an attention type beside a recurrent state, in either order (vLLM's planning merges
    attention layers of one page size into one group, so no other mix stays a hybrid);
    Mamba in its cache mode ``none`` (stated, as the loader asks) with 0-2 speculative
    state blocks. The edge is the smallest pool that serves one
    request of ``max_model_len`` tokens: the null block plus every group's floor for it
    (``kvconform/model/floors.py``, the floor the ``startup`` check holds vLLM to). The
    memory is that edge +-2 blocks; half the time ``num_gpu_blocks_override`` is stated
    instead at the edge +-2, the memory then at the edge +-2 too or 2-8 times it; auto-fit
    half the time. No ``expect``: the ``startup`` check judges vLLM's decision by itself.
    """
    block_size = draw(one_of(space.block_sizes))
    groups: list[Any] = []
    floors = 0
    max_model_len = block_size * draw(ints(3, space.max_blocks_per_len)) - draw(ints(0, 2))
    attention = tuple(t for t in space.startup_types if GROUP_TYPES[t].attention)
    recurrent = tuple(t for t in space.startup_types if not GROUP_TYPES[t].attention)
    if attention and recurrent and draw(BOOLS):
        # vLLM's planning puts layers of one spec, and attention layers of one page size,
        # in one group: a hybrid it keeps apart is attention beside a recurrent state.
        kinds = [draw(one_of(attention)), draw(one_of(recurrent))]
        if draw(BOOLS):
            kinds.reverse()
    else:
        kinds = [draw(one_of(space.startup_types))]
    for type_name in kinds:
        group_type = GROUP_TYPES[type_name]
        options: dict[str, Any] = {}
        mode = group_type.options.get("mamba_cache_mode")
        if mode is not None:
            options["mamba_cache_mode"] = mode.default
        extra = 0
        if group_type.speculative_blocks is not None and draw(BOOLS):
            extra = draw(ints(1, 2))
            options[group_type.speculative_blocks] = extra
        rule = group_type.floor_for(options)
        fixed = FloorInput(0, 0, 0, block_size, max_model_len, num_speculative_blocks=extra)
        floors += rule.for_group(fixed)(0, max_model_len, 0, 0)
        groups.append({"type": type_name, **options} if options else type_name)
    edge = 1 + floors  # the null block and one max_model_len request
    startup: dict[str, Any] = {}
    if draw(BOOLS):
        startup["num_gpu_blocks_override"] = max(1, edge + draw(ints(-2, 2)))
        if draw(BOOLS):
            startup["available_blocks"] = edge * draw(ints(2, 8))
        else:
            startup["available_blocks"] = max(1, edge + draw(ints(-2, 2)))
    else:
        startup["available_blocks"] = max(1, edge + draw(ints(-2, 2)))
    if draw(BOOLS):
        startup["auto_fit"] = True
    model = {"block_size": block_size, "max_model_len": max_model_len, "groups": groups}
    return {"name": name, "kind": Kind.STARTUP.value, "model": model, "startup": startup}


def warmup_document(draw: DrawFn, space: ExploreSpace, name: str) -> dict[str, Any]:
    """A ``kind: warmup`` document: vLLM's real ``warmup_kernels`` (and the mixed
    prefill/decode warmup) over a model's groups, with a speculative method and k or none.

    The groups are drawn as a scheduler workload's (one, or 2-3 of any type the
    scheduler takes on this vLLM, with their windows and chunks); the method any the
    space offers, k 1..4, its declared settings drawn (``Method.options``); ``max_num_seqs``
    1-8; ``max_num_batched_tokens`` from ``max_num_seqs`` to 16 blocks; the pool from 2
    blocks (the warmup skips or caps what does not fit) to 8 times one ``max_model_len``
    request in every group. The mixed prefill/decode step's ``num_tokens`` is drawn up to 4
    blocks and capped as each of vLLM's callers caps it, at ``max_num_batched_tokens`` and
    ``max_model_len`` (``mixed_batch_attention_warmup``, 0.28.0-0.34.0; the Step5 DSA and
    sparse-MLA warmups skip past them): a longer step is no call vLLM makes, and a release
    whose mixed warmup does not split its prefill (before 0.34.0) over-reserves or crashes on it.
    """
    block_size = draw(one_of(space.block_sizes))
    on = {"hybrid": draw(BOOLS)}
    groups = _draw_groups(draw, space, on, block_size)
    max_model_len = block_size * draw(ints(3, space.max_blocks_per_len)) - draw(ints(0, 2))
    speculative: dict[str, Any] | None = None
    k = 0
    if space.methods and draw(BOOLS):
        k = draw(ints(1, space.max_speculative_tokens))
        speculative = {"method": draw(one_of(space.methods)), "num_speculative_tokens": k}
        method_options(draw, speculative, Kind.WARMUP)
    max_num_seqs = draw(ints(1, 8))
    budget = max(max_num_seqs, draw(ints(1, 16 * block_size)))
    alone = len(groups) * (cdiv(max_model_len, block_size) + k + 1)
    model: dict[str, Any] = {"block_size": block_size, "max_model_len": max_model_len}
    if not all(runs_without_caching(group) for group in groups):
        model["enable_caching"] = True  # a Mamba group: as in a scheduler workload
    model["num_blocks"] = draw(ints(2, 1 + 8 * alone))
    model["groups"] = groups
    doc: dict[str, Any] = {"name": name, "kind": Kind.WARMUP.value, "model": model}
    if speculative is not None:
        doc["speculative"] = speculative
    mixed = min(draw(ints(1, 4 * block_size)), budget, max_model_len)
    doc["warmup"] = {
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": budget,
        "mixed_num_tokens": mixed,
    }
    return doc


def _late_features(
    on: dict[str, bool],
    model: dict[str, Any],
    speculative: dict[str, Any] | None,
    requests: dict[str, Any],
) -> None:
    """The late features, applied to the drawn workload.

    Where ``on`` lacks them they are chosen, with their values, by a generator seeded from
    the workload drawn so far (its CRC-32), not drawn from Hypothesis: a draw would shift
    every later example of a seed (Hypothesis draws them from one random stream), so each
    seed's workloads stay those it drew before the features were added, less the ones a
    late feature now changes. The price: shrinking does not aim at them (a shrink
    candidate keeps or loses them by its own checksum, and is kept only if it still fails).

    * ``group_block_sizes``: in a hybrid, each attention group whose type caches with mixed
      block sizes takes 1, 2 or 4 times the model's block size (vLLM gives full and sliding
      layers different block sizes where their pages unify; hits then align to the least
      common multiple). A recurrent (Mamba) group takes the largest of them: vLLM sets
      ``mamba_block_size`` to the scheduler block size, and an attention group of a smaller
      block (a drafter's, a smaller page's) pulls the hash block below it
      (``resolve_kv_cache_block_sizes``, ``partial_hash_hits_enabled`` in
      ``vllm/v1/core/kv_cache_utils.py``). Not beside a type whose prefix caching needs one
      block size (chunked local attention: vLLM asserts it).
    * ``retention``: with prefix caching on and a group retention applies to, a positive
      ``prefix_cache_retention_interval``: 1-4 times the scheduler block size.
    * ``no_lookahead_hashes``: with a speculative method, ``disable_lookahead_block_hashes``
      (the EAGLE family drops the last matched block instead of hashing its lookahead); not
      with prefix caching beside a type whose lookup refuses the drop (chunked local
      attention: vLLM asserts it).
    """
    drawn = json.dumps([model, speculative, requests], sort_keys=True, default=str)
    pick = Random(zlib.crc32(drawn.encode()))
    for feature in LATE_FEATURES:
        chosen = pick.random() < 0.5
        on.setdefault(feature, chosen)
    groups = model["groups"]
    types = [GROUP_TYPES[g if isinstance(g, str) else str(g["type"])] for g in groups]
    caching = model.get("enable_caching") is not False  # unstated: vLLM's default, on
    mixable = all(not t.caching_needs_one_block_size for t in types)
    if on["group_block_sizes"] and len(groups) > 1 and mixable:
        factors = [pick.choice((1, 2, 4)) for _ in groups]
        for index, group_type in enumerate(types):
            # A recurrent state's block is the scheduler block size (vLLM's mamba_block_size):
            # the largest, the others' least common multiple (factors are powers of two).
            factor = factors[index] if group_type.attention else max(factors)
            if factor > 1:
                group = groups[index]
                body = {"type": group} if isinstance(group, str) else group
                body["block_size"] = model["block_size"] * factor
                groups[index] = body
    if on["retention"] and caching and any(t.retention for t in types):
        sizes = [
            g["block_size"] if isinstance(g, dict) and "block_size" in g else model["block_size"]
            for g in groups
        ]
        model["prefix_cache_retention_interval"] = lcm(*sizes) * pick.randint(1, 4)
    refused = caching and any(t.caching_refuses_block_drop for t in types)
    if on["no_lookahead_hashes"] and speculative is not None and not refused:
        speculative["disable_lookahead_block_hashes"] = True


def _draw_groups(
    draw: DrawFn, space: ExploreSpace, on: dict[str, bool], block_size: int
) -> list[Any]:
    count = draw(ints(2, space.max_groups)) if on["hybrid"] else 1
    groups: list[Any] = []
    for _ in range(count):
        type_name = draw(one_of(space.group_types))
        options: dict[str, Any] = {}
        for option_name, option in GROUP_TYPES[type_name].options.items():
            how = option.draw
            if how is not None and how.kind == "tokens":
                options[option_name] = draw(ints(how.low, how.high * block_size))
            elif how is not None and how.kind == "blocks":
                options[option_name] = block_size * draw(ints(how.low, how.high))
        for flag_type, flag in space.flag_options:
            if flag_type == type_name and draw(BOOLS):
                options[flag] = True
        groups.append({"type": type_name, **options} if options else type_name)
    return _one_replay_window(groups)


def _one_replay_window(groups: list[Any]) -> list[Any]:
    """Bounded-replay groups take the first one's window: vLLM builds them only for DeepSeek
    V4.1, from its config's one ``sliding_window``, and the loader refuses two windows
    (``kvconform/harness/loader/scheduler.py``, ``_check_one_replay_window``), a replay beside
    chunked local attention, and several groups that are all bounded-replay ones; nor is a
    replay drawn beside a Mamba group, which that model has not."""
    replaying = [g for g in groups if isinstance(g, dict) and g.get("bounded_replay")]

    def window_option(group: dict[str, Any]) -> str:
        reads = GROUP_TYPES[group["type"]].reads
        assert reads is not None, f"{group['type']} reads no window"
        return reads[1]

    for group in replaying[1:]:
        group[window_option(group)] = replaying[0][window_option(replaying[0])]
    if replaying and any(_reads_chunk(g) or not _attends(g) for g in groups):
        # No vLLM model has both (the loader refuses it beside chunked local attention): the
        # chunk wins, replay goes. Nor a replay beside a recurrent state: DeepSeek V4.1, the
        # only model vLLM builds bounded-replay groups for, has no Mamba layers (the corpus
        # still pairs them by hand, where Mamba is what makes vLLM zero new blocks).
        for group in replaying:
            del group["bounded_replay"]
    elif len(groups) > 1 and len(replaying) == len(groups):
        # Several groups, none prefix-cacheable: no vLLM model (the loader refuses it,
        # ``_check_not_only_replay_groups``); the first keeps its replay, the rest go plain.
        for group in replaying[1:]:
            del group["bounded_replay"]
    return groups


def _attends(group: Any) -> bool:
    """Whether a drawn group is an attention type (not a recurrent state)."""
    return GROUP_TYPES[group if isinstance(group, str) else str(group["type"])].attention


def _reads_chunk(group: Any) -> bool:
    """Whether a drawn group is chunked local attention (it reads its token's chunk)."""
    type_name = group if isinstance(group, str) else str(group["type"])
    reads = GROUP_TYPES[type_name].reads
    return reads is not None and reads[0] == "chunk"


def _pool(
    draw: DrawFn,
    on: dict[str, bool],
    groups: list[Any],
    block_size: int,
    max_model_len: int,
    k: int,
    connector: bool = False,
) -> int:
    """The null block plus one whole request's columns and speculative blocks in every group,
    times a drawn factor unless the pool is tight. With a KV connector the factor starts at 1:
    loads hold their blocks while they wait and are not preempted, and what they do to hits,
    evictions and admissions shows only when the pool runs short, so a connector's workloads
    meet the edge of the pool without ``tight_pool`` too."""
    alone = len(groups) * (cdiv(max_model_len, block_size) + k + 1)
    if on["tight_pool"]:
        return 1 + alone + draw(ints(0, 1))
    return 1 + alone * draw(ints(1 if connector else 2, 6))
