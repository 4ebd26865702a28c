"""coverage.py in a child process that runs vLLM (engine mode's child), when the parent asks.

The parent (:mod:`kvconform.harness.vllm_code`) measures vLLM's reservation code in
its own process; an oracle that runs vLLM in a child process calls
:func:`measure_child` there. When the parent measures, it sets :data:`ENVIRONMENT`
to a JSON object: the data file's stem (each child writes ``STEM.child.PID.*``,
combined by the parent), the include patterns and the dynamic context (the
scenario running). Without the variable this does nothing, and coverage.py is
not imported.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

ENVIRONMENT = "KVCONFORM_VLLM_COVERAGE"


def child_settings(data_file: str, include: list[str], context: str) -> str:
    return json.dumps({"data_file": data_file, "include": include, "context": context})


def measuring() -> bool:
    """Whether this process's run is measured (the parent's tracer or :func:`measure_child`)."""
    return bool(os.environ.get(ENVIRONMENT)) and "coverage" in sys.modules


@contextmanager
def untraced(function: Any) -> Iterator[None]:
    """Run the block with the measurement paused, and record ``function`` (a plain Python
    function) as executed by the scenario running: its entry, not its lines.

    For vLLM's Triton slot-mapping kernel under Triton's interpreter on a CPU: traced, every
    Python call of the interpreter doubled the ``slots`` check's time, for the lines of a
    kernel whose CPU interpretation says little about the compiled one.
    """
    import coverage

    cov = coverage.Coverage.current() if measuring() else None
    if cov is None:
        yield
        return
    cov.stop()
    try:
        yield
    finally:
        context = str(json.loads(os.environ[ENVIRONMENT]).get("context", ""))
        code = function.__code__
        body = [line for _, _, line in code.co_lines() if line and line > code.co_firstlineno]
        if body:
            data = cov.get_data()
            data.set_context(context)
            data.add_arcs({code.co_filename: {(-code.co_firstlineno, min(body))}})
        cov.start()
        cov.switch_context(context)


@contextmanager
def measure_child() -> Iterator[None]:
    """Measure the block's execution of vLLM's reservation code when the parent asks."""
    raw = os.environ.get(ENVIRONMENT)
    if not raw:
        yield
        return
    settings: dict[str, Any] = json.loads(raw)
    import coverage

    cov = coverage.Coverage(
        data_file=f"{settings['data_file']}.child",
        data_suffix=True,
        branch=True,
        include=list(settings["include"]),
        config_file=False,
    )
    cov.start()
    cov.switch_context(str(settings.get("context", "")))
    try:
        yield
    finally:
        cov.stop()
        cov.save()
