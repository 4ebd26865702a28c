"""Root-cause groups: a run's failure records, one group per cause.

Each record is blamed by its check's record (``Check.blame``, a
:class:`~kvconform.model.root_causes.Blame`). Three steps turn the records into causes:

1. **Fold.** At one step, request and KV-cache group, a party below the floor
   (``floor``) is the cause; the records there that follow from it (the write the
   slot-mapping kernel sends past its blocks, ``slots``; the predictor it now
   disagrees with, ``agree``) are folded into it, so one short step is one incident
   whatever the number of checks that saw it. A record whose party has no shortfall
   there stands on its own, blamed as its check says.
2. **Gather the shortfalls by who falls short.** The live side (the allocator, vLLM's
   scheduler or engine: :data:`~kvconform.model.root_causes.LIVE_PARTIES`) is gathered
   by the manager class vLLM dispatched the KV-cache group to (asked of vLLM at run
   time and recorded in the trajectory, ``GroupInfo.manager``); the predictor and the
   recorded warmup by party. Whether the target's own positions or only the drafter's
   go without a block splits them too. Where the gatherings of several managers share
   one shape of miss, the fault lies on the path they share (``allocate_slots``) and
   they are one group; a shape found in one manager only, while other managers ran
   under speculation in the same run without falling short, names that manager and
   its file.
3. **Describe the shape exactly** from every record of the group
   (:func:`~kvconform.model.root_causes.describe_shortfalls`): one position short,
   the whole lookahead, one block.

A lookahead ``VllmConfig.num_lookahead_tokens`` reports short (check ``lookahead``) is
upstream of every party that reserves with it: in its scenario, each shortfall of such a
party that holds what its step needs with the lookahead vLLM told it (and the records
that follow from that shortfall) folds into the config's group; a party below even that
is a cause of its own. A record of a whole call (a grant the pool cannot hold, a
prefix-cache hit other than derived) whose own request has no shortfall before it
follows the party's latest shortfall in the scenario.

**Ranking, by data flow.** Causes come before consequences that stand alone (a write past
the blocks with no shortfall under it, a disagreement with both sides at the floor), then
larger before smaller; then every group is moved above the groups whose party reads its
party (``Party.reads``; :func:`~kvconform.model.root_causes.rank_by_data_flow`): the
config's lookahead and the startup planning's pool above the allocator, the predictor,
vLLM's scheduler and engine; the predictor above the recorded warmup; the live side
above the slot mapping. Parties that do not read one another keep the order of size.
Only failed scenarios' records are grouped: xfailed ones are known divergences, and an
errored scenario has no records.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kvconform.harness.checks import CHECKS, floor, lookahead
from kvconform.harness.checks.records import live_party
from kvconform.model.parties import LIVE_PARTIES, Party
from kvconform.model.results import Failure, ScenarioResult, Verdict
from kvconform.model.root_causes import (
    Blame,
    RootCause,
    RootCauseScenario,
    Shortfall,
    describe_shortfalls,
    rank_by_data_flow,
    upstream_of,
)

__all__ = ["blame", "find_root_causes", "never_below_floor"]


def blame(result: ScenarioResult, failure: Failure) -> Blame:
    """How a record is blamed: its check's record says (``Check.blame``)."""
    return CHECKS[failure.check].blame(result, failure)


def never_below_floor(results: Iterable[ScenarioResult]) -> list[str]:
    """The parties that took part in the run's scenarios and never fell below the floor.

    What a group does not say is as telling: "the live allocator never falls short"
    points a predictor's shortfall at the predictor.
    """
    took_part: dict[str, None] = {}
    short: set[str] = set()
    for result in results:
        trajectory = result.trajectory
        if trajectory is None:
            continue
        live = live_party(result)
        for party in trajectory.parties:
            took_part.setdefault(live if party == Party.LIVE else party)
        for failure in result.failures:
            if failure.check == floor.CHECK.name:
                short.add(live if failure.party in (None, Party.LIVE) else failure.party)
    return [party for party in took_part if party not in short]


# -- step 1: incidents ------------------------------------------------------------------


@dataclass
class _Incident:
    """One record that is a cause (a shortfall, or a record standing alone), and the
    records of the same step, request and group that follow from it."""

    result: ScenarioResult
    blame: Blame
    check: str
    records: list[int] = field(default_factory=list)  # indices into result.failures
    checks: list[str] = field(default_factory=list)
    manager: tuple[str, str] | None = None
    group_type: str | None = None


