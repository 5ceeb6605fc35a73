"""``python -m streams run APP``: the same command as ``relay run APP``
(:mod:`streams.run_command`), for where the ``relay`` script is not on the PATH."""

from __future__ import annotations

import click

from streams.run_command import run

main = click.Group(
    "python -m streams", commands=[run],
    help="Run a Relay app: `python -m streams run APP` is `relay run APP`. The other "
         "commands (broker, describe, web, ...) are in `relay`.",
)

if __name__ == "__main__":
    main()
