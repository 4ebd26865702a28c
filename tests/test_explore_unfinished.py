"""A drawn workload that the run refuses as input (vLLM's scheduler leaves requests
unfinished at ``max_steps``) is counted and passed over by the search, never a crash of
the explorer (``GeneratorBug``): a run cut at ``max_steps`` is not judged (the liveness
family judges runs that end or stall, docs/contract.md), and a shrink candidate that stalls does not reproduce the finding being shrunk."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from kvconform.fuzz.search import Budget, SearchStats, run_document, search
from kvconform.harness.yamlio import load_yaml
from kvconform.model.results import ErrorKind

# A workload vLLM's scheduler cannot finish within its stated max_steps: 20 tokens to decode
# in 3 steps. (The explorer met the first such workload while shrinking on vLLM 0.34.0, a
# configuration vLLM refuses and the loader now refuses too: Mamba prefix caching without
# chunked prefill.)
UNFINISHED = """\
kind: scheduler
model:
  block_size: 16
  max_model_len: 64
  num_blocks: 11
  groups: [full_attention]
scheduler:
  mode: sync
  max_steps: 3
requests:
  a: {prompt_len: 16, max_tokens: 20}
"""


class OneDocument:
    """An example source that draws one document, always (kvconform's, for this test)."""

    name = "explore"

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc

    def documents(self) -> st.SearchStrategy[dict[str, Any]]:
        return st.just(self.doc)

    def measure(self, result: Any, doc: dict[str, Any]) -> None:
        pass


def test_a_workload_left_unfinished_is_counted_not_a_crash(vllm):
    doc = dict(load_yaml(UNFINISHED, "<unfinished>"))
    result = run_document(doc, vllm)
    if result.error_kind is None:
        return  # this vLLM finishes the workload: nothing for the search to pass over
    assert result.error_kind is ErrorKind.INPUT and "max_steps" in (result.error or ""), (
        result.error
    )
    stats = SearchStats(seed=0, budget=3)
    search(OneDocument(doc), vllm, stats, Budget(examples=3))  # raises GeneratorBug if broken
    assert stats.rejected_input == stats.examples >= 1
    assert stats.findings == []
