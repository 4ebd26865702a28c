"""From YAML files to validated :class:`Scenario` objects (format v1).

The format is documented in ``scenarios/README.md``; this module is its
executable definition. Loading never imports vLLM: everything that can be
checked from the file alone is checked here (types, unknown fields, group
types and their options, the legality of every step), so that a bad file fails
fast, with its file, line and field, and before a 15-second import.

A file yields one scenario, or one per combination of its ``matrix``. Errors
are collected per file: :func:`load_paths` returns the scenarios of every good
file and every problem of every bad one, so one broken file never hides the
others, and one problem never hides the next in the same file. Within a file,
what does not depend on a broken part is still read: every unknown field, each
section (model, speculative, requests), each step; the steps are left unread
when a part they need is broken, and a request's later calls when one of its
calls is, so that one mistake is reported once, not again as its consequences.
A file with several problems raises :class:`~kvconform.errors.FileErrors`.

Messages say what to write, in the scenario's words: an unknown field, group
type or request names the one probably meant (``difflib``), a missing field
names the unknown field that was probably meant for it, "known here" lists
every field allowed at that place, and a tab or an empty list item gets a plain
hint instead of PyYAML's or Python's words.
"""

from __future__ import annotations

import contextvars
import copy
import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from kvconform.errors import FileErrors, Location, ScenarioError, did_you_mean
from kvconform.harness.yamlio import LineDict, LineList, load_yaml
from kvconform.model.group_types import DEFAULT_GROUPS, GROUP_TYPES, types_for
from kvconform.model.methods import METHODS
from kvconform.model.scenario import (
    ACCEPT_ALL,
    ENGINE_RUNNERS,
    KINDS,
    MODEL_RUNNERS,
    NO_CHUNK_OPTIONS,
    SCHEDULER_MODES,
    WARMUP_SAMPLING,
    Acceptance,
    Action,
    ChunkOptions,
    EngineRequest,
    EngineSpec,
    GroupSpec,
    ModelSpec,
    RequestSpec,
    Scenario,
    SchedulerSpec,
    SpeculativeSpec,
    Step,
    WarmupPass,
    WarmupSpec,
)
from kvconform.model.tiny_model import ENGINE_TARGETS, TinyModel
from kvconform.model.tokens import RequestTokens

SCENARIO_SUFFIXES = (".yaml", ".yml")
# Group types a scheduler scenario may use: the tiny model kvconform builds for
# vLLM's scheduler is a plain decoder, so types that need a hybrid, encoder-decoder
# or context-parallel model configuration (Mamba alignment, cross-attention, ...)
# would be scheduled without the model-driven behaviour they exist for.
SCHEDULER_GROUP_TYPES = types_for("scheduler")
WARMUP_ENTRY_POINTS = ("warmup_kernels", "run_mixed_prefill_decode_warmup")

# Matrix keys, where each lands in the document, and how it shows in the id.
MATRIX_KEYS: dict[str, tuple[str, str]] = {
    "method": ("speculative", ""),
    "num_speculative_tokens": ("speculative", "k"),
    "num_lookahead_tokens": ("speculative", "la"),
    "sample_from_anchor": ("speculative", "anchor"),
    "block_size": ("model", "bs"),
    "max_model_len": ("model", "len"),
    "num_blocks": ("model", "pool"),
    "max_encoder_len": ("model", "enc"),
    "enable_caching": ("model", "cache"),
    "mode": ("scheduler", ""),
}

# The top-level sections each kind reads besides name, description, tags, kind,
# model, speculative and matrix.
KIND_SECTIONS: dict[str, tuple[str, ...]] = {
    "trajectory": ("requests", "steps"),
    "scheduler": ("scheduler", "requests"),
    "warmup": ("warmup",),
    "engine": ("engine", "requests"),
}

MODEL_DEFAULTS: dict[str, Any] = {
    "block_size": 16,
    "max_model_len": 2048,
    "num_blocks": 256,
    "max_encoder_len": 0,
    "enable_caching": False,
    "dcp_world_size": 1,
    "watermark": 0.0,
}


# The problems of the file being loaded; None outside load_text (then the first raises).
_PROBLEMS: contextvars.ContextVar[list[ScenarioError] | None] = contextvars.ContextVar(
    "kvconform_loader_problems", default=None
)


def _report(error: ScenarioError) -> None:
    """Record a problem and go on reading, or raise it when nothing collects."""
    problems = _PROBLEMS.get()
    if problems is None:
        raise error
    problems.append(error)


class _Abandoned(Exception):
    """A part not read further because a part it needs has a recorded problem."""


def _attempt(read: Callable[..., Any], *args: Any, fallback: Any = None) -> tuple[Any, bool]:
    """``(read(*args), True)``; ``(fallback, False)``, the problem recorded, if it raises."""
    try:
        return read(*args), True
    except _Abandoned:
        pass
    except FileErrors as errors:
        for error in errors.errors:
            _report(error)
    except ScenarioError as error:
        _report(error)
    return fallback, False


def _hint(word: str, candidates: Iterable[str]) -> str:
    meant = did_you_mean(word, candidates)
    return f" (did you mean {meant!r}?)" if meant else ""


@dataclass
class LoadResult:
    scenarios: list[Scenario]
    errors: list[ScenarioError]


def discover(paths: Sequence[str | Path]) -> list[Path]:
    """Scenario files under ``paths`` (files are taken as given), sorted."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(
                p
                for p in sorted(path.rglob("*"))
                if p.suffix in SCENARIO_SUFFIXES and is_scenario_file(p)
            )
        else:
            found.append(path)
    return found


def is_scenario_file(path: Path) -> bool:
    """YAML files in a scenario tree, minus expectations, mutation-campaign inputs and private files."""
    return not (
        path.name.startswith(("_", ".")) or path.stem.startswith(("expectations", "mutation-"))
    )


def load_paths(paths: Sequence[str | Path]) -> LoadResult:
    result = LoadResult([], [])
    seen: dict[str, str] = {}
    for path in discover(paths):
        try:
            scenarios = load_file(path)
        except FileErrors as exc:
            result.errors.extend(exc.errors)
            continue
        except ScenarioError as exc:
            result.errors.append(exc)
            continue
        for scenario in scenarios:
            if scenario.id in seen:
                result.errors.append(
                    ScenarioError(
                        scenario.where.at("name"),
                        f"scenario id {scenario.id!r} is already used by {seen[scenario.id]}",
                    )
                )
                continue
            seen[scenario.id] = scenario.file
            result.scenarios.append(scenario)
    return result


def load_file(path: str | Path) -> list[Scenario]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(Location(str(path)), f"cannot read: {exc.strerror}") from None
    return load_text(text, str(path), default_name=path.stem)


def load_text(text: str, file: str, default_name: str = "scenario") -> list[Scenario]:
    """The scenarios of one file's text; its one problem, or :class:`FileErrors`."""
    problems: list[ScenarioError] = []
    token = _PROBLEMS.set(problems)
    scenarios: list[Scenario] = []
    try:
        scenarios = _load(text, file, default_name)
    except _Abandoned:
        pass
    except ScenarioError as error:
        problems.append(error)
    finally:
        _PROBLEMS.reset(token)
    if not problems:
        return scenarios
    unique: dict[tuple[str, int | None, str | None], ScenarioError] = {}
    for problem in problems:  # a matrix repeats a problem in every combination
        where = problem.where
        unique.setdefault((where.file, where.line, where.field), problem)
    ordered = sorted(unique.values(), key=lambda e: e.where.line or 0)
    if len(ordered) == 1:
        raise ordered[0]
    raise FileErrors(ordered)


