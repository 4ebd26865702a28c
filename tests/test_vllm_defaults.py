"""vLLM's defaults told truthfully: the table of docs/vllm-defaults.md is vLLM's config for
each release (regenerated here for the installed one), and a stated prefix-cache hit that
the settings deny names the setting that decided it and the value that gives the hit."""

from __future__ import annotations

import re

from kvconform.harness.defaults import TABLE_FILE, committed_rows, header, row
from kvconform.harness.runner import run_scenario
from kvconform.model.results import Verdict
from kvconform.model.settings import SETTINGS

# A full-attention + sliding-window hybrid: b shares 150 tokens of a's prompt, so dense
# retention (null) gives full attention's hit of 144 (9 blocks); sparse retention (0)
# keeps no window state there (scenarios/specs/sliding-window-retention-interval-periodic-hits.yaml
# has the periodic case).
SWA_HIT = """
model:
  block_size: 16
  max_model_len: 1024
  num_blocks: 96
  enable_caching: true{retention}
  groups:
    - full_attention
    - {{type: sliding_window, sliding_window: 32}}
requests:
  a: {{prompt_len: 200}}
  b: {{prompt_len: 160, prefix_from: a, prefix_len: 150}}
steps:
  - {{a: {{prefill: 200}}}}
  - {{a: decode}}
  - {{a: finish}}
  - {{b: {{prefill: 160, expect_hit: 144}}}}
  - {{b: finish}}
"""


def test_the_installed_releases_row_is_the_committed_one(vllm):
    text = TABLE_FILE.read_text(encoding="utf-8")
    rows = committed_rows(text)
    assert vllm.version in rows, f"docs/vllm-defaults.md has no row for {vllm.version}"
    assert rows[vllm.version] == row(vllm.version, vllm.default_settings())
    assert "\n".join(header()) in text
    # Every setting a scenario may leave to vLLM has its column.
    assert all(f"`{name}`" in header()[0] for name in SETTINGS)


def test_scenarios_readme_states_the_retention_default_as_vllms():
    readme = (TABLE_FILE.parents[1] / "scenarios" / "README.md").read_text(encoding="utf-8")
    line = next(x for x in readme.splitlines() if x.startswith("| `prefix_cache_retention_interval`"))
    assert "what every scenario without the field runs" not in line
    assert "docs/vllm-defaults.md" in line
    rows = committed_rows(TABLE_FILE.read_text(encoding="utf-8"))
    retention = list(SETTINGS).index("prefix_cache_retention_interval") + 1
    if "0.33.0" in rows:  # issue 37: the default of 0.33.0 is 0, not dense
        assert [c.strip() for c in rows["0.33.0"].split("|")[1:-1]][retention] == "`0`"


def test_a_hit_the_default_retention_denies_names_the_setting_and_the_value(
    vllm, scenario_from
):
    if vllm.default_settings().get("prefix_cache_retention_interval") is None:
        return  # a release whose default is dense retention denies nothing here
    result = run_scenario(scenario_from(SWA_HIT.format(retention="")), vllm)
    assert result.verdict is Verdict.FAILED
    (failure,) = [f for f in result.failures if "states 144" in f.message]
    assert re.search(
        r"decided by the setting prefix_cache_retention_interval: 0 \(vLLM \S+'s default, "
        r"left out\): with prefix_cache_retention_interval: null, vLLM's manager gives the "
        "stated hit",
        failure.message,
    ), failure.message
    # The value it names does give the hit: stated, the scenario passes.
    dense = SWA_HIT.format(retention="\n  prefix_cache_retention_interval: null")
    assert run_scenario(scenario_from(dense), vllm).verdict is Verdict.PASSED


def test_a_hit_prefix_caching_off_denies_names_enable_caching(vllm, scenario_from):
    text = (
        "model: {enable_caching: false, groups: [full_attention]}\n"
        "requests: {a: {prompt_len: 40}, b: {prompt_len: 40, prefix_from: a, prefix_len: 32}}\n"
        "steps:\n  - {a: {prefill: 40}}\n  - {b: {prefill: 40, expect_hit: 32}}\n"
    )
    result = run_scenario(scenario_from(text), vllm)
    (failure,) = [f for f in result.failures if "states 32" in f.message]
    assert (
        "decided by the setting enable_caching: false (stated): with enable_caching: true, "
        "vLLM's manager gives the stated hit" in failure.message
    ), failure.message
