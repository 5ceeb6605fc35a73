"""The options of the ``relay-kafka`` data source, parsed and checked once on the driver.

Reading: ``bootstrap.servers`` (or ``bootstrapServers``), ``topic``, ``startingOffsets`` and
``endingOffsets`` (JSON ``{"partition": offset}``; partitions not named start at the log start
and end at the high watermark), ``maxRecordsPerSplit``, ``keySerde`` / ``valueSerde``.
Writing uses the same bootstrap, topic and serde options.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from pipeline.errors import OptionError
from statestore.serdes import serde_from_name

DEFAULT_MAX_RECORDS_PER_SPLIT = 500_000


@dataclass(frozen=True)
class TopicOptions:
    bootstrap: str
    topic: str
    key_serde: str | None = None
    value_serde: str | None = None
    starting_offsets: dict[int, int] | None = None
    ending_offsets: dict[int, int] | None = None
    max_records_per_split: int = DEFAULT_MAX_RECORDS_PER_SPLIT


def _lookup(options: Mapping[str, str], *names: str) -> str | None:
    # Spark hands data sources a case-insensitive dict; plain dicts are matched loosely too.
    lowered = {str(k).lower(): v for k, v in options.items()}
    for name in names:
        value = lowered.get(name.lower())
        if value is not None and str(value) != "":
            return str(value)
    return None


def parse_offsets(text: str | None, name: str) -> dict[int, int] | None:
    """``'{"0": 5, "1": 0}'`` -> ``{0: 5, 1: 0}``; None when not given."""
    if text is None:
        return None
    try:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise TypeError("not a JSON object")
        offsets = {int(p): int(o) for p, o in raw.items()}
    except (ValueError, TypeError) as exc:
        raise OptionError(
            f"option {name} must be a JSON object of partition -> offset such as "
            f'{{"0": 5, "1": 0}}, not {text!r} ({exc})'
        ) from None
    bad = {p: o for p, o in offsets.items() if p < 0 or o < 0}
    if bad:
        raise OptionError(f"option {name}: partitions and offsets must be >= 0, got {bad}")
    return offsets


def parse_options(options: Mapping[str, str]) -> TopicOptions:
    bootstrap = _lookup(options, "bootstrap.servers", "bootstrapServers", "kafka.bootstrap.servers")
    topic = _lookup(options, "topic")
    if bootstrap is None:
        raise OptionError("option bootstrap.servers (host:port of a broker) is required")
    if topic is None:
        raise OptionError("option topic is required")
    key_serde = _lookup(options, "keySerde")
    value_serde = _lookup(options, "valueSerde")
    for name, serde in (("keySerde", key_serde), ("valueSerde", value_serde)):
        if serde is not None:
            try:
                serde_from_name(serde)
            except ValueError as exc:
                raise OptionError(f"option {name}: {exc}") from None
    split_text = _lookup(options, "maxRecordsPerSplit")
    try:
        split = DEFAULT_MAX_RECORDS_PER_SPLIT if split_text is None else int(split_text)
        if split < 1:
            raise ValueError
    except ValueError:
        raise OptionError(
            f"option maxRecordsPerSplit must be an integer >= 1, not {split_text!r}"
        ) from None
    return TopicOptions(
        bootstrap=bootstrap, topic=topic, key_serde=key_serde, value_serde=value_serde,
        starting_offsets=parse_offsets(_lookup(options, "startingOffsets"), "startingOffsets"),
        ending_offsets=parse_offsets(_lookup(options, "endingOffsets"), "endingOffsets"),
        max_records_per_split=split,
    )
