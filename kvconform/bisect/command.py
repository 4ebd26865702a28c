"""``kvconform bisect``: pick the mode from the arguments and print as it goes."""

from __future__ import annotations

import argparse

from kvconform.errors import UsageError


def say(text: str = "") -> None:
    print(text, flush=True)


def bisect(args: argparse.Namespace) -> int:
    if args.releases:
        if args.good or args.bad:
            raise UsageError("--good/--bad go with --repo; --releases takes A..B")
        from kvconform.bisect.releases_mode import bisect_releases

        return bisect_releases(args, say)
    if args.pre:
        raise UsageError("--pre goes with --releases")
    from kvconform.bisect.git_mode import bisect_commits

    return bisect_commits(args, say)
