"""Checks of the environment a worker is about to run in, made before it starts anything: a
``state_dir`` it can write, topic names Kafka accepts, a broker it can reach at
``bootstrap_servers``. Each failure is one :class:`ConfigError` naming the setting, so that
``python -m streams run`` prints one line instead of a traceback from deep in the runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import tempfile
from collections.abc import Iterable
from pathlib import Path

from streams.config import ConfigError, parse_bootstrap_servers, topic_name_problem

#: How long reaching one bootstrap address may take before it counts as unreachable.
CONNECT_TIMEOUT_S = 10.0


class UnreachableBrokerError(ConfigError):
    """No address of ``bootstrap_servers`` resolves and accepts a connection."""


class UnservableAddressError(ConfigError, OSError):
    """An address the app is set to serve on (``metrics_port``, ``query_port``) is taken, or
    its host is not this machine's: as set, a restart fails again. Still an ``OSError``, as
    the failed bind it reports."""


def check_state_dir(path: Path) -> None:
    """``path`` is (or can be made) a directory this process can create files in."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".relay-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except FileExistsError:
        raise ConfigError(f"state_dir {str(path)!r} is not a directory (a file of that name, "
                          f"or above it, exists)") from None
    except NotADirectoryError:
        raise ConfigError(f"state_dir {str(path)!r}: a part of the path is a file, not a "
                          f"directory") from None
    except OSError as exc:
        raise ConfigError(f"state_dir {str(path)!r} cannot be written: "
                          f"{exc.strerror or exc}") from None


def check_topic_names(application_id: str, names: Iterable[str]) -> None:
    """The internal topics (named after the application id, stores and steps) are legal."""
    for name in sorted(names):
        problem = topic_name_problem(name)
        if problem:
            raise ConfigError(
                f"application_id {application_id!r} makes the internal topic {name[:40]!r}... "
                f"illegal ({problem}): shorten the application_id or the store names")


async def check_reachable(bootstrap_servers: str,
                          timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """At least one address of ``bootstrap_servers`` resolves and accepts a TCP connection;
    else :class:`UnreachableBrokerError` with each address's reason."""
    addresses = parse_bootstrap_servers(bootstrap_servers)
    reasons = await asyncio.gather(*(_reason(host, port, timeout_s) for host, port in addresses))
    if all(reasons):
        detail = "; ".join(f"{h}:{p}: {r}" for (h, p), r in zip(addresses, reasons, strict=True))
        raise UnreachableBrokerError(
            f"bootstrap_servers {bootstrap_servers!r}: no broker reachable ({detail})")


async def _reason(host: str, port: int, timeout_s: float) -> str | None:
    """Why ``host:port`` cannot be reached, or None when it accepts a connection."""
    try:
        _reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except socket.gaierror as exc:
        return f"cannot resolve {host} ({exc.strerror})"
    except TimeoutError:
        return f"no answer within {timeout_s:g} s"
    except OSError as exc:
        return exc.strerror or str(exc)
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return None
