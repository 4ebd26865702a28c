"""The ground floor: plain data, and the reservation contract, with no vLLM and no torch.

A scenario (:mod:`.scenario`, its token arithmetic in :mod:`.tokens`, its acceptance
streams in :mod:`.acceptance`) is what the loader builds from YAML; a trajectory of
observations (:mod:`.observations`) is what a driver records; results (:mod:`.results`)
are what the checks and the session conclude. The contract those are judged against
is here too: the floor table (:mod:`.floors`), the group types kvconform knows
(:mod:`.group_types`) and kvconform's own lookahead table (:mod:`.lookahead`).
Everything above imports these; they import nothing of kvconform's but
:mod:`kvconform.errors`.
"""