def _load(text: str, file: str, default_name: str) -> list[Scenario]:
    doc = load_yaml(text, file)
    where = Location(file, getattr(doc, "line", None))
    if not isinstance(doc, LineDict):
        raise ScenarioError(where, "a scenario file must be a mapping at the top level")
    matrix = doc.pop("matrix", None)
    if matrix is None:
        return [_parse(doc, file, default_name, ())]
    scenarios = []
    for variant, params in _expand_matrix(doc, matrix, Location(file, doc.line_of("matrix"))):
        scenario, ok = _attempt(_parse, variant, file, default_name, params)
        if ok:
            scenarios.append(scenario)
    return scenarios


# -- matrix ----------------------------------------------------------------------------


def _expand_matrix(
    doc: LineDict, matrix: Any, where: Location
) -> Iterator[tuple[LineDict, tuple[tuple[str, Any], ...]]]:
    if not isinstance(matrix, LineDict) or not matrix:
        raise ScenarioError(where.at("matrix"), "must be a mapping of field to a list of values")
    axes: list[tuple[str, list[Any]]] = []
    for key, values in matrix.items():
        at = where.at(f"matrix.{key}", matrix.line_of(key))
        if key not in MATRIX_KEYS:
            raise ScenarioError(
                at,
                f"cannot vary {key!r}{_hint(key, MATRIX_KEYS)}; matrix keys are "
                + ", ".join(MATRIX_KEYS),
            )
        if not isinstance(values, list) or not values:
            raise ScenarioError(at, "must be a non-empty list of values")
        axes.append((key, list(values)))
    for combo in itertools.product(*(values for _, values in axes)):
        variant = copy.deepcopy(doc)
        params = tuple((key, value) for (key, _), value in zip(axes, combo, strict=True))
        no_speculation = any(k == "method" and v in (None, "none") for k, v in params)
        for key, value in params:
            section, _ = MATRIX_KEYS[key]
            line = matrix.line_of(key)
            if section == "speculative" and no_speculation:
                variant["speculative"] = None
                continue
            target = variant.get(section)
            if target is None:
                target = LineDict()
                target.line, target.key_lines = line, {}
                variant[section] = target
                variant.key_lines[section] = line or 0
            if not isinstance(target, LineDict):
                raise ScenarioError(where.at(section), "must be a mapping")
            target[key] = value
            target.key_lines[key] = line or 0
        yield variant, params


def _param_id(key: str, value: Any) -> str:
    prefix = MATRIX_KEYS[key][1]
    if value is None or value == "none":
        return "nospec" if key == "method" else f"{prefix}none"
    if isinstance(value, bool):
        return prefix if value else f"no{prefix}"
    return f"{prefix}{value}"


# -- fields ----------------------------------------------------------------------------


class _Fields:
    """Reads a mapping field by field and complains about what is left over."""

    def __init__(self, mapping: Any, where: Location, path: str) -> None:
        if mapping is None:
            raise ScenarioError(where.at(path), "is empty: nothing follows the colon")
        if not isinstance(mapping, LineDict):
            raise ScenarioError(where.at(path), f"must be a mapping, not {_shown(mapping)}")
        self.mapping = mapping
        self.where = where
        self.path = path
        # Every field allowed here: those read, and those allow() names without reading.
        self.known: set[str] = set()

    def allow(self, *keys: str) -> None:
        """Fields allowed here that this reading does not look at (listed as known)."""
        self.known.update(keys)

    def unknown(self) -> list[str]:
        return [k for k in self.mapping if k not in self.known]

    def required(self, key: str, what: str = "is required") -> ScenarioError:
        """``key`` is missing; name the unknown field that was probably meant for it."""
        for typo in self.unknown():
            if did_you_mean(typo, [key]):
                line = self.mapping.line_of(typo)
                return ScenarioError(
                    self.at(key),
                    f"{what}; line {line} has the unknown field {typo!r}: did you mean {key!r}?",
                )
        return ScenarioError(self.at(key), what)

    def at(self, key: str) -> Location:
        return self.where.at(f"{self.path}.{key}" if self.path else key, self.mapping.line_of(key))

    def raw(self, key: str, default: Any = None) -> Any:
        self.known.add(key)
        return self.mapping.get(key, default)

    def integer(self, key: str, default: int | None = None, *, minimum: int = 1) -> int:
        value = self.raw(key, default)
        if value is None:
            raise self.required(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ScenarioError(self.at(key), f"must be an integer, not {_shown(value)}")
        if value < minimum:
            raise ScenarioError(self.at(key), f"must be at least {minimum}, not {value}")
        return value

    def optional_int(self, key: str, *, minimum: int = 0) -> int | None:
        self.known.add(key)
        return None if self.mapping.get(key) is None else self.integer(key, minimum=minimum)

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise ScenarioError(self.at(key), f"must be true or false, not {_shown(value)}")
        return value

    def text(self, key: str, default: str | None = None) -> str:
        value = self.raw(key, default)
        if value is None:
            raise self.required(key)
        if not isinstance(value, str) or not value:
            raise ScenarioError(self.at(key), f"must be a non-empty string, not {value!r}")
        return value

    def done(self) -> None:
        """Every field not allowed here is a problem (each recorded, reading goes on)."""
        known = ", ".join(sorted(self.known))
        for key in self.unknown():
            _report(
                ScenarioError(
                    self.at(key), f"unknown field{_hint(key, self.known)} (known here: {known})"
                )
            )


def _shown(value: Any) -> str:
    """A value as the file's author wrote it, not as Python prints it."""
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)


# -- scenario --------------------------------------------------------------------------