def _incidents(result: ScenarioResult) -> list[_Incident]:
    blamed = [(i, f, blame(result, f)) for i, f in enumerate(result.failures)]
    incidents: list[_Incident] = []
    # The shortfalls of each party and request, in step order.
    shortfalls: dict[tuple[str | None, str], list[tuple[Failure, _Incident]]] = {}
    trajectory = result.trajectory
    for index, failure, verdict in blamed:
        if verdict.short is None:
            continue
        incident = _Incident(result, verdict, failure.check, [index], [failure.check])
        if trajectory is not None and failure.group is not None:
            group = trajectory.groups[failure.group]
            incident.group_type = group.type
            if group.manager is not None:
                incident.manager = (group.manager, group.manager_file or "")
        shortfalls.setdefault((failure.request, verdict.party), []).append((failure, incident))
        incidents.append(incident)
    for index, failure, verdict in blamed:
        if verdict.short is not None:
            continue
        cause = None
        if verdict.follows is not None:
            cause = _cause_of(failure, shortfalls.get((failure.request, verdict.follows), []))
            if cause is None and failure.group is None:
                # A record of a whole call (a grant, a hit), not of one KV-cache group:
                # where its own request has no shortfall before it, another request's,
                # at or before its step (a request short of blocks leaves the pool more
                # free blocks than derived, and a call derived as refused is granted).
                cause = _latest_shortfall(failure, shortfalls, verdict.follows)
        if cause is not None:
            cause.records.append(index)
            if failure.check not in cause.checks:
                cause.checks.append(failure.check)
            continue
        incident = _Incident(result, verdict, failure.check, [index], [failure.check])
        if trajectory is not None and failure.group is not None:
            incident.group_type = trajectory.groups[failure.group].type
        incidents.append(incident)
    return _fold_into_short_lookahead(result, _fold_into_upstream(result, incidents))


def _merge(into: _Incident, incident: _Incident) -> None:
    into.records.extend(incident.records)
    into.checks.extend(c for c in incident.checks if c not in into.checks)
    if into.group_type is None:
        into.group_type = incident.group_type


def _fold_into_upstream(result: ScenarioResult, incidents: list[_Incident]) -> list[_Incident]:
    """A shortfall of a party that reads another party's count (the recorded warmup
    sizes its blocks with the predictor's) folds into that party's shortfall at the same
    step, request and KV-cache group, where it holds at least what that party gave it:
    it did as told. Holding less still, it is a cause of its own."""
    at: dict[tuple[object, ...], _Incident] = {}
    for incident in incidents:
        if incident.blame.short is not None:
            failure = result.failures[incident.records[0]]
            key = (failure.step, failure.request, failure.group, incident.blame.party)
            at.setdefault(key, incident)
    kept: list[_Incident] = []
    moved: dict[int, _Incident] = {}
    for incident in incidents:
        short, party = incident.blame.short, incident.blame.party
        if short is not None:
            failure = result.failures[incident.records[0]]
            sources = [
                at.get((failure.step, failure.request, failure.group, upstream))
                for upstream in sorted(upstream_of(party))
            ]
            source = next(
                (
                    s
                    for s in sources
                    if s is not None
                    and s.blame.short is not None
                    and short.held >= s.blame.short.held
                ),
                None,
            )
            if source is not None:
                while id(source) in moved:  # itself folded further up
                    source = moved[id(source)]
                _merge(source, incident)
                moved[id(incident)] = source
                continue
        kept.append(incident)
    return [i for i in kept if id(i) not in moved]


def _fold_into_short_lookahead(
    result: ScenarioResult, incidents: list[_Incident]
) -> list[_Incident]:
    """A lookahead that ``VllmConfig.num_lookahead_tokens`` reports short is the cause of
    every shortfall of a party that reads it (the allocator, the predictor, the warmup,
    vLLM's scheduler or engine) which holds what its step needs with vLLM's lookahead:
    that party did as the config told it. Those shortfalls, and the records that follow
    from them, fold into the config's incident. A party that holds less than even vLLM's
    lookahead asks stays a cause of its own."""
    trajectory = result.trajectory
    config = next(
        (i for i in incidents if i.blame.party == Party.CONFIG and i.check == lookahead.CHECK.name),
        None,
    )
    if (
        config is None
        or trajectory is None
        or trajectory.vllm_lookahead is None
        or trajectory.expected_lookahead is None
        or trajectory.vllm_lookahead >= trajectory.expected_lookahead
    ):
        return incidents
    kept: list[_Incident] = []
    for incident in incidents:
        if incident is not config and _does_as_told(result, incident, trajectory.lookahead):
            _merge(config, incident)
            continue
        kept.append(incident)
    return kept


