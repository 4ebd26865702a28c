"""Calls into vLLM across signatures (:mod:`kvconform.oracles.vllm.calls`), without vLLM.

``call`` drops the keywords a release's callee does not take; ``call_leaving_defaults``
also leaves out the arguments equal to the defaults the callee declared when first read,
so that a mutation campaign's child, which swaps in a mutated default, runs it.
"""

from __future__ import annotations

from kvconform.oracles.vllm.calls import accepts_keyword, call, call_leaving_defaults


def test_call_drops_keywords_the_callee_does_not_take() -> None:
    def older(num_new_tokens: int) -> int:
        return num_new_tokens

    assert call(older, num_new_tokens=3, skip_zeroing_group_ids=()) == 3


def test_a_mutated_default_is_what_a_call_at_the_declared_default_runs() -> None:
    def allocate(num_new_tokens: int, num_lookahead_tokens: int = 0, delay: bool = False):
        return (num_new_tokens, num_lookahead_tokens, delay)

    # The clean run reads the signature first: 0 and False are the declared defaults.
    assert call_leaving_defaults(allocate, num_new_tokens=4, num_lookahead_tokens=0) == (
        4,
        0,
        False,
    )
    allocate.__defaults__ = (1, False)  # what the campaign's child does for a default mutant
    assert call_leaving_defaults(allocate, num_new_tokens=4, num_lookahead_tokens=0) == (
        4,
        1,
        False,
    )
    # A value that is not the declared default is always passed.
    assert call_leaving_defaults(allocate, num_new_tokens=4, num_lookahead_tokens=2) == (
        4,
        2,
        False,
    )
    # Plain call() passes everything it is given, whatever the defaults say.
    assert call(allocate, num_new_tokens=4, num_lookahead_tokens=0) == (4, 0, False)


def test_only_the_same_plain_value_counts_as_the_default() -> None:
    def allocate(flag: object = 0, blocks: object = None, name: str = "x"):
        return (flag, blocks, name)

    call_leaving_defaults(allocate)  # first read: defaults 0, None, "x"
    allocate.__defaults__ = ("changed", "changed", "changed")
    # False == 0 but is not the same value: passed as given, not left to the default.
    assert call_leaving_defaults(allocate, flag=False)[0] is False
    # An object that is not a plain value is always passed.
    marker: list[int] = []
    assert call_leaving_defaults(allocate, blocks=marker)[1] is marker
    assert call_leaving_defaults(allocate, name="x")[2] == "changed"


def test_accepts_keyword_reads_the_signature() -> None:
    def older(request: object, num_new_tokens: int) -> None: ...

    def newer(request: object, num_new_tokens: int, skip_zeroing_group_ids: tuple = ()) -> None: ...

    def open_ended(**kwargs: object) -> None: ...

    assert not accepts_keyword(older, "skip_zeroing_group_ids")
    assert accepts_keyword(newer, "skip_zeroing_group_ids")
    assert accepts_keyword(open_ended, "skip_zeroing_group_ids")


def test_forwarded_defaults_are_read_from_the_functions_as_they_are_now() -> None:
    # Plain classes standing in for a coordinator and a manager: the reader compares the
    # defaults of parameters both methods of one name declare, positional or keyword-only.
    from kvconform.oracles.vllm.managers import _shared_defaults

    class Coordinator:
        def count(self, request_id, cap=False, *, end=0): ...

        def only_here(self, flag=True): ...

    class Manager:
        def count(self, request_id, tokens, cap=False, *, end=0): ...

    assert list(_shared_defaults(Coordinator, Manager)) == [
        ("count(cap)", False, False),
        ("count(end)", 0, 0),
    ]
    # A mutation campaign's child changes a default in place after the clean run.
    Manager.count.__defaults__ = (True,)
    assert ("count(cap)", False, True) in list(_shared_defaults(Coordinator, Manager))


def test_the_predictor_is_bound_by_its_signature(vllm) -> None:
    """0.28-0.33's ``_reserved_block_count`` gets no ``vllm_config`` or DCP size; a
    predictor with 0.34's signature gets both: a real model-free ``VllmConfig`` whose
    parallel config has the scenario's DCP size."""
    installed = vllm.reserved_block_count
    assert installed is not None
    bound = vllm.block_counter(num_lookahead_tokens=3, max_model_len=64, dcp_world_size=2)
    assert bound is not None
    if not accepts_keyword(installed, "vllm_config"):
        assert set(bound.keywords) == {"num_lookahead_tokens", "max_model_len"}
    spec = vllm.build_spec("full_attention", 16, {})
    assert bound(20, spec, max_encoder_len=0) == installed(
        20, spec, **bound.keywords, max_encoder_len=0
    )

    seen: dict[str, object] = {}

    def reserved_block_count_034(
        num_tokens, kvcache_spec, *, vllm_config, num_lookahead_tokens, max_model_len,
        max_encoder_len, dcp_world_size=1,
    ) -> int:  # fmt: skip
        seen.update(vllm_config=vllm_config, dcp_world_size=dcp_world_size)
        return kvcache_spec.max_num_blocks_per_req(vllm_config, max_model_len)

    vars(vllm)["reserved_block_count"] = reserved_block_count_034
    try:
        bound = vllm.block_counter(num_lookahead_tokens=3, max_model_len=64, dcp_world_size=2)
        assert bound is not None
        # The row of a dcp_sharded spec: cdiv(64, 16 x 2) columns.
        assert bound(20, spec, max_encoder_len=0) == 2
    finally:
        vars(vllm)["reserved_block_count"] = installed
    config = seen["vllm_config"]
    assert type(config).__name__ == "VllmConfig" and seen["dcp_world_size"] == 2
    assert config.parallel_config.decode_context_parallel_size == 2  # type: ignore[attr-defined]
    assert vllm.predictor_vllm_config(2) is config  # built once per DCP size


def test_forwarded_defaults_are_remembered_until_vllm_forgets_its_answers(
    vllm, monkeypatch
) -> None:
    """A mutation campaign's child mutates a default, then calls ``forget_answers``
    (kvconform/mutate/campaign.py): the facade's remembered answer must follow it."""
    from pathlib import Path

    from kvconform.harness.loader import load_paths
    from kvconform.oracles.live import LiveAllocator
    from kvconform.oracles.resolve import new_trajectory

    corpus = Path(__file__).resolve().parent.parent / "scenarios" / "specs"
    scenario = next(s for s in load_paths([str(corpus)]).scenarios if s.kind.value == "trajectory")
    manager = LiveAllocator(vllm, scenario.model, new_trajectory(scenario, vllm)).manager
    clean = vllm.forwarded_default_disagreements(manager)
    coordinator = type(manager.coordinator)
    method = coordinator.remove_skipped_blocks
    defaults = method.__defaults__
    assert defaults, "remove_skipped_blocks declares num_prompt_tokens' default"
    # Every default of the coordinator's method changed to one no manager declares.
    monkeypatch.setattr(method, "__defaults__", tuple(12345 for _ in defaults))
    assert vllm.forwarded_default_disagreements(manager) == clean  # remembered
    vllm.forget_answers()
    mutated = vllm.forwarded_default_disagreements(manager)
    assert any("remove_skipped_blocks(num_prompt_tokens)" in line for line in mutated), mutated
    monkeypatch.undo()
    vllm.forget_answers()
    assert vllm.forwarded_default_disagreements(manager) == clean