def _parse(
    doc: LineDict, file: str, default_name: str, params: tuple[tuple[str, Any], ...]
) -> Scenario:
    where = Location(file, doc.line)
    top = _Fields(doc, where, "")
    name = top.text("name", default_name)
    scenario_id = name + (f"[{'-'.join(_param_id(k, v) for k, v in params)}]" if params else "")
    description = top.raw("description", "") or ""
    if not isinstance(description, str):
        raise ScenarioError(top.at("description"), "must be a string")
    tags = top.raw("tags", []) or []
    if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
        raise ScenarioError(top.at("tags"), "must be a list of names")
    vllm_releases = _releases(top)
    kind = top.text("kind", "trajectory")
    if kind not in KINDS:
        raise ScenarioError(
            top.at("kind"), f"must be one of {', '.join(KINDS)}, not {kind!r}{_hint(kind, KINDS)}"
        )
    top.allow("matrix")  # popped before, expanded into this variant
    model, model_ok = _attempt(lambda: _parse_model(top.raw("model", _empty_mapping()), where))
    speculative, spec_ok = _attempt(
        lambda: _parse_speculative(top.raw("speculative"), where, top.at("speculative"))
    )
    if not (model_ok and spec_ok):
        # What follows reads the model and the speculation: report the requests' and
        # the rest of the file's unknown fields, and leave the steps unread.
        top.allow(*KIND_SECTIONS[kind])
        if kind == "trajectory":
            _attempt(lambda: _parse_requests(top.raw("requests"), where, top.at("requests")))
        top.done()
        raise _Abandoned
    for key, value in (
        ("watermark", model.watermark),
        ("max_in_flight_tokens", model.max_in_flight_tokens),
        # 0 is a setting (sparse retention), not an absence.
        ("prefix_cache_retention_interval", model.prefix_cache_retention_interval is not None),
    ):
        if value and kind != "trajectory":
            # Only the trajectory driver builds its KVCacheManager from the model
            # section; the other kinds' schedulers and warmups would run without it.
            raw_model = doc.get("model")
            line = raw_model.line_of(key) if isinstance(raw_model, LineDict) else None
            _report(
                ScenarioError(
                    where.at(f"model.{key}", line),
                    f"is read by trajectory scenarios only, not by kind {kind}",
                )
            )
    warmup = None
    scheduler = None
    engine = None
    requests: dict[str, RequestSpec] = {}
    steps: tuple[Step, ...] = ()
    try:
        if not model.groups and not (kind == "warmup" and _warmup_pooling(doc)):
            # Only encoder-only pooling models allocate no KV blocks (vLLM's warmup says
            # so); every other scenario needs a group to reserve in.
            model_raw = doc.get("model")
            line = model_raw.line_of("groups") if isinstance(model_raw, LineDict) else None
            raise ScenarioError(
                where.at("model.groups", line),
                "must be a non-empty list of group types (an empty one, a model without "
                "KV cache, only for kind: warmup with warmup.pooling: true)",
            )
        _check_extra_retained(model, speculative, kind)
        if kind == "scheduler":
            if "steps" in doc:
                raise ScenarioError(
                    top.at("steps"),
                    "a scheduler scenario has no steps: vLLM's scheduler decides them "
                    "(describe the requests and the scheduler's limits instead)",
                )
            _check_scheduler_model(model, speculative, top)
            scheduler = _parse_scheduler(
                top.raw("scheduler", _empty_mapping()),
                where,
                top.at("scheduler"),
                speculative,
                model,
            )
            requests = _parse_scheduler_requests(
                top.raw("requests"), where, top.at("requests"), model, speculative, scheduler
            )
        elif kind == "engine":
            if "steps" in doc:
                raise ScenarioError(
                    top.at("steps"), "an engine scenario has no steps: vLLM's engine decides them"
                )
            engine, requests = parse_engine(
                top.raw("engine", _empty_mapping()), where, top.at("engine"), speculative, model,
                top.raw("requests"), top.at("requests"),
            )  # fmt: skip
        elif kind == "warmup":
            warmup = _parse_warmup(top.raw("warmup", _empty_mapping()), where)
            for key in ("requests", "steps"):
                if key in doc:
                    raise ScenarioError(top.at(key), "a warmup scenario has no requests or steps")
        else:
            requests = _parse_requests(top.raw("requests"), where, top.at("requests"))
            steps = _parse_steps(
                top.raw("steps"), where, top.at("steps"), requests, model, speculative
            )
    except _Abandoned:
        pass
    except ScenarioError as error:
        _report(error)
    top.allow(*KIND_SECTIONS[kind])
    top.done()
    if _PROBLEMS.get():
        raise _Abandoned  # its problems are recorded
    return Scenario(
        id=scenario_id,
        name=name,
        file=file,
        description=description.strip(),
        tags=tuple(tags),
        kind=kind,
        model=model,
        speculative=speculative,
        requests=requests,
        steps=steps,
        params=params,
        warmup=warmup,
        line=doc.line,
        scheduler=scheduler,
        engine=engine,
        vllm_releases=vllm_releases,
    )


def _empty_mapping() -> LineDict:
    empty = LineDict()
    empty.line, empty.key_lines = None, {}
    return empty


def _parse_model(raw: Any, where: Location) -> ModelSpec:
    fields = _Fields(raw, where, "model")
    block_size = fields.integer("block_size", MODEL_DEFAULTS["block_size"])
    max_model_len = fields.integer("max_model_len", MODEL_DEFAULTS["max_model_len"], minimum=2)
    num_blocks = fields.integer("num_blocks", MODEL_DEFAULTS["num_blocks"], minimum=2)
    max_encoder_len = fields.integer(
        "max_encoder_len", MODEL_DEFAULTS["max_encoder_len"], minimum=0
    )
    enable_caching = fields.flag("enable_caching", MODEL_DEFAULTS["enable_caching"])
    dcp_world_size = fields.integer("dcp_world_size", MODEL_DEFAULTS["dcp_world_size"])
    watermark = fields.raw("watermark", MODEL_DEFAULTS["watermark"])
    # vLLM's own bounds (SchedulerConfig.watermark: ge=0.0, lt=1.0).
    if isinstance(watermark, bool) or not isinstance(watermark, (int, float)):
        raise ScenarioError(fields.at("watermark"), f"must be a number, not {_shown(watermark)}")
    if not 0.0 <= watermark < 1.0:
        raise ScenarioError(
            fields.at("watermark"),
            f"must be at least 0 and below 1 (a fraction of the pool), not {watermark}",
        )
    max_in_flight_tokens = fields.optional_int("max_in_flight_tokens", minimum=1)
    retention_interval = fields.optional_int("prefix_cache_retention_interval", minimum=0)
    raw_groups = fields.raw("groups", list(DEFAULT_GROUPS))
    fields.done()
    if not isinstance(raw_groups, list):
        raise ScenarioError(fields.at("groups"), "must be a list of group types")
    line_of = raw_groups.line_of if isinstance(raw_groups, LineList) else (lambda i: None)
    parsed = [
        _attempt(_parse_group, item, where.at(f"model.groups[{i}]", line_of(i)), block_size)
        for i, item in enumerate(raw_groups)
    ]
    if not all(ok for _, ok in parsed):
        raise _Abandoned
    groups = tuple(group for group, _ in parsed)
    model = ModelSpec(
        block_size=block_size,
        max_model_len=max_model_len,
        num_blocks=num_blocks,
        groups=groups,
        max_encoder_len=max_encoder_len,
        enable_caching=enable_caching,
        dcp_world_size=dcp_world_size,
        watermark=float(watermark),
        max_in_flight_tokens=max_in_flight_tokens,
        prefix_cache_retention_interval=retention_interval,
    )
    if retention_interval is not None:
        _check_retention_interval(model, fields.at("prefix_cache_retention_interval"))
    return model