def _does_as_told(result: ScenarioResult, incident: _Incident, told: int) -> bool:
    """Whether a shortfall's party reads the config and holds what its step needs with the
    lookahead the parties were told (``Trajectory.lookahead``)."""
    short, trajectory = incident.blame.short, result.trajectory
    if short is None or trajectory is None or Party.CONFIG not in upstream_of(incident.blame.party):
        return False
    failure = result.failures[incident.records[0]]
    if failure.group is None or failure.computed is None or failure.scheduled is None:
        return False
    group = trajectory.groups[failure.group]
    encoder_len = trajectory.encoder_lens.get(failure.request or "", 0)
    need = group.step_floor()(failure.computed, failure.scheduled, told, encoder_len)
    return short.held >= need


def _cause_of(failure: Failure, shortfalls: list[tuple[Failure, _Incident]]) -> _Incident | None:
    """The shortfall a consequence follows from: the one at its step and group, else the
    latest before it of the same request and group (a running maximum that remembers the
    short step; a call granted because a step's demand was counted short). ``shortfalls``
    are those of the followed party and the record's request."""
    same_group = [
        (short, incident)
        for short, incident in shortfalls
        if failure.group is None or short.group == failure.group
    ]
    if failure.step is None:
        return same_group[-1][1] if same_group else None
    for short, incident in same_group:
        if short.step == failure.step:
            return incident
    earlier = [i for short, i in same_group if short.step is not None and short.step < failure.step]
    return earlier[-1] if earlier else None


def _latest_shortfall(
    failure: Failure,
    shortfalls: dict[tuple[str | None, str], list[tuple[Failure, _Incident]]],
    party: str,
) -> _Incident | None:
    """The followed party's latest shortfall of any request at or before ``failure``'s step."""
    found: tuple[int, _Incident] | None = None
    for (_, who), shorts in shortfalls.items():
        if who != party:
            continue
        for short, incident in shorts:
            step = short.step if short.step is not None else -1
            if failure.step is not None and step > failure.step:
                continue
            if found is None or step >= found[0]:
                found = (step, incident)
    return found[1] if found else None


# -- step 2: who falls short ------------------------------------------------------------


def _shape_side(short: Shortfall) -> str:
    """Whether only the drafter's positions, or the target's too, go without a block."""
    if short.uncovered is not None and short.lookahead > 0 and not short.target_short:
        return "drafter"
    return "target"


def _speculative_managers(results: list[ScenarioResult]) -> set[str]:
    """The manager classes the live side ran under speculation (a lookahead) in the run."""
    managers: set[str] = set()
    for result in results:
        trajectory = result.trajectory
        if trajectory is None or not trajectory.lookahead:
            continue
        managers.update(g.manager for g in trajectory.groups if g.manager is not None)
    return managers


def find_root_causes(results: Iterable[ScenarioResult]) -> list[RootCause]:
    """The failed scenarios' records, one group per cause: upstream causes first, then
    causes before lone consequences, then the largest."""
    results = list(results)
    incidents = [
        incident
        for result in results
        if result.verdict is Verdict.FAILED
        for incident in _incidents(result)
    ]
    groups: dict[tuple[object, ...], list[_Incident]] = {}
    # Shortfalls of the live side, by manager class and side first (merged below).
    by_manager: dict[tuple[str, str], list[_Incident]] = {}
    for incident in incidents:
        verdict = incident.blame
        if verdict.short is None:
            groups.setdefault(("alone", verdict.party, incident.check, verdict.miss), []).append(
                incident
            )
        elif verdict.party in LIVE_PARTIES and incident.manager is not None:
            manager = incident.manager[0]
            by_manager.setdefault((manager, _shape_side(verdict.short)), []).append(incident)
        else:
            side = _shape_side(verdict.short)
            groups.setdefault(("short", verdict.party, side), []).append(incident)
    # One shape across several managers: the path they share. One manager only: itself.
    for (_, side), members in by_manager.items():
        shape = describe_shortfalls([i.blame.short for i in members if i.blame.short])[0]
        groups.setdefault((Party.LIVE, side, shape), []).extend(members)
    speculative = _speculative_managers(results)
    causes = [_cause(members, speculative) for members in groups.values()]
    by_size = sorted(causes, key=lambda g: (g.consequence, -g.records, -len(g.scenarios), g.key))
    return rank_by_data_flow(by_size)


# The checks whose records only follow a holder's blocks (a write past them, a count
# that differs from them): alone, they rank below the causes.
_CONSEQUENCE_CHECKS = ("agree", "slots")


