"""From YAML files to validated :class:`Scenario` objects (format v1).

The format is documented in ``scenarios/README.md``; this package is its
executable definition, one module per part of the grammar (fields, files,
matrix, the document, the model, requests, and each kind's sections). Loading never imports vLLM: everything that can be
checked from the file alone is checked here (types, unknown fields, group
types and their options, the legality of every step), so that a bad file fails
fast, with its file, line and field, and before a 15-second import.

A file yields one scenario, or one per combination of its ``matrix``. Errors
are collected per file: :func:`load_paths` returns the scenarios of every good
file and every problem of every bad one, so one broken file never hides the
others, and one problem never hides the next in the same file. Within a file,
what does not depend on a broken part is still read: every unknown field, each
section (model, speculative, requests), each step; the steps are left unread
when a part they need is broken, and a request's later calls are read as written
but not applied when one of its calls is broken, so that one mistake is reported
once, not again as its consequences, while a later mistake of its own still is.
A file with several problems raises :class:`~kvconform.errors.FileErrors`, which
lists up to ``MAX_FILE_ERRORS`` of them and then says how many more there are.

Messages say what to write, in the scenario's words: an unknown field, group
type or request names the one probably meant (``difflib``), a missing field
names the unknown field that was probably meant for it, "known here" lists
every field allowed at that place, and a tab or an empty list item gets a plain
hint instead of PyYAML's or Python's words.
"""

from kvconform.harness.loader.files import (
    SCENARIO_SUFFIXES,
    LoadResult,
    discover,
    is_scenario_file,
    load_file,
    load_paths,
    load_text,
)

__all__ = [
    "SCENARIO_SUFFIXES",
    "LoadResult",
    "discover",
    "is_scenario_file",
    "load_file",
    "load_paths",
    "load_text",
]
