"""The subcommands of ``kvconform`` that live in the fronts, one module each
(``kvconform.harness.subcommand``; the others live beside their work: ``bisect``,
``matrix``, ``fuzz``, ``realbugs``, ``mutate``)."""