def _check_retention_interval(model: ModelSpec, where: Location) -> None:
    """vLLM's own rule (``_validate_prefix_cache_retention_interval``): retention only
    sparsifies sliding-window and Mamba checkpoints, and a positive interval must land on
    cache-hit boundaries, so be a multiple of the scheduler block size."""
    interval = model.prefix_cache_retention_interval
    assert interval is not None
    if interval and not any(GROUP_TYPES[g.type].retention for g in model.groups):
        retained = " or ".join(name for name, t in GROUP_TYPES.items() if t.retention)
        raise ScenarioError(
            where,
            f"is {interval}, but the model has no {retained} group, "
            "the only ones retention applies to (vLLM accepts only 0 then)",
        )
    if interval % model.scheduler_block_size:
        raise ScenarioError(
            where,
            f"must be a multiple of the scheduler block size "
            f"({model.scheduler_block_size}), not {interval}",
        )


def _parse_group(item: Any, where: Location, default_block_size: int) -> GroupSpec:
    if isinstance(item, str):
        item_map = _empty_mapping()
        item_map["type"] = item
        item_map.line = where.line
        item = item_map
    assert where.field is not None
    fields = _Fields(item, Location(where.file, where.line), where.field)
    type_name = fields.text("type")
    group_type = GROUP_TYPES.get(type_name)
    if group_type is None:
        raise ScenarioError(
            fields.at("type"),
            f"unknown group type {type_name!r}{_hint(type_name, GROUP_TYPES)}; known: "
            + ", ".join(GROUP_TYPES),
        )
    block_size = fields.integer("block_size", default_block_size)
    options: dict[str, object] = {}
    for opt_name, opt in group_type.options.items():
        value = fields.raw(opt_name, opt.default)
        if value is None:
            if opt.required:
                raise fields.required(opt_name, f"is required for {type_name} groups")
        elif (opt.kind is bool) != isinstance(value, bool) or not isinstance(value, opt.kind):
            raise ScenarioError(fields.at(opt_name), f"must be {opt.kind.__name__}, not {value!r}")
        elif opt.choices and value not in opt.choices:
            choices = ", ".join(map(str, opt.choices))
            raise ScenarioError(fields.at(opt_name), f"must be one of {choices}, not {value!r}")
        options[opt_name] = value
    eagle_group = fields.flag("eagle_group", False)
    fields.done()
    return GroupSpec(type_name, block_size, options, where, eagle_group=eagle_group)


def _parse_speculative(raw: Any, where: Location, at: Location) -> SpeculativeSpec | None:
    if raw is None:
        return None
    fields = _Fields(raw, where, "speculative")
    method = fields.text("method")
    num_speculative_tokens = fields.integer("num_speculative_tokens")
    lookahead = fields.optional_int("num_lookahead_tokens")
    sample_from_anchor = fields.flag("sample_from_anchor", True)
    no_hashes = fields.flag("disable_lookahead_block_hashes", False)
    fields.done()
    return SpeculativeSpec(
        method,
        num_speculative_tokens,
        lookahead,
        sample_from_anchor,
        fields.at("method"),
        disable_lookahead_block_hashes=no_hashes,
    )


def _check_extra_retained(model: ModelSpec, speculative: SpeculativeSpec | None, kind: str) -> None:
    """A sliding window's ``extra_retained_tokens`` only as vLLM 0.33.0's planner sets it.

    ``get_global_kv_cache_groups`` gives every sliding-window spec
    ``max(0, num_prefill_lookahead_tokens - 1)``, and ``num_prefill_lookahead_tokens``
    is ``num_speculative_tokens`` for multi-module MTP (1 for other EAGLE-family
    methods): so k - 1, with k >= 2, on every sliding-window group alike. (That the
    method is MTP is checked where vLLM's method aliases are known, oracles/resolve.py.)
    Kinds other than trajectories build their groups from vLLM's own config.
    """
    if kind != "trajectory":
        # The other kinds build their KV-cache groups and speculative config from vLLM's.
        flagged = [g for g in model.groups if g.eagle_group]
        if flagged:
            where = flagged[0].where or Location("<scenario>")
            raise ScenarioError(
                where.at(f"{where.field}.eagle_group"), "only in trajectory scenarios"
            )
        if speculative is not None and speculative.disable_lookahead_block_hashes:
            raise ScenarioError(
                (speculative.where or Location("<scenario>")).at(
                    "speculative.disable_lookahead_block_hashes"
                ),
                "only in trajectory scenarios",
            )
    windowed = [g for g in model.groups if "extra_retained_tokens" in GROUP_TYPES[g.type].options]
    for group in windowed:
        value = group.options.get("extra_retained_tokens")
        if value is None:
            continue
        where = group.where or Location("<scenario>")
        at = where.at(f"{where.field}.extra_retained_tokens")
        if kind != "trajectory":
            raise ScenarioError(
                at, "only in trajectory scenarios (the other kinds build groups from vLLM's config)"
            )
        k = speculative.num_speculative_tokens if speculative is not None else 0
        if value != k - 1 or k < 2:
            raise ScenarioError(
                at,
                f"must be num_speculative_tokens - 1 ({k - 1 if k >= 2 else 'needs k >= 2'}), "
                f"not {value}: vLLM sets it only for multi-module MTP, to "
                "num_prefill_lookahead_tokens - 1 (kv_cache_planning.get_global_kv_cache_groups)",
            )
        unset = [g for g in windowed if g.options.get("extra_retained_tokens") is None]
        if unset:
            raise ScenarioError(
                unset[0].where or at,
                f"extra_retained_tokens: {value} must be set on every sliding-window group "
                "(vLLM's planner tags all of them alike)",
            )


def _check_scheduler_model(
    model: ModelSpec, speculative: SpeculativeSpec | None, top: _Fields
) -> None:
    for group in model.groups:
        if group.type not in SCHEDULER_GROUP_TYPES:
            raise ScenarioError(
                group.where or top.at("model.groups"),
                f"group type {group.type!r} is not available in scheduler scenarios (the model "
                "kvconform builds for the scheduler is a plain decoder); use "
                + ", ".join(SCHEDULER_GROUP_TYPES)
                + ", or a kind: trajectory scenario",
            )
    for name in ("max_encoder_len", "dcp_world_size"):
        default = MODEL_DEFAULTS[name]
        if getattr(model, name) != default:
            raise ScenarioError(
                top.at(f"model.{name}"),
                f"must be {default} in a scheduler scenario (the scheduler's model is a plain "
                "decoder on one rank)",
            )
    if speculative is not None and speculative.num_lookahead_tokens is not None:
        raise ScenarioError(
            speculative.where or top.at("speculative"),
            "speculative.num_lookahead_tokens: a scheduler scenario takes the lookahead from "
            "vLLM's scheduler; remove the override",
        )


