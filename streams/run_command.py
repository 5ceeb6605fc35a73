"""``relay run APP``: load a Relay app by ``module:attribute`` and run it in the foreground.

The one command that runs apps: ``relay`` (:mod:`tools.cli`) adds it beside its other
commands, and ``python -m streams run`` (:mod:`streams.__main__`) is the same command under
another name. Every failure it knows is one line and an exit code from
:class:`streams.exit_codes.ExitCode`; an error it does not know (a bug) keeps its traceback.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import TYPE_CHECKING

import click

from streams.config import ConfigError, UnknownSettingError
from streams.dsl.topology import TopologyError
from streams.exit_codes import ExitCode, summary
from streams.kafka import client_log

if TYPE_CHECKING:
    from streams.app import App

#: What ``relay run`` says when the app has no broker address.
NO_BOOTSTRAP = ("no bootstrap_servers: set RELAY_BOOTSTRAP_SERVERS=host:port (or pass "
                "bootstrap_servers to the App); for development, `relay broker` runs a broker "
                "on 127.0.0.1:9092")


class RunError(click.ClickException):
    """One line on stderr (``Error: ...``) and the exit code of its kind."""

    def __init__(self, message: str, code: ExitCode) -> None:
        super().__init__(message)
        self.exit_code = int(code)


def parse_target(target: str) -> tuple[str, str]:
    """``module:attribute`` -> its two parts; anything else is a usage error."""
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute or ":" in attribute:
        example = f"{module_name}:app" if module_name.isidentifier() and not sep else "myapp:app"
        raise click.BadParameter(
            f"expected module:attribute (e.g. {example}), got {target!r}", param_hint="APP")
    return module_name, attribute


def load_app(target: str) -> App:
    """The :class:`streams.app.App` named by ``target``, imported from the current directory
    first. A typo, a missing module or a name that is not an App is a usage error; an App
    that cannot be built (a bad setting, a topology that cannot run) a configuration error."""
    from streams.app import App

    module_name, attribute = parse_target(target)
    if "." not in sys.path:
        sys.path.insert(0, ".")  # the app's module, from where the command runs
    # The finder of "." caches what it listed there, for whatever directory was current then.
    importlib.invalidate_caches()
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        where = "" if exc.name == module_name else f" (it imports {exc.name!r}, not installed)"
        raise click.BadParameter(f"cannot import {module_name!r}{where}: {exc}",
                                 param_hint="APP") from None
    except ImportError as exc:
        raise click.BadParameter(f"cannot import {module_name!r}: {exc}",
                                 param_hint="APP") from None
    except SyntaxError as exc:
        line = f": {exc.text.strip()}" if exc.text else ""
        raise click.BadParameter(
            f"cannot import {module_name!r}: {exc.msg} ({exc.filename}, line {exc.lineno}){line}",
            param_hint="APP") from None
    except UnknownSettingError as exc:
        raise RunError(f"configuration error: {exc.describe(caller_of_app(exc))}",
                       ExitCode.CONFIG) from None
    except ConfigError as exc:
        raise RunError(f"configuration error: {exc}", ExitCode.CONFIG) from None
    except TopologyError as exc:
        raise RunError(f"topology error: {exc}", ExitCode.CONFIG) from None
    if not hasattr(module, attribute):
        apps = sorted(name for name, value in vars(module).items() if isinstance(value, App))
        hint = f"; its Apps: {', '.join(apps)}" if apps else "; it defines no App"
        raise click.BadParameter(f"module {module_name!r} has no attribute {attribute!r}{hint}",
                                 param_hint="APP")
    app = getattr(module, attribute)
    if not isinstance(app, App):
        raise click.BadParameter(f"{target} is a {type(app).__name__}, not a relay App",
                                 param_hint="APP")
    return app


def caller_of_app(exc: UnknownSettingError) -> str:
    """`` (file, line N)`` of the ``App(...)`` call a misspelt setting was given to: the
    frame before ``App.__init__`` in the error's traceback."""
    frames = []
    frame = exc.__traceback__
    while frame is not None:
        frames.append(frame)
        frame = frame.tb_next
    if len(frames) < 2:
        return ""
    caller = frames[-2]
    return f" ({caller.tb_frame.f_code.co_filename}, line {caller.tb_lineno})"


@click.command(short_help="Run an app (module:attribute) until SIGINT or SIGTERM.",
               epilog=f"Exit codes: {summary()}.")
@click.argument("target", metavar="APP")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]),
              help="Level of the app's log (on stderr).")
def run(target: str, log_level: str) -> None:
    """Run APP (module:attribute, e.g. myapp:app) until SIGINT or SIGTERM.

    Settings come from the App's arguments and RELAY_* environment variables
    (RELAY_BOOTSTRAP_SERVERS, RELAY_NUM_THREADS, RELAY_GROUP_INSTANCE_ID, ...). The broker
    address is required: `relay broker` runs one for development.
    """
    from statestore.errors import TopicMismatchError
    from streams.environment import UnreachableBrokerError
    from streams.kafka.membership import FencedMemberError
    from streams.runtime.thread import FatalThreadError

    logging.basicConfig(level=log_level,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    client_log.install()
    app = load_app(target)
    if app.config.bootstrap_servers is None:
        raise RunError(NO_BOOTSTRAP, ExitCode.CONFIG)
    try:
        app.run()
    except UnreachableBrokerError as exc:
        raise RunError(f"broker unreachable: {exc}", ExitCode.UNREACHABLE) from None
    except ConfigError as exc:
        raise RunError(f"configuration error: {exc}", ExitCode.CONFIG) from None
    except (TopologyError, TopicMismatchError) as exc:
        # A topic the app needs with another shape than it has: a restart cannot help.
        raise RunError(f"topology error: {exc}", ExitCode.CONFIG) from None
    except FencedMemberError as exc:
        raise RunError(f"stopped: {exc}", ExitCode.FAILED) from None

    except FatalThreadError as exc:
        raise RunError(f"failed: {exc}", ExitCode.FAILED) from None
    except KeyboardInterrupt:
        pass  # a second Ctrl-C during shutdown
