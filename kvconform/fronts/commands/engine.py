"""``kvconform engine``: engine mode, vLLM's real engine (docs/engine-mode.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kvconform.errors import UsageError
from kvconform.fronts.options import say
from kvconform.harness.loader import load_paths
from kvconform.harness.subcommand import CommandLine, Subcommand
from kvconform.model.kinds import Kind


class EngineCommand(Subcommand):
    name = "engine"
    help = "engine mode: vLLM's real engine (docs/engine-mode.md)"

    def add_options(self, parser: argparse.ArgumentParser, cli: CommandLine) -> None:
        engine_sub = parser.add_subparsers(dest="engine_command", required=True)
        record = engine_sub.add_parser(
            "record",
            help="write an engine run's steps as a kind: trajectory scenario (record -> replay)",
        )
        record.add_argument("scenario", help="an engine scenario file")
        record.add_argument("-k", dest="scenario_id", help="which scenario of a matrix file (its id)")
        record.add_argument("--out", required=True, type=Path, help="the trajectory scenario to write")
        record.add_argument("--from", dest="recording", type=Path,
                            help="a recording an earlier run kept (KVCONFORM_ENGINE_RECORDINGS) "
                            "instead of running the engine")  # fmt: skip
        record.add_argument("--warmup-out", type=Path,
                            help="also write the warmup's steps as a trajectory scenario")  # fmt: skip

    def run(self, args: argparse.Namespace, cli: CommandLine) -> int:
        # `engine_command` is required: argparse refuses `kvconform engine` alone.
        return ENGINE_COMMANDS[args.engine_command](args)


COMMAND = EngineCommand()


def cmd_engine_record(args: argparse.Namespace) -> int:
    from kvconform.harness.engine_record import record
    from kvconform.oracles.engine import EngineRecording

    loaded = load_paths([args.scenario])
    if loaded.errors:
        for err in loaded.errors:
            say(f"ERROR {err}")
        return 2
    chosen = [s for s in loaded.scenarios if args.scenario_id in (None, s.id)]
    if len(chosen) != 1 or chosen[0].kind is not Kind.ENGINE:
        ids = ", ".join(s.id for s in loaded.scenarios)
        raise UsageError(
            f"{args.scenario} must hold one engine scenario (-k ID picks one of: {ids})"
        )
    recording = None
    if args.recording is not None:
        recording = EngineRecording.from_json(args.recording.read_text())
    phases = ["serving"] + (["warmup"] if args.warmup_out else [])
    written = record(chosen[0], recording, phases)
    for phase, out in (("serving", args.out), ("warmup", args.warmup_out)):
        if phase in written:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(written[phase])
            say(f"wrote {out}: the {phase} steps of {chosen[0].id} as a trajectory scenario")
    return 0


# Each subcommand of `kvconform engine`, by its word.
ENGINE_COMMANDS = {"record": cmd_engine_record}
