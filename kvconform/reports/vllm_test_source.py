"""Python source for ``kvconform export --vllm-test`` (:mod:`kvconform.reports.vllm_test`):
vLLM's spec objects as constructor calls, string literals, the shared blocks and the
docstring of an exported test."""

from __future__ import annotations

import dataclasses
import enum
import re
import textwrap
from typing import Any

from kvconform import __version__
from kvconform.model.results import ErrorKind, ScenarioResult, Verdict
from kvconform.model.scenario import Scenario
from kvconform.oracles.vllm import Vllm

# shape -> the folder of vLLM's test tree the file belongs in
SHAPES = {
    "lookahead": "tests/v1/worker",
    "warmup": "tests/v1/worker",
    "manager": "tests/v1/core",
}


def test_name(scenario: Scenario) -> str:
    return "test_" + re.sub(r"[^0-9a-zA-Z]+", "_", scenario.id).strip("_").lower()


def value_source(value: Any) -> str:
    """A spec field's value as Python source (torch dtypes by name)."""
    if type(value).__module__ == "torch" and type(value).__name__ == "dtype":
        return f"torch.{str(value).removeprefix('torch.')}"
    if isinstance(value, tuple):
        return "(" + "".join(f"{value_source(v)}, " for v in value).rstrip(" ") + ")"
    if isinstance(value, list):
        return "[" + ", ".join(value_source(v) for v in value) + "]"
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, str):
        return repr_double(value)
    return repr(value)


def spec_lines(spec: Any, indent: str, width: int = 88) -> list[str]:
    """The spec's constructor call as an item of a list, split one field a line if long."""
    one = f"{indent}{spec_source(spec)},"
    if len(one) <= width:
        return [one]
    name, _, fields = spec_source(spec).partition("(")
    return [
        f"{indent}{name}(",
        *[f"{indent}    {field}," for field in _fields(fields[:-1])],
        f"{indent}),",
    ]


def _fields(text: str) -> list[str]:
    """``a=1, b=(2, 3), c=4`` split at the top-level commas."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    out.append(text[start:].strip())
    return [f for f in out if f]


def spec_source(spec: Any) -> str:
    """``FullAttentionSpec(block_size=16, ...)``: the fields that differ from their defaults."""
    parts = []
    for f in dataclasses.fields(spec):
        if not f.init:
            continue
        value = getattr(spec, f.name)
        has_default = f.default is not dataclasses.MISSING or (
            f.default_factory is not dataclasses.MISSING
        )
        default = f.default if f.default is not dataclasses.MISSING else None
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        if has_default and value == default:
            continue
        parts.append(f"{f.name}={value_source(value)}")
    return f"{type(spec).__name__}({', '.join(parts)})"



def _finding(result: ScenarioResult, checks: tuple[str, ...]) -> str:
    crashed = result.verdict is Verdict.ERROR and result.error_kind is ErrorKind.CRASH
    records = [" ".join(f.message.split()) for f in result.failures if f.check in checks]
    text = (result.error or "") if crashed else "; ".join(records[:2])
    if not crashed and len(records) > 2:
        text += f"; and {len(records) - 2} more such records"
    return textwrap.fill(text, 84, initial_indent="    ", subsequent_indent="    ")


def docstring_lines(
    summary: str, scenario: Scenario, result: ScenarioResult, vllm: Vllm, shape: str, body: str
) -> list[str]:
    checks = {"lookahead": ("lookahead",), "warmup": ("agree",)}.get(shape, ("floor",))
    return [
        f'"""{summary}',
        "",
        *textwrap.wrap(body, 88),
        "",
        *textwrap.wrap(
            f"kvconform's scenario {scenario.id} ({scenario.file}) found against vLLM "
            f"{vllm.version}:",
            88,
        ),
        "",
        _finding(result, checks),
        "",
        *textwrap.wrap(
            f"Written by `kvconform export {scenario.id} --vllm-test` (kvconform "
            f"{__version__}) against vLLM {vllm.version}; it belongs in {SHAPES[shape]}/ of "
            "that release's tree and uses its test helpers.",
            88,
        ),
        '"""',
    ]


def string_lines(text: str, indent: str, width: int = 88) -> list[str]:
    """``text`` as adjacent string literals, one per line, each within ``width``."""
    room = width - len(indent) - 2
    pieces = textwrap.wrap(text, room, drop_whitespace=False, break_long_words=False)
    return [indent + repr_double(piece) for piece in pieces]


def repr_double(text: str) -> str:
    """A Python string literal in double quotes."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def spec_imports(specs: list[Any], *more: str) -> list[str]:
    names = sorted({type(s).__name__ for s in specs} | set(more))
    return ["from vllm.v1.kv_cache_interface import (", *[f"    {n}," for n in names], ")"]


def specs_block(specs: list[Any]) -> list[str]:
    return [
        "",
        "",
        "def _kv_cache_groups() -> list[KVCacheGroupSpec]:",
        "    specs = [",
        *[line for s in specs for line in spec_lines(s, "        ")],
        "    ]",
        '    return [KVCacheGroupSpec([f"layer.{i}"], spec) for i, spec in enumerate(specs)]',
        "",
        "",
        "def _kv_cache_config() -> KVCacheConfig:",
        "    return KVCacheConfig(",
        "        num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=_kv_cache_groups()",
        "    )",
    ]



def dict_source(values: dict[str, Any]) -> str:
    return "{" + ", ".join(f'"{k}": {v!r}' for k, v in values.items()) + "}"

