"""Whose a refusal of the live party is: the scenario's when its own arithmetic does not fit
the pool (:class:`~kvconform.errors.PoolExhausted`), vLLM's when it does
(:class:`~kvconform.errors.StepDenied`, judged by the ``capacity`` check)."""

from __future__ import annotations

from typing import Any

from kvconform.errors import Location, PoolExhausted, StepDenied
from kvconform.model.floors import MAMBA_ALIGNED_STATE, aligned_state_call_blocks, pool_columns
from kvconform.model.group_types import GROUP_TYPES
from kvconform.model.scenario import Call
from kvconform.oracles.live_state import LiveState


class LiveRefusals(LiveState):
    """The floor's arithmetic for a refused call against the pool."""

    def _refusal(
        self,
        call: Call,
        encoder_len: int,
        where: Location,
        free: int,
        held: list[int],
        hit: int,
        hit_blocks: Any,
    ) -> Exception:
        """Whose a refusal is: the floor's arithmetic for this call against the pool.

        New blocks the floor's arithmetic needs: per group, the columns after the call
        (:func:`~kvconform.model.floors.pool_columns`: up to computed + scheduled +
        lookahead) minus the columns the request holds and the prefix hit brings, plus
        the hit's blocks that sit in the free queue. An admission under full-sequence admission
        needs the whole sequence's columns too. The blocks it may use: the free ones
        minus ``reserved_blocks`` and, while another request runs, the watermark.
        """
        request = self._requests[call.request]
        evictable = (
            self.vllm.evictable_blocks(hit_blocks, self.null_block) if hit_blocks is not None else 0
        )
        cap = self.model.max_model_len
        tokens = min(call.computed + call.scheduled + self.floor_lookahead, cap)
        whole = min(request.num_tokens, cap)
        full = call.first_chunk and self._full_sequence_must_fit(call)
        need = full_need = evictable
        for info, have in zip(self._groups, held, strict=True):
            if GROUP_TYPES[info.type].own_pool:
                continue  # HiSparse's host source: not the device pool's blocks
            span = info.block_size * int(info.floor_args.get("dcp_world_size", 1))
            extra = int(info.floor_args.get("num_speculative_blocks", 0))
            rule, hit_columns = info.floor_rule, hit // info.block_size
            columns = pool_columns(rule, tokens, encoder_len, span, extra)
            new = max(0, columns - max(have, hit_columns))
            whole_new = 0
            if full:
                whole_columns = pool_columns(rule, whole, encoder_len, span, extra)
                whole_new = max(0, whole_columns - max(have, hit_columns))
            if rule.family == MAMBA_ALIGNED_STATE.family:  # its other columns are null
                most = aligned_state_call_blocks(
                    extra,
                    int(info.floor_args.get("num_prefill_checkpoint_blocks", 0)),
                    partial_hit=call.first_chunk and hit > 0,
                )
                new, whole_new = min(new, most), min(whole_new, most)
            need += new
            full_need += whole_new
        running = bool(self._running_names - {call.request})
        watermark = self.vllm.watermark_blocks(self.manager) if call.first_chunk and running else 0
        available = free - call.options.reserved_blocks - watermark
        kept = (
            f" ({free} free"
            + (f", {call.options.reserved_blocks} reserved" if call.options.reserved_blocks else "")
            + (f", {watermark} kept by the watermark" if watermark else "")
            + ")"
        )
        # Whose the refusal is: the scenario's when, by its own arithmetic, the blocks the
        # requests holding blocks may rightly hold and this call may rightly ask (the
        # whole sequence under full-sequence admission), a shared prefix counted once,
        # exceed the pool less the null block. What vLLM's tables hold beyond that, or
        # free blocks it refused to give, are vLLM's to answer for (StepDenied: the
        # capacity check), never bad input.
        least = self._rightful_blocks(
            call, max(encoder_len, self._encoder_lens.get(call.request, 0)), whole=full
        )
        others, shared = self._held_beside(call.request, least)
        mine = sum(least)
        usable = self.model.num_blocks - 1 - call.options.reserved_blocks - watermark
        vllm_short = need > available or (full and full_need > available)
        if vllm_short and mine + others - shared > usable:
            held_by = ", ".join(
                f"{name}: {sum(self._rightful_blocks(last))}"
                for name, last in self._last_calls.items()
                if name != call.request
            )
            what = (
                f"{mine} blocks for the whole sequence of {request.num_tokens} tokens "
                "(full-sequence admission, scheduler_reserve_full_isl)"
                if full
                else f"{mine} blocks after it"
            )
            beside = (
                f" beside the {others} the requests holding blocks may hold ({held_by}"
                + (f"; {shared} shared by a prefix" if shared else "")
                + ")"
                if others
                else ""
            )
            reserved = (
                f", {call.options.reserved_blocks} reserved" if call.options.reserved_blocks else ""
            ) + (f", {watermark} kept by the watermark" if watermark else "")
            return PoolExhausted(
                where,
                f"by the floor's own arithmetic {call.label} of request {call.request!r} needs "
                f"{what}{beside}, but the pool of {self.model.num_blocks} blocks has {usable} "
                f"to give (the null block kept back{reserved}); raise model.num_blocks, "
                "preempt or finish a request, or mark the call refused",
            )
        detail = f"{available} of {self.model.num_blocks} blocks to give{kept}"
        if vllm_short:
            # The scenario's arithmetic fits: what vLLM's tables hold is vLLM's to answer for.
            floors = others + mine - shared
            in_use = self.model.num_blocks - 1 - free
            detail += (
                f"; by the scenario's own arithmetic the requests holding blocks and this "
                f"call take at most {floors} of the {usable} usable (vLLM's tables hold "
                f"{in_use} before the call)"
            )
        return StepDenied(
            call,
            "allocate_slots",
            full_need if full and full_need > need else need,
            available,
            free,
            detail + (f"; the whole sequence needs {full_need}" if full else ""),
        )

    def _rightful_blocks(
        self, call: Call, encoder_len: int | None = None, *, whole: bool = False
    ) -> tuple[int, ...]:
        """Per group, the most device-pool blocks ``call``'s request may rightly hold after it
        by the scenario's arithmetic (``whole``: its whole sequence, full-sequence admission)."""
        request = self._requests[call.request]
        if encoder_len is None:
            encoder_len = self._encoder_lens.get(call.request, 0)
        computed, scheduled = call.computed, call.scheduled
        if whole:
            computed, scheduled = 0, max(int(request.num_tokens), call.computed + scheduled)
        lookahead = 0 if call.options.load_async else self.floor_lookahead
        return tuple(
            info.pool_blocks(computed, scheduled, lookahead, encoder_len) for info in self._groups
        )

    def _held_beside(self, name: str, least: tuple[int, ...]) -> tuple[int, int]:
        """The blocks the other requests holding blocks may rightly hold, and the most of
        them a shared prefix (prefix caching) lets two of them, or one of them and
        ``name`` holding ``least``, share."""
        held = {
            other: self._rightful_blocks(last)
            for other, last in self._last_calls.items()
            if other != name
        }
        total = sum(sum(blocks) for blocks in held.values())
        held[name] = least
        shared = 0
        if self.model.enable_caching:
            for other, least in held.items():
                source, tokens = self._shares.get(other, ("", 0))
                if source in held:
                    shared += sum(
                        min(info.shared_blocks(tokens), mine, theirs)
                        for info, mine, theirs in zip(
                            self._groups, least, held[source], strict=True
                        )
                    )
        return total, shared
