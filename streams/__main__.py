"""``python -m streams run module:app``: run a Relay app in the foreground."""

from __future__ import annotations

import importlib
import logging
import sys

import click

from streams.config import ConfigError
from streams.dsl.topology import TopologyError
from streams.environment import UnreachableBrokerError
from streams.kafka.membership import FencedMemberError

#: Exit codes, as ``relay``'s: 1 failed (a configuration error, a member fenced), 3 broker
#: unreachable.
EXIT_CONFIG, EXIT_UNREACHABLE = 1, 3


class RunError(click.ClickException):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.exit_code = code


def load_app(target: str):
    from streams.app import App

    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise click.BadParameter(f"expected module:attribute, got {target!r}", param_hint="APP")
    sys.path.insert(0, ".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise click.BadParameter(f"cannot import {module_name}: {exc}", param_hint="APP") from exc
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        raise click.BadParameter(
            f"{target} is {type(app).__name__}, not a relay App", param_hint="APP"
        )
    return app


@click.group()
def main() -> None:
    """Relay stream workers."""


@main.command()
@click.argument("target", metavar="APP")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]))
def run(target: str, log_level: str) -> None:
    """Run APP (module:attribute, e.g. myapp:app) until SIGINT/SIGTERM.

    Settings come from the App's arguments and RELAY_* environment variables
    (RELAY_BOOTSTRAP_SERVERS, RELAY_NUM_THREADS, RELAY_GROUP_INSTANCE_ID, ...).
    """
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        app = load_app(target)
    except ConfigError as exc:
        raise RunError(f"configuration error: {exc}", EXIT_CONFIG) from None
    except TopologyError as exc:
        raise RunError(f"topology error: {exc}", EXIT_CONFIG) from None
    try:
        app.run()
    except UnreachableBrokerError as exc:
        raise RunError(f"broker unreachable: {exc}", EXIT_UNREACHABLE) from None
    except ConfigError as exc:
        raise RunError(f"configuration error: {exc}", EXIT_CONFIG) from None
    except TopologyError as exc:
        raise RunError(f"topology error: {exc}", EXIT_CONFIG) from None
    except FencedMemberError as exc:
        raise RunError(f"stopped: {exc}", EXIT_CONFIG) from None
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
