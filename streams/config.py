"""The app's configuration: every setting, its default, its validation, and how it is read
from the environment (``RELAY_<SETTING>``, e.g. ``RELAY_NUM_THREADS=2``).

A wrong type or value is a :class:`ConfigError` when the app is built, naming the setting;
the assignor's configuration is derived from these settings and checked at the same time. A
``RELAY_`` variable that names no setting gets a warning naming the closest one. Names that
become topic names (the application id, the dead-letter topic) follow Kafka's rules for topic
names, and ``bootstrap_servers`` must be a list of ``host:port``.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import socket
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

from assignor import AssignorConfig
from assignor.model import AssignorConfigError
from streams.group.learner_readiness import POLICIES as LEARNER_REJOIN_POLICIES
from streams.quirks.switch import QuirksSettingError
from streams.quirks.switch import parse_setting as parse_quirks

log = logging.getLogger(__name__)

ENV_PREFIX = "RELAY_"
#: ``RELAY_`` variables that are not app settings (the embedded broker's binary, Apache
#: Kafka's jar cache and JVM options, the demo's pace, the web view's screenshots): no
#: warning for these, nor for the test suite's own (``RELAY_TEST_*``).
OTHER_RELAY_VARIABLES = frozenset({"RELAY_TANSU_BIN", "RELAY_KAFKA_CACHE",
                                   "RELAY_KAFKA_JAVA_OPTS", "RELAY_DEMO_PHASE_SECONDS",
                                   "RELAY_WEB_SCREENSHOTS"})
TEST_VARIABLES_PREFIX = "RELAY_TEST_"
PROCESSING_GUARANTEES = ("at_least_once", "exactly_once")
_ID_PATTERN = re.compile(r"^[A-Za-z0-9._-]+$")
#: Kafka refuses longer topic names.
MAX_TOPIC_NAME = 249
#: The suffixes of the internal topics named after the application id alone (stores and
#: repartition steps add their own names: checked when the app runs).
APP_TOPIC_SUFFIXES = ("-dead-letters", "-status", "-control")
#: The default of ``learner_batch_wait_ms``: long enough for copies of similar stores placed
#: together to catch up together, short next to a store's restore from scratch.
LEARNER_BATCH_WAIT_MS = 30_000
#: The default of ``repartition_purge_interval_ms``: Kafka Streams' default.
REPARTITION_PURGE_INTERVAL_MS = 30_000


class ConfigError(ValueError):
    """A setting has a wrong type or value."""


class UnknownSettingError(ConfigError, TypeError):
    """Keywords of ``App()`` that name no setting (misspelt ones): a ``TypeError`` too, as
    Python's own for an unexpected keyword argument is."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = sorted(names)
        super().__init__(self.describe())

    def describe(self, where: str = "") -> str:
        """The message; ``where`` (`` (file, line N)``) follows the names when known."""
        known = {f.name for f in fields(AppConfig)}
        hints = [f"did you mean {closest}?" for name in self.names
                 if (closest := closest_setting(name, known))]
        settings = "setting" if len(self.names) == 1 else "settings"
        return (f"App() has no {settings} {', '.join(map(repr, self.names))}{where}; "
                + (" ".join(hints) or "see docs/configuration.md"))


