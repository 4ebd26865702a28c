"""``kvconform mutate``: how many of vLLM's possible reservation bugs does the suite catch?

A mutation campaign, an application of the engine beside fuzz and bisect. It
takes vLLM's real reservation code (the target functions in
``scenarios/mutation-targets.yaml``), makes every small wrong version that
cosmic-ray's operators can make of it (:mod:`.mutants`), runs the corpus
against each, and counts the mutants that turn a scenario's outcome red
(:mod:`.outcome`). vLLM is imported once; each mutant runs in a forked child
that swaps one function's code (:mod:`.campaign`), or, where a swap cannot
express it, in a fresh process against a mutated copy of the tree
(:mod:`.fresh`). Reports: :mod:`.report`. This package imports no vLLM itself:
what touches vLLM's objects is :mod:`kvconform.oracles.vllm.mutation`.
"""
