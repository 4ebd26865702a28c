"""The recording (kvconform.model.recording): a run as data, JSON and back, judged the same.

The first tests build a trajectory by hand (no vLLM); the last records corpus scenarios
whose live oracle records facts of every family through vLLM's own KVCacheManager and
judges the recording read back from JSON.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvconform.errors import RecordingFormatError
from kvconform.harness.checks import CHECKS, judge
from kvconform.harness.drivers import DRIVERS
from kvconform.harness.loader import load_file
from kvconform.model import facts as f
from kvconform.model.kind_specs import WarmupPass
from kvconform.model.observations import (
    FreeEvent,
    GroupInfo,
    Observation,
    SlotEscape,
    SlotRecording,
    StartupRecord,
    Trajectory,
)
from kvconform.model.queue_facts import HoldFacts, PendingInput
from kvconform.model.recording import RECORDING_VERSION, Recording, dumps, loads
from kvconform.oracles.resolve import resolve_settings

ROOT = Path(__file__).resolve().parent.parent


# make_prefix_cache_stats as the compatibility layer hands it over: usage 3 of 7 blocks.
_STATS = {"requests": 1, "queries": 1, "hits": 1, "preempted_requests": 1,
          "preempted_queries": 1, "preempted_hits": 1, "reset": False, "usage": 3 / 7}  # fmt: skip


def _by_hand() -> Trajectory:
    """Every container and record type a recording holds, and a fact of every payload."""
    groups = (GroupInfo(0, "full_attention", 16, "full", False, {"dcp_world_size": 1}),)
    trajectory = Trajectory(groups, 2, "the method's table", max_model_len=512)
    trajectory.observations.append(
        Observation(0, 7, "a", "prefill 32", 0, 0, 32, 2, 3, 3, 3, 3, None, [1, 2, 3])
    )
    trajectory.events.append(FreeEvent(1, 1, 9, "a", "finish", ([1, 2, 3],), 4, 7, ([],)))
    trajectory.null_block, trajectory.num_blocks = 0, 8
    trajectory.slots = SlotRecording(
        mode="interpreter",
        groups_skipped={1: "no kernel"},
        escapes=[SlotEscape(0, "live", "target", 33, 2, 99, 6, None, None)],
    )
    trajectory.startup = StartupRecord(True, "get_kv_cache_configs", 512, 512, 10, 4096)
    trajectory.warmup_passes.append(WarmupPass(2, "greedy"))
    trajectory.read_bounds = {0: 16}
    trajectory.async_loads = {0}
    at = f.Fact
    hashes = (b"\x01\x02", 7)
    trajectory.facts += [
        at(0, None, "-", "manager built", f.DefaultDisagreement("apply_admission_cap")),
        at(0, 7, "a", "prefill 32", f.AdmissionHit(16, 32)),
        at(0, 7, "a", "prefill 32", f.LookupEvents(16, ((0, hashes),), 1, {0: (None, b"\x01")})),
        at(0, 7, "a", "prefill 32", f.ZeroingList(0, 16, (1,), (1, 2), (), (), False, 0)),
        at(0, 7, "a", "prefill 32", f.RetainedHit(0, 16, (4, 5), 16, (4, 9))),
        at(0, 7, "a", "end of step", f.InFlightPop((1, 2), (1,), ((),))),
        at(0, 7, "a", "end of step", f.DeferredReturn(2, (1, 2), (), 1)),
        at(1, 9, "-", "before the step", f.ResetAnswer(True, False, 0, 3, 8)),
        at(1, 9, "a, b", "before the step", f.Eviction((3, 4), (4,))),
        at(1, 9, "-", "end of step", f.PrefixStats(_STATS, (1,) * 6, False, 2, 8)),
        at(1, 9, "-", "end of step", f.StepEvents((("stored", 0, hashes),), {(0, 7): 1})),
        at(
            1,
            9,
            "-",
            "end of step",
            f.StepHandoffs(
                (0,),
                frozenset(),
                frozenset({(0, 3, 16)}),
                {"a": ((0, 5, 32),)},
                (b"k",),
                {"a": ((3,),)},
                frozenset(),
            ),
        ),
        at(2, None, "a", "end of step", f.FinalizedTails(((0, 3, 8),), ((3,),), 8, (), {}, ())),
        at(
            3,
            None,
            "-",
            "schedule",
            f.StepQueues(
                "fcfs",
                (
                    # Facts that hold it back for no reason (HoldFacts round-trips).
                    f.QueuedRequest("a", 0, 0, 0, 0, 32, 32, 4, 0, WAITING_HOLD),
                    f.QueuedRequest("b", 1, 0, 1, 0, 16, 16, 4, 0),
                    f.QueuedRequest(
                        "c", 2, 0, 2, 0, 16, 16, 4, 0, HoldFacts(encoder_ahead=True),
                        encoder_input=PendingInput(0, 8, 8, False),
                    ),  # fmt: skip
                ),
                (),
                {"b": (16, 1, 16)},
                (),
                64, 64, 0, 4, 5, 4, 0, 8, 0, False, True, False, deferred=3,
            ),  # fmt: skip
        ),
    ]
    return trajectory


WAITING_HOLD = HoldFacts(status="WAITING", known=32, max_tokens=4, lookahead=2, max_model_len=64)


def test_a_recording_reads_back_equal_through_json() -> None:
    recording = Recording("by-hand", "by-hand.yaml", "trajectory", _by_hand())
    again = loads(dumps(recording))
    assert again == recording
    assert again.version == RECORDING_VERSION
    # The types a check compares on survive: tuples, lists, sets, int keys, bytes.
    assert again.trajectory.facts[2].what.stored == ((0, (b"\x01\x02", 7)),)
    assert again.trajectory.facts[11].what.before == frozenset()
    assert again.trajectory.read_bounds == {0: 16}
    assert again.trajectory.async_loads == {0}
    assert again.trajectory.slots is not None
    assert again.trajectory.slots.groups_skipped == {1: "no kernel"}
    assert isinstance(again.trajectory.observations[0], Observation)
    (queues,) = [fact.what for fact in again.trajectory.facts if fact.label == "schedule"]
    assert queues.waiting[0].hold == WAITING_HOLD and queues.waiting[0].held_back == ""
    # A record inside a record reads back as its type, not a bare tuple (which compares
    # equal to it): the liveness family reads the input's fields by name.
    assert isinstance(queues.waiting[2].encoder_input, PendingInput)
    assert queues.waiting[2].encoder_input.offset == 0


def test_the_facts_are_judged_the_same_after_the_round_trip() -> None:
    trajectory = _by_hand()
    before = judge(trajectory, ("sanity",)).failures
    after = judge(loads(dumps(Recording("x", "x.yaml", "trajectory", trajectory))).trajectory,
                  ("sanity",)).failures  # fmt: skip
    assert before == after
    invariants = [failure.detail["invariant"] for failure in before if failure.detail]
    # Each fact of the hand-built run breaks its family's rule once (the zeroing list
    # leaves out block 2, a new block of group 0).
    for wanted in (
        "declares another default than the coordinator that forwards the argument",
        "gets a prefix-cache hit other than the one derived",
        "announces other blocks at a prefix-cache lookup than the request reuses",
        "leaves a new block off the worker's zeroing list",
        "returns other blocks after an in-flight finish than the request held",
        "answers reset_prefix_cache otherwise than the blocks held give",
        "keeps a block in the prefix cache that the connector evicted",
        "counts other prefix-cache stats or usage than the trajectory adopted",
        "caches a Mamba boundary state and does not hand it to the KV connector",
        "hands the KV connector a block that no longer holds the state",
        "admits a later request ahead of an earlier one that fits",
    ):
        assert wanted in invariants, wanted
    hit = next(x for x in before if x.detail and x.detail["invariant"].startswith("gets a"))
    assert hit.message == (
        "step 0 (line 7, prefill 32) request a: gets a prefix-cache hit of 16 tokens, "
        "but the scenario states 32"
    )
    # The hit the request's hand-built table holds in full is the one its tokens cover.
    assert not any("keeps a hit of" in x.message for x in before)


def test_another_version_or_another_document_is_refused() -> None:
    text = dumps(Recording("x", "x.yaml", "trajectory", _by_hand()))
    older = text.replace(f'"version":{RECORDING_VERSION}', '"version":0')
    assert older != text
    with pytest.raises(RecordingFormatError, match="version 0"):
        loads(older)
    with pytest.raises(RecordingFormatError, match="not a kvconform recording"):
        loads('{"scenarios": []}')
    with pytest.raises(RecordingFormatError, match="unknown type 'Popen'"):
        loads(text.replace('"__type__":"Eviction"', '"__type__":"Popen"'))


# Corpus scenarios whose live oracle records facts of each family.
RECORDED = [
    "scenarios/hybrid/kv-events-full-report-sliding-window-null-columns.yaml",
    "scenarios/hybrid/hybrid-mamba-partial-tail-handed-over-at-finish.yaml",
    "scenarios/hybrid/hisparse-host-hit-longer-than-device.yaml",
    "scenarios/admission/in-flight-finish-defers-free.yaml",
    "scenarios/admission/connector-async-load-blocks-not-zeroed.yaml",
]


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: Path(p).stem)
def test_a_live_run_is_judged_the_same_from_its_recording(vllm, path: str) -> None:
    kinds: set[str] = set()
    for scenario in load_file(ROOT / path):
        resolved, _ = resolve_settings(scenario, vllm)
        trajectory = DRIVERS[resolved.kind](resolved, vllm)
        kinds |= {type(fact.what).__name__ for fact in trajectory.facts}
        recording = Recording(scenario.id, scenario.file, scenario.kind, trajectory)
        again = loads(dumps(recording))
        assert again == recording
        names = tuple(name for name, check in CHECKS.items() if check.record is None)
        assert judge(again.trajectory, names) == judge(trajectory, names)
    assert kinds, f"{path} records no facts"