def _parse_scheduler(
    raw: Any,
    where: Location,
    at: Location,
    speculative: SpeculativeSpec | None,
    model: ModelSpec,
) -> SchedulerSpec:
    fields = _Fields(raw, where, "scheduler")
    defaults = SchedulerSpec()
    mode = fields.text("mode", defaults.mode)
    if mode not in SCHEDULER_MODES:
        raise ScenarioError(
            fields.at("mode"), f"must be one of {', '.join(SCHEDULER_MODES)}, not {mode!r}"
        )
    layers = fields.integer("num_nextn_predict_layers", defaults.num_nextn_predict_layers)
    if layers != 1 and (speculative is None or not _stacks_mtp_modules(speculative.method)):
        raise ScenarioError(
            fields.at("num_nextn_predict_layers"), "applies to MTP only (speculative.method: mtp)"
        )
    if speculative is not None and speculative.num_speculative_tokens % layers:
        raise ScenarioError(
            fields.at("num_nextn_predict_layers"),
            f"vLLM needs num_speculative_tokens ({speculative.num_speculative_tokens}) to be a "
            f"multiple of the MTP modules ({layers})",
        )
    runner = fields.text("model_runner", defaults.model_runner)
    if runner not in MODEL_RUNNERS:
        raise ScenarioError(
            fields.at("model_runner"), f"must be one of {', '.join(MODEL_RUNNERS)}, not {runner!r}"
        )
    spec = SchedulerSpec(
        mode=mode,
        model_runner=runner,
        max_num_seqs=fields.integer("max_num_seqs", defaults.max_num_seqs),
        max_num_batched_tokens=fields.integer(
            "max_num_batched_tokens", defaults.max_num_batched_tokens
        ),
        enable_chunked_prefill=fields.flag(
            "enable_chunked_prefill", defaults.enable_chunked_prefill
        ),
        long_prefill_token_threshold=fields.integer(
            "long_prefill_token_threshold", defaults.long_prefill_token_threshold, minimum=0
        ),
        num_nextn_predict_layers=layers,
        max_steps=fields.integer("max_steps", defaults.max_steps),
        where=Location(where.file, fields.mapping.line or at.line, "scheduler"),
    )
    fields.done()
    _check_scheduler_limits(spec, model, fields)
    return spec


def _stacks_mtp_modules(method: str) -> bool:
    """The scenario's method (or a vLLM alias of it, such as ``mimo_mtp``) stacks MTP modules."""
    return any(m.mtp_modules and m.name in method for m in METHODS.values())


def _check_scheduler_limits(spec: SchedulerSpec, model: ModelSpec, fields: _Fields) -> None:
    """vLLM's own SchedulerConfig rules, checked before vLLM is imported.

    Whatever else vLLM refuses to build is reported as unsupported by that
    release (a method or mode it does not run), not as a bad scenario.
    """
    if spec.max_num_batched_tokens < spec.max_num_seqs:
        raise ScenarioError(
            fields.at("max_num_batched_tokens"),
            f"must be at least max_num_seqs ({spec.max_num_seqs}), as vLLM requires",
        )
    if not spec.enable_chunked_prefill and spec.max_num_batched_tokens < model.max_model_len:
        raise ScenarioError(
            fields.at("max_num_batched_tokens"),
            f"must be at least max_model_len ({model.max_model_len}) without chunked prefill, "
            "as vLLM requires",
        )
    if spec.long_prefill_token_threshold > model.max_model_len:
        raise ScenarioError(
            fields.at("long_prefill_token_threshold"),
            f"must be at most max_model_len ({model.max_model_len}), as vLLM requires",
        )


def _parse_scheduler_requests(
    raw: Any,
    where: Location,
    at: Location,
    model: ModelSpec,
    speculative: SpeculativeSpec | None,
    scheduler: SchedulerSpec,
) -> dict[str, RequestSpec]:
    def request(name: str, fields: _Fields, request_at: Location) -> RequestSpec:
        prompt_len = fields.integer("prompt_len")
        if prompt_len >= model.max_model_len:
            raise ScenarioError(
                fields.at("prompt_len"),
                f"must be below max_model_len {model.max_model_len}: vLLM rejects a prompt "
                "that leaves no room for one output token",
            )
        return RequestSpec(
            name=name,
            prompt_len=prompt_len,
            prefix_from=fields.raw("prefix_from"),
            prefix_len=fields.integer("prefix_len", 0, minimum=0),
            where=request_at,
            arrival=fields.integer("arrival", 0, minimum=0),
            max_tokens=fields.integer("max_tokens", RequestSpec.max_tokens),
            acceptance=_parse_acceptance(fields, speculative),
            remote_prefill=_parse_remote_prefill(fields, scheduler),
            expect_hit=_parse_expect_hit(fields, model, prompt_len),
        )

    return _parse_request_map(raw, where, at, "a scheduler scenario", request)


def _parse_expect_hit(fields: _Fields, model: ModelSpec, prompt_len: int) -> int | None:
    """``expect_hit``: the prefix-cache hit the request must adopt at its first admission."""
    hit = fields.optional_int("expect_hit")
    if hit is None:
        return None
    if not model.enable_caching:
        raise ScenarioError(
            fields.at("expect_hit"), "needs model.enable_caching: true (a prefix-cache hit)"
        )
    if hit >= prompt_len:
        raise ScenarioError(
            fields.at("expect_hit"),
            f"must be below prompt_len {prompt_len}: vLLM always computes the prompt's last "
            "token, so a hit never covers the whole prompt",
        )
    if fields.raw("remote_prefill", False):
        raise ScenarioError(
            fields.at("expect_hit"),
            "is not judged for a remote_prefill request (its local hit is folded into the load)",
        )
    return hit


def _parse_remote_prefill(fields: _Fields, scheduler: SchedulerSpec) -> int:
    """``remote_prefill``: false, true (one step) or the schedule() calls the KV load takes."""
    raw = fields.raw("remote_prefill", False)
    steps = int(raw) if isinstance(raw, bool) else raw
    if not isinstance(steps, int) or steps < 0:
        raise ScenarioError(
            fields.at("remote_prefill"),
            "must be true, false or the number of schedule() calls the asynchronous KV load "
            f"takes (an integer >= 1), not {_shown(raw)}",
        )
    if steps and scheduler.mode != "sync":
        # A kv_consumer connector with batches in flight makes vLLM defer block frees
        # past the in-flight step (Scheduler.defer_block_free), outside KVCacheManager.free,
        # where scheduler mode observes releases.
        raise ScenarioError(
            fields.at("remote_prefill"),
            f"needs scheduler.mode: sync, not {scheduler.mode!r}: with async scheduling vLLM "
            "defers a KV consumer's block frees, which scheduler mode does not observe yet",
        )
    return steps


