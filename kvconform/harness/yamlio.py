"""Safe YAML reading that remembers line numbers and refuses duplicate keys.

PyYAML's ``SafeLoader`` forgets where things were written and lets a later key
silently replace an earlier one. Scenario errors must name the line of the bad
field, and a duplicated step or request is almost always a mistake, so mappings
are built as :class:`LineDict`: a plain ``dict`` that also knows its own line
and the line of each key.
"""

from __future__ import annotations

from typing import Any

import yaml

from kvconform.errors import Location, ScenarioError


class LineDict(dict[str, Any]):
    line: int | None = None
    key_lines: dict[str, int]

    def line_of(self, key: str) -> int | None:
        return self.key_lines.get(key, self.line)


class LineList(list[Any]):
    line: int | None = None
    item_lines: list[int]

    def line_of(self, index: int) -> int | None:
        return self.item_lines[index] if index < len(self.item_lines) else self.line


# libyaml's parser (when PyYAML was built with it) is several times faster and
# gives the same nodes, marks and errors; the fuzzer parses thousands of files a minute.
SAFE_LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(SAFE_LOADER):
    file_name = "<string>"


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> LineDict:
    loader.flatten_mapping(node)
    result = LineDict()
    result.line = node.start_mark.line + 1
    result.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if not isinstance(key, (str, int, float, bool)) or key is None:
            raise ScenarioError(Location(loader.file_name, line), f"unsupported key {key!r}")
        key = str(key)
        if key in result:
            raise ScenarioError(
                Location(loader.file_name, line, key),
                f"duplicate key (first written on line {result.key_lines[key]})",
            )
        result[key] = loader.construct_object(value_node, deep=True)
        result.key_lines[key] = line
    return result


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> LineList:
    result = LineList(loader.construct_object(child, deep=True) for child in node.value)
    result.line = node.start_mark.line + 1
    result.item_lines = [child.start_mark.line + 1 for child in node.value]
    return result


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _construct_sequence)


def _tab_line(text: str, line: int | None) -> int | None:
    """The line of the tab a YAML error is about: the error's line, else the first
    line indented with a tab (PyYAML may notice it a line later)."""
    lines = text.splitlines()
    if line is not None and 0 < line <= len(lines) and "\t" in lines[line - 1]:
        return line
    for number, content in enumerate(lines, 1):
        if content[: len(content) - len(content.lstrip())].count("\t"):
            return number
    return None


def load_yaml(text: str, file_name: str) -> Any:
    """Parse one YAML document; syntax errors become :class:`ScenarioError`."""
    loader = _Loader(text)
    loader.file_name = file_name
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or exc.context or "invalid YAML"
        tab = _tab_line(text, line)
        if tab is not None:
            # PyYAML's words for a tab ("found character that cannot start any token")
            # name neither the tab nor the fix.
            raise ScenarioError(
                Location(file_name, tab),
                "a tab character: YAML indents with spaces only; replace the tab with spaces",
            ) from None
        raise ScenarioError(Location(file_name, line), f"invalid YAML: {problem}") from None
    except yaml.reader.ReaderError as exc:
        # A character YAML does not allow (a control character): PyYAML gives its offset.
        line = text.count("\n", 0, exc.position) + 1
        what = (
            f"U+{exc.character:04X}" if isinstance(exc.character, int) else repr(exc.character)
        )
        raise ScenarioError(
            Location(file_name, line),
            f"the character {what} at offset {exc.position}: YAML allows no control "
            "characters; delete it",
        ) from None
    except yaml.YAMLError as exc:
        raise ScenarioError(Location(file_name, 1), f"invalid YAML: {exc}") from None
    finally:
        loader.dispose()