def _hypotheses_hold(members: list[_Incident]) -> dict[str, bool]:
    """Whether "one slot too few" and "the lookahead forgotten" each explain the members'
    runs: replayed over every observation of the same party and KV-cache group (a
    holding party keeps its largest count until the request is freed), each hypothesis
    must fall short exactly where the party did. Empty where it cannot be replayed
    (a group whose floor does not count token columns, no trajectory)."""
    seen: dict[tuple[int, int, str], tuple[ScenarioResult, int, str]] = {}
    for incident in members:
        result = incident.result
        for index in incident.records[:1]:
            failure = result.failures[index]
            if failure.group is not None:
                party = incident.blame.party
                seen.setdefault((id(result), failure.group, party), (result, failure.group, party))
    holds = {"one-position": True, "whole-lookahead": True}
    for result, group_index, party in seen.values():
        trajectory = result.trajectory
        if trajectory is None:
            return {}
        group = trajectory.groups[group_index]
        if not group.floor_rule.counts_token_columns:
            return {}
        per_block = group.block_size * int(group.floor_args.get("dcp_world_size", 1))
        limit = trajectory.max_model_len or 1 << 62
        # An observation records each party's count under its name; the live side's as live.
        attr = party if party in (Party.PREDICTED, Party.WARMUP) else Party.LIVE
        keeps = party != Party.PREDICTED  # the predictor answers each step afresh
        events = sorted(trajectory.events, key=lambda e: e.seq)
        running: dict[str, dict[str, int]] = {name: {} for name in holds}
        for seq, obs in enumerate(trajectory.observations):
            while events and events[0].seq <= seq:
                freed = events.pop(0).request
                for table in running.values():
                    table.pop(freed, None)
            held = getattr(obs, attr)
            if obs.group != group_index or held is None:
                continue
            for name, short_by in (("one-position", 1), ("whole-lookahead", obs.lookahead)):
                end = min(
                    obs.computed + obs.scheduled + obs.lookahead - min(short_by, obs.lookahead),
                    limit,
                )
                need = -(-end // per_block)
                if keeps:
                    need = running[name][obs.request] = max(running[name].get(obs.request, 0), need)
                if (need < obs.floor) != (held < obs.floor):
                    holds[name] = False
    return holds


def _cause(members: list[_Incident], speculative: set[str]) -> RootCause:
    first = members[0]
    shorts = [i.blame.short for i in members if i.blame.short is not None]
    # The party with the most incidents leads (a manager's fault seen by the live
    # allocator and by vLLM's scheduler is one cause).
    parties: dict[str, int] = {}
    for incident in members:
        parties[incident.blame.party] = parties.get(incident.blame.party, 0) + 1
    party = max(parties, key=lambda p: parties[p])
    shape, miss = describe_shortfalls(shorts) if shorts else ("", first.blame.miss)
    if shape == "one-position-or-lookahead":
        # The records fit both; the steps where the party did not fall short may not.
        holds = _hypotheses_hold(members)
        if holds and holds["one-position"] != holds["whole-lookahead"]:
            fits = [s._replace(without_lookahead=holds["whole-lookahead"]) for s in shorts]
            if holds["one-position"]:
                shape, miss = describe_shortfalls(fits)
            else:
                miss = (
                    "is short the whole lookahead: it holds what each step needs without the "
                    "drafter's positions (one slot too few would have fallen short elsewhere)"
                )
    cause = RootCause(first.check, party, miss)
    managers: dict[tuple[str, str], None] = {}
    checks: dict[str, int] = {}
    per_scenario: dict[str, tuple[ScenarioResult, list[int]]] = {}
    for incident in members:
        result = incident.result
        if incident.manager is not None:
            managers.setdefault(incident.manager)
        if incident.group_type is not None and incident.group_type not in cause.group_types:
            cause.group_types.append(incident.group_type)
        trajectory = result.trajectory
        method = (trajectory.method if trajectory is not None else None) or "none"
        if method not in cause.methods:
            cause.methods.append(method)
        for index in incident.records:
            check = result.failures[index].check
            checks[check] = checks.get(check, 0) + 1
        per_scenario.setdefault(result.id, (result, []))[1].extend(incident.records)
    cause.records = sum(checks.values())
    # The leading check first (the cause's own), then in reporting order.
    cause.checks = {first.check: checks.pop(first.check, 0)}
    cause.checks.update({name: checks[name] for name in CHECKS if name in checks})
    cause.scenarios = [
        RootCauseScenario(result.id, result.file, result.line, len(indices), tuple(sorted(indices)))
        for result, indices in per_scenario.values()
    ]
    cause.managers = list(managers)
    if shorts and party in LIVE_PARTIES and len(cause.managers) == 1:
        name, file = cause.managers[0]
        if speculative - {name}:
            # Other managers ran under speculation in this run and none fell short this
            # way (it would share this group): the fault is in this one.
            cause.function, cause.file = name, file
    # A lone write past the blocks or disagreement is a consequence whose cause was not
    # seen; a lone sanity record (a grant, a missed hit) is an allocator fault of its own.
    cause.consequence = (
        not shorts and first.blame.follows is not None and first.check in _CONSEQUENCE_CHECKS
    )
    cause.group_types.sort()
    cause.methods.sort()
    cause.why = CHECKS[cause.check].why(cause)
    return cause
