"""``kvconform export``: a scenario's finding as a pytest file for vLLM's own tests."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvconform.errors import ExitStatus, UsageError
from kvconform.fronts.options import run_request, say
from kvconform.harness.checks import DEFAULT_CHECKS
from kvconform.harness.expectations import DEFAULT_SCENARIOS
from kvconform.harness.loader import load_paths
from kvconform.harness.session import RunRequest, Session
from kvconform.harness.subcommand import CommandLine, Subcommand


class ExportCommand(Subcommand):
    name = "export"
    help = "write a scenario's finding as a self-contained pytest file for vLLM's tests"
    description = (
        "Run one scenario and write what it found (a lookahead short of the "
        "drafter's, a disagreement of the warmup with the allocator, a floor shortfall, a "
        "crash) as a pytest module for the release's own test tree (tests/v1/core or "
        "tests/v1/worker, using their helpers), failing while the finding holds."
    )

    def add_options(self, parser: argparse.ArgumentParser, cli: CommandLine) -> None:
        parser.add_argument(
            "scenario", help="FILE::ID, a one-scenario file, or an id under scenarios/"
        )
        parser.add_argument(
            "--vllm-test", action="store_true", help="a pytest module for vLLM's own test suite"
        )
        parser.add_argument("--out", metavar="FILE", help="where to write it (default: test_<id>.py)")
        cli.add_vllm_options(parser)

    def run(self, args: argparse.Namespace, cli: CommandLine) -> int:
        return cmd_export(args)


COMMAND = ExportCommand()


def cmd_export(args: argparse.Namespace) -> int:
    from kvconform.harness.select import split_node
    from kvconform.reports.vllm_test import render_vllm_test, test_name

    if not args.vllm_test:
        raise UsageError("export: say what to export (--vllm-test)")
    target = args.scenario
    file, scenario_id = split_node(target)
    paths = [file] if Path(file).exists() else [DEFAULT_SCENARIOS]
    loaded = load_paths(paths)
    for err in loaded.errors:
        say(f"ERROR {err}")
    wanted = scenario_id or (None if Path(file).exists() else target)
    chosen = [s for s in loaded.scenarios if wanted in (None, s.id)]
    if len(chosen) != 1:
        raise UsageError(
            f"export: {target!r} names {len(chosen)} scenarios; name one "
            f"(FILE::ID, or an id under {DEFAULT_SCENARIOS}/)"
        )
    (scenario,) = chosen
    # No expectations: the export reproduces what vLLM does, listed or not.
    request = run_request(argparse.Namespace(**vars(args), paths=()), DEFAULT_CHECKS)
    session = Session(RunRequest(**{**vars(request), "no_expectations": True}))
    result = session.run_scenario(scenario)
    test = render_vllm_test(scenario, result, session.vllm)
    out = Path(args.out or f"{test_name(scenario)}.py")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(test.source, encoding="utf-8")
    say(
        f"{scenario.id}: {result.verdict.value} against vLLM {session.vllm.version}; wrote {out} "
        f"({test.shape}: it belongs in {test.folder}/ of that release's test tree)"
    )
    return ExitStatus.CONFORM
