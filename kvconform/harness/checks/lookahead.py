"""``lookahead``: kvconform's method registry agrees with ``VllmConfig.num_lookahead_tokens``.

Each :class:`~kvconform.model.methods.Method` entry (built in, or from a methods
file beside the scenarios) states how many slots its drafter writes past the
scheduled range; vLLM's property is what the scheduler and the warmup reserve. A method vLLM declares and no entry knows is a failure,
so a new method gets a deliberate entry instead of a silent pass. While a
request's KV loads asynchronously (scheduler mode, ``remote_prefill``) the
lookahead is 0: it holds exactly the blocks of the tokens being loaded.

A wrong lookahead is the cause of the floor failures it brings, so this check
reports first.
"""

from __future__ import annotations

from collections.abc import Iterator

from kvconform.harness.checks.records import PARTY_NAMES, blocks, failure_at, named
from kvconform.model.checks import Check, always
from kvconform.model.methods import ADDING_A_METHOD, METHODS_FILE, REGISTRY_FILE, method_for
from kvconform.model.observations import Trajectory
from kvconform.model.parties import Party
from kvconform.model.results import Failure, ScenarioResult
from kvconform.model.root_causes import Blame


def _async_load_lookahead(trajectory: Trajectory) -> Iterator[Failure]:
    """No lookahead slots while a request's KV loads asynchronously.

    vLLM's scheduler admits such a request with ``num_lookahead_tokens`` limited
    to 0 (``limit_lookahead_tokens``: no forward pass runs, so nothing drafts;
    the lookahead is allocated when the request is scheduled after the load),
    so that the blocks the connector fills match the remote's block for block.
    The request then holds the blocks of its loaded tokens, no more, no fewer.
    """
    for index in sorted(trajectory.async_loads):
        obs = trajectory.observations[index]
        if obs.live is None or obs.live == obs.floor:
            continue
        extra = obs.live - obs.floor
        yield failure_at(
            "lookahead",
            trajectory,
            obs,
            f"{PARTY_NAMES[Party.LIVE]} holds {blocks(obs.live)} while the request's KV loads "
            f"asynchronously, but its {obs.computed} loaded tokens take exactly "
            f"{blocks(obs.floor)}: "
            + (
                f"{blocks(extra)} more, lookahead slots reserved during the load (vLLM limits "
                "the lookahead to 0 until the KV has arrived, so that the local blocks match "
                "the remote's)"
                if extra > 0
                else "fewer than the connector writes into"
            ),
            {"invariant": "async KV load holds exactly its tokens' blocks"},
            party=Party.LIVE,
        )


def find(trajectory: Trajectory) -> Iterator[Failure]:
    yield from _async_load_lookahead(trajectory)
    if trajectory.method is None:
        if trajectory.vllm_lookahead:  # None: this release has no num_lookahead_tokens
            yield Failure(
                "lookahead",
                f"VllmConfig.num_lookahead_tokens is {trajectory.vllm_lookahead} without "
                "speculative decoding, where nothing drafts and the lookahead is 0",
                party=Party.CONFIG,
            )
        return
    k = trajectory.num_speculative_tokens
    if trajectory.expected_lookahead is None:
        yield Failure(
            "lookahead",
            f"method {trajectory.method!r} has no entry in kvconform's method registry; vLLM "
            f"reserves {trajectory.vllm_lookahead} slots for k={k}. Say what its drafter "
            f"writes: a Method in BUILTIN_METHODS of {REGISTRY_FILE}, or, without changing "
            f"kvconform, an entry in a methods file ({METHODS_FILE} beside the scenarios) "
            f"— {ADDING_A_METHOD}.",
            party=Party.CONFIG,
        )
        return
    if (
        trajectory.vllm_lookahead is None
        or trajectory.vllm_lookahead == trajectory.expected_lookahead
    ):
        return
    entry = method_for(trajectory.method)
    assert entry is not None
    yield Failure(
        "lookahead",
        f"VllmConfig.num_lookahead_tokens is {trajectory.vllm_lookahead} for method "
        f"{trajectory.method!r} with k={k}, but the drafter needs {entry.rule.formula} = "
        f"{trajectory.expected_lookahead} ({entry.rule.reason}; the rule of {entry.source})",
        party=Party.CONFIG,
    )


def blame(result: ScenarioResult, failure: Failure) -> Blame:
    invariant = (failure.detail or {}).get("invariant")
    if invariant is not None:  # an async KV load's blocks: what the live side held
        return Blame(named(result, failure.party), str(invariant))
    trajectory = result.trajectory
    if trajectory is None or trajectory.expected_lookahead is None:
        return Blame(Party.CONFIG, "names a method kvconform's method registry lacks")
    if (
        trajectory.vllm_lookahead is not None
        and trajectory.vllm_lookahead < trajectory.expected_lookahead
    ):
        return Blame(Party.CONFIG, "reserves fewer lookahead slots than the drafter writes")
    return Blame(Party.CONFIG, "reserves more lookahead slots than the drafter writes")


def signature(result: ScenarioResult, failure: Failure) -> tuple[str, str]:
    """(method): one finding per method whose lookahead is off."""
    trajectory = result.trajectory
    method = trajectory.method if trajectory is not None else None
    return method or "none", ""


CHECK = Check(
    "lookahead",
    "kvconform's method registry agrees with VllmConfig.num_lookahead_tokens",
    find,
    blame,
    signature,
    always(
        "every party reserves VllmConfig.num_lookahead_tokens slots past the scheduled "
        "tokens; it must cover every position the method's drafter writes"
    ),
)
