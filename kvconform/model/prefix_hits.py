"""The least prefix-cache hit a lookup must find: an independent lower bound.

vLLM's prefix cache promises that a request whose prompt begins with tokens an earlier
request computed finds their KV again, as long as the blocks that hold it are still cached.
A lookup (``KVCacheManager.get_computed_blocks``) may find less than the shared prefix, by
rules every group type states in vLLM's own code and comments
(``vllm/v1/core/kv_cache_coordinator.py``, ``single_type_kv_cache_manager.py``,
``find_longest_cache_hit`` and ``cache_blocks``); this module derives from those rules the
*least* hit the lookup may return, never what it does return, so that a lookup that finds
less (a hit lost to a bug of the cache or of the lookup) shows up, while every legal
shortening stays above the bound. The rules taken:

* **The prompt's last token is never a hit**: its logits must be computed
  (``Request.get_max_cache_hit_length``: ``num_tokens - 1``).
* **Only full blocks are cached**, and a hit ends on the cache-hit alignment: the least
  common multiple of the groups' block sizes, vLLM's scheduler block size (hits finer than it
  exist only with Mamba "align", which has no bound here).
* **A drafter's KV at a block's last position reads past the block** (the tokens a
  drafter reads ahead in a prefill: one for the drafters fed the target's hidden states,
  ``k`` for multi-module MTP; ``num_prefill_lookahead_tokens``), so a cached block is safe to
  reuse only where the next request shares those tokens too. vLLM ensures it one of two ways:
  lookahead block hashes (a block's hash covers those tokens, so a block is shared only if the
  prompts share up to ``k`` tokens past it; ``k`` bounds the lookahead from above), or the
  EAGLE family's drop of the last matched block (with ``disable_lookahead_block_hashes``, and
  always before vLLM 0.33, which had no lookahead hashes). Which one a run takes, and whether
  its method drops at all (``use_eagle_block_drop``), is vLLM's answer and its release's, not
  taken here: with a speculative method the bound is the least of "hashed with ``k`` tokens
  past the block" (unless the scenario disables lookahead hashes), "one alignment unit
  dropped" and "nothing dropped" (where the retention rules differ).
* **Full attention** ("dense" rule) caches every full block of the computed tokens and hits
  on any prefix of them.
* **A sliding window** ("window" rule) needs the blocks of the window before the hit
  (and, with the drop, the block after it). Without a retention interval (``None``) every
  aligned boundary keeps its window; under sparse retention (``0``: vLLM's default since
  0.29) only the *replay boundaries* of the earlier prompt do (``replay_boundaries``: a
  resend of the whole prompt, capped at its last token, and a longer prompt extending it;
  with the drop, one block lower each), plus, with a positive interval, every multiple of
  the interval. A shared prefix that ends elsewhere may hit nothing in such a group.
* **Tokens a drafter may prefill again** (multi-module MTP's ``num_reprefillable_tokens``,
  at most ``k``) are never cached: the bound counts ``k`` fewer tokens of the earlier request.
* **Every other group type** (Mamba, chunked local attention, ring buffers, ...) has no
  rule here: its hit depends on states vLLM keeps by policies this model does not derive, so
  a model with one has **no bound** rather than a guess.

The bound holds only while the earlier request's blocks are still cached: the hits family
(:mod:`kvconform.harness.checks.hits`) judges a lookup only when the recorded pool shows that
no cached block can have been evicted since (the pool has never handed out a block that an
earlier request had used: its free queue serves never-used blocks first, vLLM's
``FreeKVCacheBlockQueue``), no request was preempted and the prefix cache was never reset.
"""

from __future__ import annotations

from collections.abc import Mapping
from math import lcm
from typing import NamedTuple

from kvconform.model.facts import HitGroup, HitSource, PrefixLookup
from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.scenario import ModelSpec, RequestSpec

DENSE = "dense"
WINDOW = "window"
# The cause a lost hit is named by (its signature's suffix) where a group's shape alone
# explains it: see :func:`one_token_window`.
ONE_TOKEN_WINDOW = "a sliding window of one token"


class LeastHit(NamedTuple):
    """The least hit one earlier request guarantees, and how it was reached."""

    tokens: int
    source: str  # the earlier request
    # Per group, the columns (lo, hi) of the earlier request's table the bound needs cached.
    columns: tuple[tuple[int, int], ...]
    reason: str


def hit_rules(model: ModelSpec, connector: bool) -> tuple[tuple[HitGroup, ...], str]:
    """The groups as the bound reads them, and why no bound holds (empty: the rules apply)."""
    groups: list[HitGroup] = []
    why = ""
    for group in model.groups:
        group_type = GROUP_TYPES[group.type]
        window = 0
        if group_type.reads is not None and group_type.hit_rule == WINDOW:
            window = int(str(group.options.get(group_type.reads[1]) or 0))
        groups.append(HitGroup(group_type.hit_rule, group.block_size, window))
        if not group_type.hit_rule and not why:
            why = f"a {group.type} group (no hit rule for the type)"
        elif group.options.get("bounded_replay") and not why:
            why = f"a {group.type} group with bounded replay (the scheduler recomputes its window)"
    if not why and model.dcp_world_size > 1:
        why = "decode context parallelism (blocks sharded across ranks)"
    if not why and connector:
        why = "a KV connector (its loads decide the hit)"
    return tuple(groups), why


