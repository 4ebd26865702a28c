"""Token arithmetic of a trajectory: what each action does to a request's counts.

This is the one place that knows how vLLM's scheduler moves a request's
``num_computed_tokens`` (read from ``vllm/v1/core/sched/scheduler.py``):

* A request that has not sampled since it (re)started needs a prefill: the
  prompt the first time, prompt plus outputs after a preemption. Chunks are
  scheduled until that is done; the chunk that completes it samples one token.
* A running request then has exactly one uncomputed token, the last sampled one.
  ``decode`` schedules it alone; ``spec K`` schedules it with K drafts, and after
  the step the K - A rejected drafts are rolled back from the computed count
  while A accepted tokens plus one bonus token are appended.
* The scheduler never lets ``computed + scheduled`` pass ``max_model_len - 1``
  (``num_new_tokens = min(..., max_model_len - num_computed_tokens - 1)``), so a
  step that would is impossible, not merely unusual.
* ``preempt`` frees the blocks and resets the computed count; ``finish`` frees
  them for good.
* A call the scenario marks ``refused`` (``allocate_slots`` must return ``None``)
  must be legal as written, and changes no count: vLLM's scheduler leaves a refused
  waiting request waiting, and a refused running request where it was.

:class:`RequestTokens` applies one action and returns the resolved
:class:`~kvconform.model.scenario.Call`, or raises :class:`ScenarioError` that
says why the step cannot happen.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvconform.errors import Location, ScenarioError
from kvconform.model.scenario import NO_CHUNK_OPTIONS, Action, Call, ChunkOptions, RequestSpec


@dataclass
class RequestTokens:
    spec: RequestSpec
    computed: int = 0
    outputs: int = 0
    needs_prefill: bool = True
    holds_blocks: bool = False
    finished: bool = False

    @property
    def num_tokens(self) -> int:
        return self.spec.prompt_len + self.outputs

    @property
    def pending(self) -> int:
        """Tokens known but not yet computed."""
        return self.num_tokens - self.computed

    def apply(
        self,
        action: Action,
        where: Location,
        *,
        count: int = 0,
        accepted: int | None = None,
        max_model_len: int,
        num_speculative_tokens: int | None,
        refused: bool = False,
        options: ChunkOptions = NO_CHUNK_OPTIONS,
        deferred_free: bool = False,
    ) -> Call:
        name = self.spec.name
        if self.finished:
            raise ScenarioError(where, f"request {name!r} has already finished")
        if refused and action in (Action.FINISH, Action.PREEMPT):
            raise ScenarioError(
                where, f"only an allocating action can be refused, not {action.value}"
            )
        if refused and options.expect_hit is not None:
            raise ScenarioError(
                where,
                "a refused admission adopts no prefix-cache hit; state expect_hit on the "
                "chunk that is admitted",
            )
        if action is Action.FINISH:
            self.finished = True
            self.holds_blocks = False
            if deferred_free:
                return Call(
                    name, action, self.computed, 0, label="finish (in flight)", deferred_free=True
                )
            return Call(name, action, self.computed, 0, label="finish")
        if action is Action.PREEMPT:
            if not self.holds_blocks:
                raise ScenarioError(
                    where, f"request {name!r} holds no blocks to preempt (it is not running)"
                )
            computed = self.computed
            self.computed = 0
            self.needs_prefill = True
            self.holds_blocks = False
            return Call(name, action, computed, 0, label="preempt")

        first_chunk = not self.holds_blocks
        before = self.computed
        if action is Action.PREFILL:
            if not self.needs_prefill:
                raise ScenarioError(
                    where,
                    f"request {name!r} has no prompt left to prefill (computed {before} of "
                    f"{self.num_tokens} tokens); use decode or spec",
                )
            if count < 1 or count > self.pending:
                raise ScenarioError(
                    where,
                    f"prefill {count} is outside 1..{self.pending}, the tokens request "
                    f"{name!r} still has to prefill",
                )
            scheduled, rejected = count, 0
            # An asynchronous load computes nothing, so it samples nothing either.
            sampled = 1 if count == self.pending and not options.load_async else 0
            label = f"prefill {count}"
            if options.admission_only:
                self._check_admission(options, count, first_chunk, where)
            if options.in_flight:
                self._check_in_flight(options.in_flight, first_chunk, before, where)
        else:
            if self.needs_prefill:
                raise ScenarioError(
                    where,
                    f"request {name!r} cannot {action.value} before its prefill is complete "
                    f"({self.pending} tokens left to prefill)",
                )
            if action is Action.DECODE:
                scheduled, rejected, sampled, label = 1, 0, 1, "decode"
            else:
                if num_speculative_tokens is None:
                    raise ScenarioError(where, "a spec step needs a 'speculative' section")
                if count < 1 or count > num_speculative_tokens:
                    raise ScenarioError(
                        where,
                        f"spec {count} is outside 1..{num_speculative_tokens}: vLLM schedules at "
                        "most num_speculative_tokens drafts",
                    )
                accepted = count if accepted is None else accepted
                if not 0 <= accepted <= count:
                    raise ScenarioError(where, f"accepted {accepted} is outside 0..{count}")
                scheduled, rejected, sampled = 1 + count, count - accepted, accepted + 1
                label = f"spec {count} ({accepted} accepted)"
        if before + scheduled > max_model_len - 1:
            raise ScenarioError(
                where,
                f"{label} at {before} computed tokens passes max_model_len {max_model_len}: "
                f"vLLM's scheduler schedules at most max_model_len - computed - 1 = "
                f"{max_model_len - before - 1} tokens",
            )
        if refused:
            return Call(
                name, action, before, scheduled, 0, 0, first_chunk, f"{label} (refused)", True,
                options,
            )  # fmt: skip
        self.computed = before + scheduled - rejected
        self.outputs += sampled
        if sampled:
            self.needs_prefill = False
        self.holds_blocks = True
        return Call(
            name, action, before, scheduled, rejected, sampled, first_chunk, label, False, options
        )

    def _check_in_flight(
        self, in_flight: int, first_chunk: bool, computed: int, where: Location
    ) -> None:
        """In-flight tokens are earlier steps' tokens: a running request's, within its computed."""
        if first_chunk:
            raise ScenarioError(
                where,
                "in_flight belongs to a later chunk of a running request (the tokens its "
                f"earlier steps still have in flight); request {self.spec.name!r} is admitted "
                "by this chunk",
            )
        if in_flight > computed:
            raise ScenarioError(
                where,
                f"in_flight {in_flight} exceeds the {computed} tokens request "
                f"{self.spec.name!r} has computed: vLLM counts scheduled tokens as computed "
                "when it schedules them, so the tokens in flight are among them",
            )

    def _check_admission(
        self, options: ChunkOptions, count: int, first_chunk: bool, where: Location
    ) -> None:
        """The options only a first chunk takes, and the tokens they leave to compute."""
        name = self.spec.name
        if not first_chunk:
            raise ScenarioError(
                where,
                "external, connector, load_async, full_sequence_must_fit, reserved_blocks and "
                "expect_hit belong to a first chunk (the request admitted from the waiting "
                f"queue); request {name!r} is already running",
            )
        if options.connector is not None and options.external:
            raise ScenarioError(
                where,
                "external is what the connector answers when the chunk states connector: "
                "state one of the two",
            )
        # With a connector the scheduler derives the external tokens (and trims the hit):
        # what the chunk leaves to compute is known only when it runs.
        derived = options.connector is not None
        known = options.external + (options.expect_hit or 0)
        if options.load_async:
            # The step adopts the hit and the loaded tokens and computes none; the
            # prompt's last token is left to a later chunk, for its logits.
            if not options.external and not derived:
                raise ScenarioError(where, "load_async needs external tokens to load")
            if count > self.pending - 1:
                raise ScenarioError(
                    where,
                    f"an asynchronous load of prefill {count} covers the whole prompt; vLLM "
                    "leaves at least its last token to compute (prefill at most "
                    f"{self.pending - 1})",
                )
            if options.expect_hit is not None and known != count and not derived:
                raise ScenarioError(
                    where,
                    f"an asynchronous load computes nothing: prefill {count} must be the "
                    f"hit plus the external tokens ({known})",
                )
            return
        if options.reserved_blocks:
            raise ScenarioError(
                where,
                "reserved_blocks is what the scheduler keeps free for the prefills in flight "
                "when it admits an asynchronous load; it needs load_async",
            )
        # The connector and the local hit never cover the whole chunk: the scheduler
        # computes at least one token (the last one, for its logits).
        if known > count - 1 and not derived:
            raise ScenarioError(
                where,
                f"external {options.external} plus expect_hit {options.expect_hit or 0} leave "
                f"none of prefill {count} to compute; vLLM computes at least one token of it",
            )
