"""Scenario documents to YAML text, and the reproducer's comment header.

A fuzz example is a plain dict shaped like a v1 scenario file. :func:`render`
turns it into the text the fuzzer then loads through the real loader, so the
reproducer written for a finding is, byte for byte after its comment header,
the text that was run. The layout is the one people write by hand: block style
for the sections, one flow-style line per group, request and step, so a
shrunk reproducer reads as a short list of steps.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from kvconform.model.kinds import KINDS

_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
_YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "y", "n", "~"}
# The kinds' own sections of settings (a mapping each), rendered one setting a line.
_SETTINGS_SECTIONS = frozenset(
    section
    for kind in KINDS.values()
    for section in kind.sections
    if section not in ("requests", "steps")
)


def flow(value: Any) -> str:
    """One value in YAML flow style (the subset scenario documents use)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):  # an acceptance rate
        return repr(value)
    if isinstance(value, str):
        if _PLAIN.match(value) and value.lower() not in _YAML_WORDS:
            return value
        return json.dumps(value)  # a JSON string is a valid YAML scalar
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{flow(k)}: {flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(flow(v) for v in value) + "]"
    if value is None:
        return "null"
    raise TypeError(f"cannot render {value!r} in a scenario document")


def render(doc: Mapping[str, Any]) -> str:
    """The YAML text of a scenario document."""
    lines: list[str] = []
    for key, value in doc.items():
        if key == "model":
            lines.append("model:")
            for field, item in value.items():
                if field == "groups":
                    lines.append("  groups:")
                    lines += [f"    - {flow(group)}" for group in item]
                else:
                    lines.append(f"  {field}: {flow(item)}")
        elif key in _SETTINGS_SECTIONS:  # a kind's settings (scheduler, ...), one per line
            lines.append(f"{key}:")
            lines += [f"  {field}: {flow(item)}" for field, item in value.items()]
        elif key == "requests":
            lines.append("requests:")
            lines += [f"  {flow(name)}: {flow(body)}" for name, body in value.items()]
        elif key == "steps":
            lines.append("steps:")
            lines += [f"  - {flow(step)}" for step in value]
        else:
            lines.append(f"{key}: {flow(value)}")
    return "\n".join(lines) + "\n"


def with_header(text: str, header: Iterable[str]) -> str:
    """``text`` preceded by ``header`` as YAML comments."""
    comments = "".join(f"# {line}\n" if line else "#\n" for line in header)
    return comments + text