def _parse_request_map(
    raw: Any,
    where: Location,
    at: Location,
    what: str,
    parse_one: Callable[[str, _Fields, Location], RequestSpec],
) -> dict[str, RequestSpec]:
    """Requests by name, each read by ``parse_one``; prefixes must name an earlier request."""
    if not isinstance(raw, LineDict) or not raw:
        raise ScenarioError(at, f"{what} needs a mapping of request names to requests")
    requests: dict[str, RequestSpec] = {}
    broken = False
    for name, body in raw.items():
        request_at = Location(where.file, raw.line_of(name), f"requests.{name}")

        def read(name: str, body: Any, request_at: Location) -> tuple[RequestSpec, _Fields]:
            fields = _Fields(body, Location(where.file, raw.line_of(name)), f"requests.{name}")
            request = parse_one(name, fields, request_at)
            fields.done()
            return request, fields

        (request, fields), ok = _attempt(read, name, body, request_at, fallback=(None, None))
        if not ok:
            broken = True
            continue
        prefix_from = request.prefix_from
        if prefix_from is not None and prefix_from not in requests:
            raise ScenarioError(
                fields.at("prefix_from"), f"must name a request defined above, not {prefix_from!r}"
            )
        if prefix_from is not None:
            limit = min(request.prompt_len, requests[prefix_from].prompt_len)
            if request.prefix_len > limit:
                raise ScenarioError(fields.at("prefix_len"), f"must be at most {limit}")
        requests[name] = request
    if broken:
        raise _Abandoned  # the steps would name a request that is not there
    return requests


_ACCEPT_FORMS = "all, none, a list [a1, a2, ...], {repeat: [...]} or {rate: R, seed: S}"


def _parse_acceptance(fields: _Fields, speculative: SpeculativeSpec | None) -> Acceptance:
    raw = fields.raw("accept")
    at = fields.at("accept")
    if raw is None or raw == "all":
        return ACCEPT_ALL
    if speculative is None:
        raise ScenarioError(at, "an acceptance pattern needs a 'speculative' section")
    k = speculative.num_speculative_tokens
    if raw == "none":
        return Acceptance("repeat", (0,))
    if isinstance(raw, list):
        return Acceptance("list", _accepted_counts(raw, at, k))
    if isinstance(raw, LineDict) and len(raw) >= 1:
        inner = _Fields(raw, Location(at.file, at.line), at.field or "accept")
        if "repeat" in raw:
            values = inner.raw("repeat")
            inner.done()
            if not isinstance(values, list) or not values:
                raise ScenarioError(inner.at("repeat"), "must be a non-empty list of counts")
            return Acceptance("repeat", _accepted_counts(values, inner.at("repeat"), k))
        if "rate" in raw:
            rate = inner.raw("rate")
            if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
                raise ScenarioError(inner.at("rate"), f"must be a number in 0..1, not {rate!r}")
            seed = inner.integer("seed", 0, minimum=0)
            inner.done()
            return Acceptance("rate", rate=float(rate), seed=seed)
    raise ScenarioError(at, f"must be {_ACCEPT_FORMS}, not {raw!r}")


def _accepted_counts(values: list[Any], at: Location, k: int) -> tuple[int, ...]:
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= k:
            raise ScenarioError(
                at,
                f"accepted drafts must be integers in 0..{k} (num_speculative_tokens), "
                f"not {value!r}",
            )
    return tuple(values)


def _warmup_pooling(doc: LineDict) -> bool:
    section = doc.get("warmup")
    return isinstance(section, LineDict) and section.get("pooling") is True


def _parse_warmup(raw: Any, where: Location) -> WarmupSpec:
    fields = _Fields(raw, where, "warmup")
    defaults = WarmupSpec()
    entry_points = fields.raw("entry_points", list(defaults.entry_points))
    if isinstance(entry_points, str):
        entry_points = [entry_points]
    if not isinstance(entry_points, list) or not entry_points:
        raise ScenarioError(fields.at("entry_points"), "must be a non-empty list")
    for entry in entry_points:
        if entry not in WARMUP_ENTRY_POINTS:
            raise ScenarioError(
                fields.at("entry_points"),
                f"unknown entry point {entry!r}; known: {', '.join(WARMUP_ENTRY_POINTS)}",
            )
    spec = WarmupSpec(
        entry_points=tuple(entry_points),
        max_num_seqs=fields.integer("max_num_seqs", defaults.max_num_seqs),
        max_num_batched_tokens=fields.integer(
            "max_num_batched_tokens", defaults.max_num_batched_tokens
        ),
        mixed_num_tokens=fields.integer("mixed_num_tokens", defaults.mixed_num_tokens),
        pooling=fields.flag("pooling", defaults.pooling),
        redirect_writes_to_null_block=fields.flag(
            "redirect_writes_to_null_block", defaults.redirect_writes_to_null_block
        ),
        expect_passes=_parse_warmup_passes(fields.raw("expect_passes"), fields.at("expect_passes")),
        expect_passes_at=fields.at("expect_passes"),
    )
    if spec.expect_passes is not None and "warmup_kernels" not in spec.entry_points:
        raise ScenarioError(
            fields.at("expect_passes"), "needs warmup_kernels among the entry_points"
        )
    fields.done()
    return spec


def _parse_warmup_passes(raw: Any, where: Location) -> tuple[WarmupPass, ...] | None:
    """``expect_passes``: a list of ``{requests: N, sampling: random | greedy | none, vllm: SPEC}``."""
    if raw is None:
        return None
    if not isinstance(raw, LineList) or not raw:
        raise ScenarioError(where, f"must be a non-empty list, not {_shown(raw)}")
    passes = []
    for i, item in enumerate(raw):
        fields = _Fields(item, where.at(where.field or "", raw.line_of(i)), f"{where.field}[{i}]")
        requests = fields.integer("requests", minimum=0)
        sampling = fields.text("sampling")
        if sampling not in WARMUP_SAMPLING:
            raise ScenarioError(
                fields.at("sampling"),
                f"unknown sampling {sampling!r}; known: {', '.join(WARMUP_SAMPLING)}",
            )
        vllm = _releases(fields)
        fields.done()
        passes.append(WarmupPass(requests, sampling, vllm))
    return tuple(passes)


def _releases(fields: _Fields) -> str | None:
    """The optional ``vllm`` field: a version specifier naming vLLM releases."""
    raw = fields.raw("vllm")
    if raw is None:
        return None
    try:
        SpecifierSet(str(raw))
    except InvalidSpecifier:
        raise ScenarioError(
            fields.at("vllm"), f"not a version specifier: {raw!r} (e.g. '>=0.33.0')"
        ) from None
    return str(raw)