def shared_prefix(requests: Mapping[str, RequestSpec], first: str, second: str) -> int:
    """How many leading prompt tokens two requests share: the prefixes their ``prefix_from``
    chains copy from one another (every other token of a prompt is the request's own)."""
    one, two = _origins(requests, first), _origins(requests, second)
    shared = 0
    for a, b in zip(one, two, strict=False):
        if a != b:
            break
        shared += 1
    return shared


def _origins(requests: Mapping[str, RequestSpec], name: str) -> list[tuple[str, int]]:
    """Each prompt token of ``name`` as (the request that owns it, its position there)."""
    spec = requests[name]
    tokens = [(name, i) for i in range(spec.prompt_len)]
    if spec.prefix_from is not None and spec.prefix_len:
        tokens[: spec.prefix_len] = _origins(requests, spec.prefix_from)[: spec.prefix_len]
    return tokens


def alignment(groups: tuple[HitGroup, ...]) -> int:
    """The cache-hit alignment: the least common multiple of the groups' block sizes."""
    return lcm(*(g.block_size for g in groups))


def replay_boundaries(prompt: int, align: int, drop: bool) -> tuple[int, ...]:
    """The positions sparse retention keeps a sliding window's blocks for, of a prompt of
    ``prompt`` tokens: its resend (capped at its last token) and a prompt extending it, each
    one alignment unit lower when the drafter drops the last block."""
    resend = (prompt - 1) // align * align
    if not drop:
        return (resend,)
    extension = prompt // align * align
    return (max(resend - align, 0), max(extension - align, 0))


def least_hit(lookup: PrefixLookup, source: HitSource) -> LeastHit:
    """The least hit ``source``'s cached prompt guarantees the lookup (0: none)."""
    align = alignment(lookup.groups)
    ahead = lookup.lookahead
    cached = source.scheduled - lookup.reprefill
    sparse = lookup.retention is not None and any(g.rule == WINDOW for g in lookup.groups)
    # Blocks hashed with up to `ahead` tokens past them, nothing dropped.
    reach = min(source.shared - ahead, cached, lookup.prompt - max(ahead, 1))
    dense = max(reach, 0) // align * align
    bounds = [
        (
            _best(dense, sparse, lookup.retention, replay_boundaries(source.prompt, align, False)),
            False,
        )
    ]
    if lookup.drop:
        # The last matched block dropped instead, blocks hashed on their own tokens.
        plain = max(min(source.shared, cached, lookup.prompt - 1), 0) // align * align
        drop = replay_boundaries(source.prompt, align, True)
        bounds.append((_best(plain - align, sparse, lookup.retention, drop), True))
    tokens, drop_used = min(bounds)
    reason = (
        f"{source.request} scheduled {source.scheduled} tokens of its {source.prompt}-token "
        f"prompt, whose first {source.shared} the admitted prompt shares"
        + (
            f" ({lookup.reprefill} a drafter may prefill again are not cached)"
            if lookup.reprefill
            else ""
        )
        + (f"; a block's hash covers up to {ahead} tokens past it" if ahead else "")
        + f"; hits align to {align} tokens"
    )
    if drop_used:
        reason += ", one alignment unit dropped for the drafter"
    if sparse:
        reason += (
            "; sliding windows kept at the replay boundaries "
            f"{list(replay_boundaries(source.prompt, align, drop_used))}"
            + (f" and every {lookup.retention} tokens" if lookup.retention else "")
        )
    return LeastHit(
        tokens, source.request, _needed_columns(lookup.groups, tokens, drop_used), reason
    )


def one_token_window(groups: tuple[HitGroup, ...]) -> bool:
    """Whether a sliding-window group attends to one token only. The window before a hit
    then spans no block (``cdiv(window - 1, block_size)`` = 0), and vLLM's retention mask
    (``SlidingWindowManager.reachable_block_mask``, with any retention interval, dense
    included) keeps that many blocks per boundary: none. Its lookup
    (``find_longest_cache_hit``) proves a hit only by a cached block ending at it, so such a
    group never serves one (docs/findings.md #29). The bound still asks for the hit; this
    names the cause, so that a triaged lost hit of this shape does not excuse another."""
    return any(group.rule == WINDOW and group.window == 1 for group in groups)


def _best(limit: int, sparse: bool, retention: int | None, boundaries: tuple[int, ...]) -> int:
    """The highest position at most ``limit`` that every group keeps its blocks for."""
    if limit <= 0:
        return 0
    if not sparse:
        return limit
    kept = [b for b in boundaries if b <= limit]
    if retention:
        kept.append(limit // retention * retention)
    return max(kept, default=0)


def _needed_columns(
    groups: tuple[HitGroup, ...], tokens: int, drop: bool
) -> tuple[tuple[int, int], ...]:
    """Per group, the columns a hit of ``tokens`` reads from the cache: every column below
    it for full attention, the window's (and with the drop the one after) for a window."""
    needed: list[tuple[int, int]] = []
    for group in groups:
        end = tokens // group.block_size
        if not tokens:
            needed.append((0, 0))
        elif group.rule == WINDOW:
            span = -(-(group.window - 1) // group.block_size)
            needed.append((max(end - span, 0), end + (1 if drop else 0)))
        else:
            needed.append((0, end))
    return tuple(needed)
