"""The recording (kvconform.model.recording): a run as data, JSON and back, judged the same.

The tests build a trajectory by hand (no vLLM).
"""

from __future__ import annotations

import pytest

from kvconform.errors import RecordingFormatError
from kvconform.model import facts as f
from kvconform.model.observations import (
    FreeEvent,
    GroupInfo,
    Observation,
    SlotEscape,
    SlotRecording,
    StartupRecord,
    Trajectory,
)
from kvconform.model.recording import RECORDING_VERSION, Recording, dumps, loads
from kvconform.model.scenario import WarmupPass

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
    ]
    return trajectory


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