def _parse_requests(raw: Any, where: Location, at: Location) -> dict[str, RequestSpec]:
    def request(name: str, fields: _Fields, request_at: Location) -> RequestSpec:
        if name in ("repeat", "step", "steps"):
            raise ScenarioError(
                fields.at("prompt_len"), f"{name!r} is reserved in steps; rename the request"
            )
        return RequestSpec(
            name=name,
            prompt_len=fields.integer("prompt_len"),
            encoder_len=fields.integer("encoder_len", 0, minimum=0),
            prefix_from=fields.raw("prefix_from"),
            prefix_len=fields.integer("prefix_len", 0, minimum=0),
            where=request_at,
        )

    return _parse_request_map(raw, where, at, "a trajectory", request)


def _parse_steps(
    raw: Any,
    where: Location,
    at: Location,
    requests: dict[str, RequestSpec],
    model: ModelSpec,
    speculative: SpeculativeSpec | None,
) -> tuple[Step, ...]:
    if not isinstance(raw, LineList) or not raw:
        raise ScenarioError(at, "a trajectory needs a non-empty list of steps")
    tokens = {name: RequestTokens(spec) for name, spec in requests.items()}
    num_spec = speculative.num_speculative_tokens if speculative else None
    steps: list[Step] = []
    # A request whose call had a problem: its later calls would only repeat it.
    broken: set[str] = set()
    for line, body in _unroll(raw, where, "steps"):
        step_where = Location(where.file, line, f"steps[{len(steps)}]")
        if body is None:
            _report(
                ScenarioError(
                    step_where,
                    "an empty step: a '-' with nothing after it; write {request: action} "
                    "there, or delete the line",
                )
            )
            steps.append(Step(len(steps), (), line))
            continue
        if not isinstance(body, LineDict) or not body:
            _report(
                ScenarioError(
                    step_where,
                    f"a step maps request names to actions, e.g. {{a: decode}}, not {_shown(body)}",
                )
            )
            steps.append(Step(len(steps), (), line))
            continue
        calls = []
        for request, action_raw in body.items():
            call_where = step_where.at(f"{step_where.field}.{request}", body.line_of(request))
            if request in broken:
                continue
            if request not in tokens:
                _report(
                    ScenarioError(
                        call_where,
                        f"unknown request {request!r}{_hint(request, tokens)}; requests: "
                        + ", ".join(tokens),
                    )
                )
                broken.add(request)
                continue

            def call(request: str, action_raw: Any, call_where: Location) -> Any:
                refused = isinstance(action_raw, LineDict) and "refused" in action_raw
                if refused:
                    wrapper = _Fields(action_raw, call_where, call_where.field or "")
                    action_raw = wrapper.raw("refused")
                    wrapper.done()
                    call_where = wrapper.at("refused")
                action, count, accepted, options = _parse_action(action_raw, call_where)
                return tokens[request].apply(
                    action,
                    call_where,
                    count=count,
                    accepted=accepted,
                    max_model_len=model.max_model_len,
                    num_speculative_tokens=num_spec,
                    refused=refused,
                    options=options,
                )

            made, ok = _attempt(call, request, action_raw, call_where)
            if ok:
                calls.append(made)
            else:
                broken.add(request)
        steps.append(Step(len(steps), tuple(calls), line))
    return tuple(steps)


def _unroll(raw: LineList, where: Location, path: str) -> Iterable[tuple[int | None, Any]]:
    for i, body in enumerate(raw):
        line = raw.line_of(i)
        if isinstance(body, LineDict) and "repeat" in body:
            fields = _Fields(body, Location(where.file, line), f"{path}[{i}]")
            times = fields.integer("repeat")
            inner = fields.raw("steps")
            if inner is None:
                single = fields.raw("step")
                if single is None:
                    raise ScenarioError(fields.at("step"), "repeat needs 'step' or 'steps'")
                inner = LineList([single])
                inner.line, inner.item_lines = body.line_of("step"), [body.line_of("step") or 0]
            fields.done()
            if not isinstance(inner, LineList) or not inner:
                raise ScenarioError(fields.at("steps"), "must be a non-empty list of steps")
            for _ in range(times):
                yield from _unroll(inner, where, f"{path}[{i}].steps")
        else:
            yield line, body


def _parse_action(raw: Any, where: Location) -> tuple[Action, int, int | None, ChunkOptions]:
    if raw is None:
        raise ScenarioError(
            where,
            "no action after the request's name; use decode, finish, preempt, "
            "{prefill: N} or {spec: K}",
        )
    if isinstance(raw, str):
        try:
            action = Action(raw)
        except ValueError:
            action = None
        if action in (Action.DECODE, Action.FINISH, Action.PREEMPT):
            return action, 0, None, NO_CHUNK_OPTIONS
        hint = _hint(raw, ("decode", "finish", "preempt"))
        raise ScenarioError(
            where,
            f"unknown action {raw!r}{hint}; use decode, finish, preempt, {{prefill: N}} or "
            "{spec: K}",
        )
    if isinstance(raw, LineDict):
        fields = _Fields(raw, Location(where.file, where.line), where.field or "")
        if "prefill" in raw:
            count = fields.integer("prefill")
            options = _parse_chunk_options(fields)
            fields.done()
            return Action.PREFILL, count, None, options
        if "spec" in raw:
            count = fields.integer("spec")
            accepted = fields.optional_int("accepted")
            fields.done()
            return Action.SPEC, count, accepted, NO_CHUNK_OPTIONS
    shown = _shown(raw) if not isinstance(raw, LineDict) else "{" + ", ".join(raw) + "}"
    hint = _hint(next(iter(raw)), ("prefill", "spec")) if isinstance(raw, LineDict) and raw else ""
    raise ScenarioError(
        where,
        f"unknown action {shown}{hint}; use decode, finish, preempt, {{prefill: N}} or {{spec: K}}",
    )


def _parse_chunk_options(fields: _Fields) -> ChunkOptions:
    """A prefill's scheduler arguments, stated outcomes and tokens in flight (scenarios/README.md)."""
    options = ChunkOptions(
        external=fields.integer("external", 0, minimum=0),
        load_async=fields.flag("load_async", False),
        full_sequence_must_fit=fields.flag("full_sequence_must_fit", False),
        reserved_blocks=fields.integer("reserved_blocks", 0, minimum=0),
        expect_hit=fields.optional_int("expect_hit"),
        in_flight=fields.integer("in_flight", 0, minimum=0),
    )
    return options if options != NO_CHUNK_OPTIONS else NO_CHUNK_OPTIONS


# -- engine scenarios ------------------------------------------------------------------
#
# An engine scenario (scenarios/README.md, "Engine scenarios") describes what a user gives
# ``vllm.LLM``: the target and draft model shapes, the engine options, the speculative
# config and the requests; vLLM's engine decides every step. The ``model`` section keeps
# its meaning (block size, ``max_model_len``, prefix caching as ``enable_caching``); its
# group list must stay the default, since the engine builds its groups from the model.

# Methods whose drafter is a separate model kvconform writes (the draft shape applies).
DRAFT_MODEL_METHODS = tuple(name for name, m in METHODS.items() if m.has_draft_model)
DTYPES = ("bfloat16", "float16", "float32")


