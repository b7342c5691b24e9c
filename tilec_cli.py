"""The `tilec` command line. Each subcommand is a pair (add its arguments, run it) in COMMANDS; it calls only the
public API in `tilec`. A TilecError is printed with its caret display and exits 1, never as a traceback."""
from __future__ import annotations

import argparse
import sys
from typing import Callable

from tilec.errors import KernelError, TilecError

Command = tuple[str, str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]
COMMANDS: list[Command] = []


def command(name: str, help: str, add_args: Callable[[argparse.ArgumentParser], None]):
    """Register `run(args) -> exit code` as subcommand `name`."""

    def register(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        COMMANDS.append((name, help, add_args, run))
        return run

    return register


def parse_defines(items: list[str] | None) -> dict[str, int]:
    """-D N=1 -D C=256 -> {"N": 1, "C": 256}."""
    out: dict[str, int] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier() or not value.lstrip("-").isdigit():
            raise TilecError(f"bad -D option {item!r}", hint="write -D NAME=INTEGER, e.g. -D C=256")
        out[key] = int(value)
    return out


# ---- subcommands: each owner adds its own block below ------------------------------------------------------------


# ---- entry point ---------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tilec", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help, add_args, run in COMMANDS:
        p = sub.add_parser(name, help=help, description=help)
        add_args(p)
        p.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except TilecError as err:
        print(err.render(), file=sys.stderr)
        return 1
    except KernelError as err:
        print(f"kernel error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
