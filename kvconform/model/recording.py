"""A recording: one scenario's run as data, typed, versioned and serialisable.

What the drivers and oracles record (the :class:`~kvconform.model.observations.Trajectory`:
observations per step, request and group, the frees, refusals, denials, the warmup's
passes, the slots party's escapes, vLLM's startup planning, and the facts of
:mod:`kvconform.model.facts`) is everything a check judges: a check never asks vLLM.
:class:`Recording` adds what the run was (the scenario's id, file and kind) and the
format's version, and :func:`dumps` / :func:`loads` write it as JSON and read it back
to an equal recording, so that a run recorded in one place can be judged in another.

The JSON keeps every Python type the recording holds: a record is
``{"__type__": name, ...}`` with its fields (only the classes of :data:`RECORD_TYPES`
are read back, never an arbitrary import), a tuple ``{"__tuple__": [...]}``, a set
``{"__set__": [...]}``, a dict ``{"__dict__": [[key, value], ...]}`` (keys keep their
types), bytes ``{"__bytes__": hex}``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass, field
from typing import Any

from kvconform.errors import RecordingFormatError
from kvconform.model import facts
from kvconform.model.kind_specs import WarmupPass
from kvconform.model.names import Name
from kvconform.model.observations import (
    Denial,
    FreeEvent,
    GroupInfo,
    KvLoad,
    Observation,
    RefusedCall,
    SlotEscape,
    SlotRecording,
    StartupRecord,
    Trajectory,
)
from kvconform.model.results import ErrorKind, Failure, ScenarioResult, Verdict
from kvconform.model.settings import SettingsRecord

# Raised by one more with every change of what a recording holds or how it is written;
# a recording of another version is refused, never half read.
# 4: Trajectory.partial (a crash's steps, never judged); 5: StepStats.resets and .reset
# (the prefix-cache stats' reset flags); 6: QueuedRequest.frees_deferred and
# StepZeroingList.freed (the seed-0 triage's liveness and zeroing corrections); 7:
# PrefixLookup (a first admission's hit beside what the workload had cached: hits family); 8:
# GroupInfo.replay_tokens (a bounded-replay hit's valid KV) and Denial.cause (a stall's
# cause, in the capacity signature); 9: StepZeroingList.copied (copy-on-write destinations);
# 10: QueuedRequest.hold (the facts the model's held_back rule reads) for QueuedRequest.held_back,
# and QueuedRequest.encoder_input written as a PendingInput (it was read back as a bare tuple);
# 11: StepQueues.deferred (blocks a deferred free holds back: the liveness family's room);
# 12: HoldFacts.split_chunk, .prefill_end, .mamba_block and .split_limit (what Mamba
# "align"'s split decides a running request's chunk by: held_back's Mamba excuse reads them,
# and a version-11 recording read with their defaults would withhold it from every running
# request); 13: QueuedRequest.in_flight (a running request's tokens in flight: the liveness
# and fairness families count its rightful blocks from its processed tokens, as vLLM frees a
# window's passed blocks; a version-12 recording read with 0 would flag calls vLLM could not
# serve).
RECORDING_VERSION = 13


@dataclass
class Recording:
    """One scenario's run: which scenario, and everything its parties recorded.

    ``outcome`` is the scenario's result before any check judged it (``kvconform run
    --record-dir``): its id, tags, settings and duration, and, where the driver did not
    get through (skipped, bad input, unsupported, vLLM crashed), that verdict and error;
    after a crash ``trajectory`` holds the steps recorded before it, marked
    ``Trajectory.partial``, which ``judge`` shows and never judges.
    ``checks`` were selected; ``cannot_run``: the checks whose own party could not run
    (why); ``crash``: a check's party that crashed inside vLLM. The vLLM it ran against
    goes with it, for the reports and the expectations (which name versions).
    """

    scenario_id: str
    file: str
    kind: str
    trajectory: Trajectory | None
    version: int = RECORDING_VERSION
    outcome: ScenarioResult | None = None
    checks: tuple[str, ...] = ()
    cannot_run: dict[str, str] = field(default_factory=dict)
    crash: str | None = None
    vllm: dict[str, str | None] = field(default_factory=dict)


RECORD_TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        Recording,
        Trajectory,
        GroupInfo,
        Observation,
        FreeEvent,
        Denial,
        KvLoad,
        StartupRecord,
        RefusedCall,
        SlotEscape,
        SlotRecording,
        WarmupPass,
        facts.Fact,
        ScenarioResult,
        Failure,
        SettingsRecord,
        *facts.PAYLOADS,
        *facts.PARTS,
    )
}


ENUM_TYPES: dict[str, type[enum.Enum]] = {cls.__name__: cls for cls in (Verdict, ErrorKind)}


def _encode(value: Any) -> Any:
    if isinstance(value, Name):
        # A kind or a party is written as its name and read back as that string, which
        # it equals: the format did not change when they became enums.
        return value.value
    if isinstance(value, enum.Enum):
        return {"__enum__": type(value).__name__, "value": value.value}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    name = type(value).__name__
    if RECORD_TYPES.get(name) is type(value):
        if dataclasses.is_dataclass(value):
            fields = {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
        else:  # a NamedTuple
            fields = {key: _encode(item) for key, item in value._asdict().items()}  # type: ignore[attr-defined]
        return {"__type__": name, **fields}
    if isinstance(value, list):
        return [_encode(item) for item in value]
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(item) for item in value]}
    if isinstance(value, set | frozenset):
        items = [_encode(item) for item in value]
        return {
            "__set__": sorted(items, key=repr),
            "frozen": isinstance(value, frozenset),
        }
    if isinstance(value, dict) or hasattr(value, "items"):
        return {"__dict__": [[_encode(k), _encode(v)] for k, v in value.items()]}
    if isinstance(value, bytes):
        return {"__bytes__": value.hex()}
    raise TypeError(f"a recording holds no {name} ({value!r})")


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(item) for item in value]
    if not isinstance(value, dict):
        return value
    if "__type__" in value:
        name = value["__type__"]
        cls = RECORD_TYPES.get(name)
        if cls is None:
            raise RecordingFormatError(f"a record of unknown type {name!r}")
        fields = {key: _decode(item) for key, item in value.items() if key != "__type__"}
        if dataclasses.is_dataclass(cls):
            init = {f.name for f in dataclasses.fields(cls) if f.init}
            made = cls(**{k: v for k, v in fields.items() if k in init})
            for key in fields.keys() - init:
                object.__setattr__(made, key, fields[key])
            return made
        return cls(**fields)
    if "__enum__" in value:
        enum_type = ENUM_TYPES.get(value["__enum__"])
        if enum_type is None:
            raise RecordingFormatError(f"a value of unknown type {value['__enum__']!r}")
        return enum_type(value["value"])
    if "__tuple__" in value:
        return tuple(_decode(item) for item in value["__tuple__"])
    if "__set__" in value:
        items = [_decode(item) for item in value["__set__"]]
        return frozenset(items) if value.get("frozen") else set(items)
    if "__dict__" in value:
        return {_decode(k): _decode(v) for k, v in value["__dict__"]}
    if "__bytes__" in value:
        return bytes.fromhex(value["__bytes__"])
    raise RecordingFormatError(f"an object of no known shape: keys {sorted(value)}")


def dumps(recording: Recording) -> str:
    """The recording as JSON text."""
    return json.dumps(_encode(recording), separators=(",", ":"))


def loads(text: str) -> Recording:
    """A recording from :func:`dumps`' text; refuses another version or another shape."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordingFormatError(f"not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("__type__") != "Recording":
        raise RecordingFormatError("not a kvconform recording")
    version = data.get("version")
    if version != RECORDING_VERSION:
        raise RecordingFormatError(
            f"a recording of version {version!r}; this kvconform reads version "
            f"{RECORDING_VERSION} (record the run again)"
        )
    recording = _decode(data)
    assert isinstance(recording, Recording)
    return recording