def parse_engine(
    raw: Any, where: Location, at: Location, speculative: SpeculativeSpec | None,
    model: ModelSpec, raw_requests: Any, requests_at: Location,
) -> tuple[EngineSpec, dict[str, RequestSpec]]:  # fmt: skip
    if tuple(g.type for g in model.groups) != DEFAULT_GROUPS:
        raise ScenarioError(
            where.at("model.groups"),
            "an engine scenario takes its KV-cache groups from the model vLLM builds; "
            "remove model.groups",
        )
    if speculative is not None and speculative.num_lookahead_tokens is not None:
        raise ScenarioError(
            speculative.where or where,
            "speculative.num_lookahead_tokens: an engine scenario takes the lookahead from "
            "the engine's own vllm_config; remove the override",
        )
    fields = _Fields(raw, where, "engine")
    runner = fields.text("model_runner", "v2")
    if runner not in ENGINE_RUNNERS:
        raise ScenarioError(
            fields.at("model_runner"), f"must be one of {', '.join(ENGINE_RUNNERS)}, not {runner!r}"
        )
    target = _parse_shape(fields.raw("target", None), fields, "target", TinyModel())
    draft = None
    if speculative is not None and speculative.method in DRAFT_MODEL_METHODS:
        draft = _parse_shape(fields.raw("draft", None), fields, "draft",
                             replace(target, layers=1))  # fmt: skip
    elif fields.raw("draft") is not None:
        raise ScenarioError(
            fields.at("draft"),
            f"only methods with a draft model ({', '.join(DRAFT_MODEL_METHODS)}) take a draft shape",
        )
    utilization = fields.raw("gpu_memory_utilization", 0.2)
    if not isinstance(utilization, float) or not 0 < utilization < 1:
        raise ScenarioError(
            fields.at("gpu_memory_utilization"),
            f"must be a fraction in (0, 1), not {utilization!r}",
        )
    spec_fields: dict[str, Any] = {
        "max_num_seqs": fields.integer("max_num_seqs", 4),
        "max_num_batched_tokens": fields.optional_int("max_num_batched_tokens", minimum=1),
        "enable_chunked_prefill": _optional_flag(fields, "enable_chunked_prefill"),
        "async_scheduling": _optional_flag(fields, "async_scheduling"),
        "enforce_eager": fields.flag("enforce_eager", True),
        "num_gpu_blocks": fields.optional_int("num_gpu_blocks", minimum=2),
    }
    fields.done()
    vocab = target.vocab

    def request(name: str, req: _Fields, request_at: Location) -> RequestSpec:
        tokens = req.raw("prompt_token_ids")
        if tokens is not None:
            if (
                not isinstance(tokens, list)
                or not tokens
                or not all(
                    isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab
                    for t in tokens
                )
            ):
                raise ScenarioError(
                    req.at("prompt_token_ids"),
                    f"must be a non-empty list of token ids below {vocab}",
                )
            if "prompt_len" in req.mapping:
                raise ScenarioError(
                    req.at("prompt_len"), "give prompt_len or prompt_token_ids, not both"
                )
            prompt_len = len(tokens)
        else:
            prompt_len = req.integer("prompt_len")
        max_tokens = req.integer("max_tokens", RequestSpec.max_tokens)
        if prompt_len + max_tokens > model.max_model_len:
            raise ScenarioError(
                req.at("max_tokens"),
                f"prompt ({prompt_len}) plus max_tokens ({max_tokens}) exceed max_model_len "
                f"{model.max_model_len}: the engine would stop the request early",
            )
        temperature = req.raw("temperature", 0.0)
        if (
            isinstance(temperature, bool)
            or not isinstance(temperature, int | float)
            or temperature < 0
        ):
            raise ScenarioError(
                req.at("temperature"), f"must be a number >= 0, not {temperature!r}"
            )
        seed = req.optional_int("seed", minimum=0)
        if temperature and seed is None:
            raise ScenarioError(
                req.at("temperature"),
                "sampling with a temperature needs a seed, so the run repeats",
            )
        spec = RequestSpec(
            name=name,
            prompt_len=prompt_len,
            where=request_at,
            arrival=req.integer("arrival", 0, minimum=0),
            max_tokens=max_tokens,
        )
        index = len(engine_requests)
        engine_requests.append(
            EngineRequest(
                name,
                tuple(tokens) if tokens is not None else distinct_prompt(index, prompt_len, vocab),
                max_tokens,
                spec.arrival,
                float(temperature),
                seed,
            )
        )
        return spec

    engine_requests: list[EngineRequest] = []
    requests = _parse_request_map(raw_requests, where, requests_at, "an engine scenario", request)
    engine = EngineSpec(target, draft, tuple(engine_requests), runner,
                        where=Location(where.file, fields.mapping.line or at.line, "engine"),
                        **spec_fields)  # fmt: skip
    if engine.max_num_batched_tokens is not None and engine.enable_chunked_prefill is False:
        longest = max(r.prompt_len for r in requests.values())
        if longest > engine.max_num_batched_tokens:
            raise ScenarioError(
                fields.at("max_num_batched_tokens"),
                f"without chunked prefill a {longest}-token prompt needs max_num_batched_tokens "
                f">= {longest}",
            )
    return engine, requests


def distinct_prompt(index: int, length: int, vocab: int) -> tuple[int, ...]:
    """A prompt of ``length`` tokens that no other request of the scenario shares a block of."""
    start = 1 + (index * 7919) % (vocab - 1)
    return tuple(1 + (start + t - 1) % (vocab - 1) for t in range(length))


def _optional_flag(fields: _Fields, key: str) -> bool | None:
    return None if fields.mapping.get(key) is None else fields.flag(key, False)


def _parse_shape(raw: Any, parent: _Fields, key: str, default: TinyModel) -> TinyModel:
    if raw is None:
        return default
    fields = _Fields(raw, parent.where, f"engine.{key}")
    values: dict[str, Any] = {}
    for name in ("layers", "hidden_size", "intermediate_size", "heads", "kv_heads", "vocab"):
        values[name] = fields.integer(name, getattr(default, name))
    values["architecture"] = fields.text("architecture", default.architecture)
    values["dtype"] = fields.text("dtype", default.dtype)
    fields.done()
    if values["architecture"] not in ENGINE_TARGETS:
        raise ScenarioError(
            fields.at("architecture"),
            f"must be one of {', '.join(ENGINE_TARGETS)}, not {values['architecture']!r}",
        )
    if values["dtype"] not in DTYPES:
        raise ScenarioError(fields.at("dtype"), f"must be one of {', '.join(DTYPES)}")
    if values["hidden_size"] % values["heads"] or values["heads"] % values["kv_heads"]:
        raise ScenarioError(
            fields.at("heads"), "hidden_size must divide by heads, and heads by kv_heads"
        )
    return replace(default, **values)