@dataclass(frozen=True)
class AppConfig:
    """Settings of a Relay app. docs/configuration.md says what each one does."""

    application_id: str
    #: ``host:port[,host:port]``. Required to run (``relay run`` refuses None); None is for
    #: building and testing an App (``App.run()`` still starts an embedded broker then, with
    #: a DeprecationWarning, for one release).
    bootstrap_servers: str | None = None
    state_dir: Path = field(default_factory=lambda: Path(".relay-state"))
    #: Snapshots (``relay snapshot build``) that stores without a checkpoint bootstrap from.
    snapshot_dir: Path | None = None
    num_threads: int = 1
    #: Static membership: each thread joins as ``<group_instance_id>-thread-<n>``.
    group_instance_id: str | None = None
    commit_interval_ms: int = 1_000
    #: How often, at most, a thread deletes the records of its repartition topics' partitions
    #: below their committed offsets, after a commit (Kafka Streams'
    #: ``repartition.purge.interval.ms``); 0: after every commit.
    repartition_purge_interval_ms: int = REPARTITION_PURGE_INTERVAL_MS
    #: Changelog records a thread's stores may hold, coalesced to the latest write per key,
    #: before they are sent ahead of the next commit (bytes as written, before coalescing);
    #: 0 sends them after every batch.
    changelog_buffer_bytes: int = 10 * 1024 * 1024
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 3_000
    max_poll_interval_ms: int = 300_000
    num_standbys: int = 0
    acceptable_lag: int = 10_000
    max_learners: int = 2
    #: When a member asks for the round that promotes its ready learners:
    #: ``batched``, ``eager`` or ``conservative`` (:mod:`streams.group.learner_readiness`).
    learner_rejoin: str = "batched"
    #: ``batched``: how long a ready learner waits for the group's other learners before its
    #: member asks for a round anyway.
    learner_batch_wait_ms: int = LEARNER_BATCH_WAIT_MS
    #: ``cooperative``: only what moves stops; ``eager``: every rebalance stops every task
    #: and closes its stores (the stop-the-world baseline the benchmarks compare with).
    rebalance_protocol: str = "cooperative"
    lost_task_delay_ms: int = 0
    initial_delay_ms: int = 0
    scale_down_timeout_ms: int = 600_000
    #: ``cooperative``: how long a new instance restores the tasks it expects to take before
    #: it joins, so that they move to it in its first round (:mod:`streams.group.warm_up`); 0 joins
    #: at once, and its learners restore after it joined.
    warm_up_timeout_ms: int = 300_000
    imbalance_tolerance: int | None = None
    #: What a record that cannot be deserialized or processed does: ``dead_letter`` or ``stop``.
    on_error: str = "dead_letter"
    dead_letter_topic: str | None = None
    #: Partitions of internal topics whose count nothing else determines.
    default_partitions: int = 4
    #: The static-follower digest protocol (:mod:`streams.quirks.static_followers`), for brokers
    #: that answer a static follower's rejoin with its cached assignment (Tansu). None:
    #: detected (on for the embedded broker and brokers that identify as Tansu).
    #: Deprecated: use ``broker_quirks`` (the quirk ``cached-static-rejoin``).
    static_follower_digests: bool | None = None
    #: The broker workarounds that are on (:mod:`streams.quirks.switch`): ``auto``
    #: (detected), ``all``, ``none`` or a comma-separated list of quirk names.
    broker_quirks: str = "auto"
    #: Serve Prometheus metrics at ``/metrics`` on this port (0: any free port); None: off.
    metrics_port: int | None = None
    #: The address the metrics server listens on.
    metrics_host: str = "0.0.0.0"
    #: ``at_least_once``: outputs may repeat after a crash; ``exactly_once``: each task's
    #: outputs, changelog records and input offsets commit in one Kafka transaction
    #: (:mod:`streams.runtime.transactions`).
    processing_guarantee: str = "at_least_once"
    #: Serve interactive queries (``GET /stores/<store>/<key>``) on this port (0: any free
    #: port); None: off. The endpoint is published on the status topic for other members.
    query_port: int | None = None
    #: The address the query server listens on.
    query_host: str = "0.0.0.0"
    #: The host other members reach this one's query server at (published on the status
    #: topic); None: ``query_host``, or this machine's host name when that is a wildcard.
    query_advertised_host: str | None = None

    def __post_init__(self) -> None:
        hints = get_type_hints(AppConfig)
        for f in fields(self):
            value = getattr(self, f.name)
            object.__setattr__(self, f.name, _coerce(f.name, value, hints[f.name]))
        if not _ID_PATTERN.match(self.application_id) or self.application_id in (".", ".."):
            raise ConfigError(
                f"application_id {self.application_id!r} may only hold ASCII letters, digits, "
                f"'.', '_' and '-' (it names topics and a directory)"
            )
        longest = self.application_id + max(APP_TOPIC_SUFFIXES, key=len)
        if len(longest) > MAX_TOPIC_NAME:
            raise ConfigError(
                f"application_id is {len(self.application_id)} characters: too long for its "
                f"internal topics ({longest[:20]}... would be {len(longest)}, Kafka allows "
                f"{MAX_TOPIC_NAME})"
            )
        if self.dead_letter_topic is not None:
            problem = topic_name_problem(self.dead_letter_topic)
            if problem:
                raise ConfigError(f"dead_letter_topic {self.dead_letter_topic!r}: {problem}")
        if self.bootstrap_servers is not None:
            parse_bootstrap_servers(self.bootstrap_servers)
        if self.group_instance_id is not None and not _ID_PATTERN.match(self.group_instance_id):
            raise ConfigError(
                f"group_instance_id {self.group_instance_id!r} may only hold letters, digits, "
                f"'.', '_' and '-'"
            )
        for name in ("num_threads", "commit_interval_ms", "session_timeout_ms",
                     "heartbeat_interval_ms", "max_poll_interval_ms", "max_learners",
                     "default_partitions"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, not {getattr(self, name)}")
        for name in ("num_standbys", "acceptable_lag", "lost_task_delay_ms",
                     "initial_delay_ms", "scale_down_timeout_ms", "learner_batch_wait_ms",
                     "warm_up_timeout_ms", "repartition_purge_interval_ms",
                     "changelog_buffer_bytes"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, not {getattr(self, name)}")
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ConfigError(
                f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be below "
                f"session_timeout_ms ({self.session_timeout_ms})"
            )
        try:
            parse_quirks(self.broker_quirks)
        except QuirksSettingError as exc:
            raise ConfigError(str(exc)) from None
        if self.static_follower_digests is not None:
            warnings.warn(
                "static_follower_digests is deprecated and will be removed in the next "
                "release: use broker_quirks (e.g. broker_quirks='all', or a list of quirk "
                "names with or without 'cached-static-rejoin')",
                DeprecationWarning, stacklevel=3)
        if self.learner_rejoin not in LEARNER_REJOIN_POLICIES:
            raise ConfigError(
                f"learner_rejoin must be 'batched', 'eager' or 'conservative', not "
                f"{self.learner_rejoin!r}"
            )
        if self.rebalance_protocol not in ("cooperative", "eager"):
            raise ConfigError(
                f"rebalance_protocol must be 'cooperative' or 'eager', not "
                f"{self.rebalance_protocol!r}"
            )
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port must be a port number (0 to 65535, 0: any free "
                              f"port), not {self.metrics_port}")
        if not self.metrics_host:
            raise ConfigError("metrics_host must name an address to listen on")
        if self.processing_guarantee not in PROCESSING_GUARANTEES:
            raise ConfigError(
                f"processing_guarantee must be 'at_least_once' or 'exactly_once', not "
                f"{self.processing_guarantee!r}"
            )
        if self.query_port is not None and not 0 <= self.query_port <= 65535:
            raise ConfigError(f"query_port must be a port number (0 to 65535, 0: any free "
                              f"port), not {self.query_port}")
        if not self.query_host:
            raise ConfigError("query_host must name an address to listen on")
        if self.query_advertised_host is not None and not self.query_advertised_host.strip():
            raise ConfigError("query_advertised_host must name a host, or be left unset")
        if self.on_error not in ("dead_letter", "stop"):
            raise ConfigError(f"on_error must be 'dead_letter' or 'stop', not {self.on_error!r}")
        try:
            self.assignor_config()
        except AssignorConfigError as exc:
            raise ConfigError(str(exc)) from None

    def assignor_config(self) -> AssignorConfig:
        """The leader's assignor settings, derived from these (and validated by the assignor)."""
        return AssignorConfig.from_settings(self)

    @property
    def exactly_once(self) -> bool:
        return self.processing_guarantee == "exactly_once"

    @property
    def query_endpoint_host(self) -> str:
        """The host this member's query endpoint is published with."""
        if self.query_advertised_host:
            return self.query_advertised_host
        if self.query_host in ("0.0.0.0", "::", ""):
            return socket.gethostname()
        return self.query_host

    @property
    def cooperative(self) -> bool:
        return self.rebalance_protocol == "cooperative"

    @property
    def dead_letters(self) -> str:
        return self.dead_letter_topic or f"{self.application_id}-dead-letters"

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> AppConfig:
        """Settings from ``RELAY_*`` variables, with keyword ``overrides`` taking precedence."""
        environ = dict(os.environ if environ is None else environ)
        values: dict[str, Any] = {}
        known = {f.name for f in fields(cls)}
        for key, raw in environ.items():
            if not key.startswith(ENV_PREFIX):
                continue
            name = key[len(ENV_PREFIX):].lower()
            if name in known:
                values[name] = raw
            elif key not in OTHER_RELAY_VARIABLES and not key.startswith(TEST_VARIABLES_PREFIX):
                warn_unknown_variable(key, known)
        given = {k: v for k, v in overrides.items() if v is not None}
        for name in sorted(set(given) & set(values)):
            if str(values[name]) != str(given[name]):
                # An operator who sets the variable expects it to count: say it does not.
                log.warning("environment variable %s%s=%s is ignored: the app sets %s=%r "
                            "itself (an argument wins over its variable)", ENV_PREFIX,
                            name.upper(), values[name], name, given[name])
        values.update(given)
        unknown = set(values) - known
        if unknown:
            raise ConfigError(f"unknown settings: {', '.join(sorted(unknown))}")
        if "application_id" not in values:
            raise ConfigError(f"application_id is required (or set {ENV_PREFIX}APPLICATION_ID)")
        return cls(**values)


def topic_name_problem(name: str) -> str | None:
    """What makes ``name`` an illegal Kafka topic name, or None."""
    if not name or name in (".", ".."):
        return "a topic name cannot be empty, '.' or '..'"
    if not _ID_PATTERN.match(name):
        return "a topic name may only hold ASCII letters, digits, '.', '_' and '-'"
    if len(name) > MAX_TOPIC_NAME:
        return f"a topic name has at most {MAX_TOPIC_NAME} characters, not {len(name)}"
    return None


def parse_bootstrap_servers(value: str) -> list[tuple[str, int]]:
    """``host:port[,host:port]`` (an IPv6 host in brackets) as ``(host, port)`` pairs."""
    addresses = []
    for entry in value.split(","):
        entry = entry.strip()
        host, colon, port = entry.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if (not colon or not host or any(c.isspace() or c in "/[]" for c in host)
                or not port.isdigit() or not 1 <= int(port) <= 65535):
            raise ConfigError(
                f"bootstrap_servers {value!r} must be host:port[,host:port] with ports from "
                f"1 to 65535 ({entry!r} is not)"
            )
        addresses.append((host, int(port)))
    return addresses


#: What users of other stream libraries call a setting (faust's ``broker``, Quix's
#: ``broker_address``, Kafka's dotted names), where spelling alone would not lead to it.
OTHER_NAMES = {
    "broker": "bootstrap_servers", "brokers": "bootstrap_servers",
    "broker_address": "bootstrap_servers", "bootstrap": "bootstrap_servers",
    "bootstrap_server": "bootstrap_servers", "bootstrap.servers": "bootstrap_servers",
    "app_id": "application_id", "id": "application_id", "application.id": "application_id",
    "consumer_group": "application_id", "group_id": "application_id",
    "state_dir_path": "state_dir", "datadir": "state_dir", "state.dir": "state_dir",
    "num_stream_threads": "num_threads", "num.stream.threads": "num_threads",
    "processing.guarantee": "processing_guarantee", "exactly_once": "processing_guarantee",
    "num_standby_replicas": "num_standbys", "num.standby.replicas": "num_standbys",
    "commit_interval": "commit_interval_ms", "commit.interval.ms": "commit_interval_ms",
}


def closest_setting(name: str, known: set[str]) -> str | None:
    other = OTHER_NAMES.get(name.lower())
    if other is not None and other in known:
        return other
    matches = difflib.get_close_matches(name.lower(), sorted(known), n=1, cutoff=0.6)
    return matches[0] if matches else None


def warn_unknown_variable(key: str, known: set[str]) -> None:
    """A misspelt variable would otherwise be ignored without a word."""
    closest = closest_setting(key[len(ENV_PREFIX):], known)
    hint = f"; did you mean {ENV_PREFIX}{closest.upper()}?" if closest else ""
    log.warning("environment variable %s is not a Relay setting and is ignored%s", key, hint)


def _coerce(name: str, value: Any, hint: Any) -> Any:
    """Convert strings from the environment and check types, naming the setting on error."""
    args = getattr(hint, "__args__", ())
    optional = type(None) in args
    base = next((a for a in args if a is not type(None)), hint) if args else hint
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{name} is required")
    if isinstance(value, str) and optional and value.strip().lower() in ("", "none", "null"):
        return None
    try:
        if base is bool:
            if isinstance(value, str):
                lowered = value.strip().lower()
                if lowered in ("1", "true", "yes", "on"):
                    return True
                if lowered in ("0", "false", "no", "off"):
                    return False
                raise ValueError
            if not isinstance(value, bool):
                raise TypeError
            return value
        if base is int:
            if isinstance(value, bool):
                raise TypeError
            if isinstance(value, str):
                return int(value.replace("_", ""))
            if not isinstance(value, int):
                raise TypeError
            return value
        if base is Path:
            if not isinstance(value, str | os.PathLike):
                raise TypeError
            return Path(value)
        if base is str:
            if not isinstance(value, str):
                raise TypeError
            return value
    except (TypeError, ValueError):
        raise ConfigError(
            f"{name} must be {getattr(base, '__name__', base)}, not {value!r}"
        ) from None
    return value
