"""The largest record Relay hands its producer, and what stands in for a record too large.

The producer refuses a record over its request limit (1 MiB by default) when it is sent, long
after the record that made it was processed: a sink record, a repartition record or a
changelog record that big would stop the worker at every restart. So each is checked where it
is made (:func:`check_record_size`), and the record that made it is a bad record. A bad record
too large to go to the dead-letter topic as it is goes there truncated
(:func:`truncated_payload`), with its original sizes in headers.
"""

from __future__ import annotations

#: Key and value bytes a record may hold: below the producer's 1 MiB request limit, with room
#: for the headers and a batch's framing.
MAX_RECORD_BYTES = 1_000_000
#: What a truncated dead letter keeps of its key and of its value.
TRUNCATED_BYTES = 64 * 1024


class RecordTooLargeError(ValueError):
    """A record is over :data:`MAX_RECORD_BYTES`: a bad record, not an error of the machine."""


def record_bytes(key: bytes | None, value: bytes | None) -> int:
    return len(key or b"") + len(value or b"")


def check_record_size(topic: str, key: bytes | None, value: bytes | None) -> None:
    size = record_bytes(key, value)
    if size > MAX_RECORD_BYTES:
        raise RecordTooLargeError(
            f"a record for {topic} would hold {size} bytes, over the {MAX_RECORD_BYTES} "
            f"a record may hold")


def truncated_payload(
    key: bytes | None, value: bytes | None,
) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]:
    """``key`` and ``value`` as a dead letter carries them, and the headers saying what was cut:
    unchanged when they fit; else each cut to :data:`TRUNCATED_BYTES`, with ``relay.truncated``
    and the original sizes in ``relay.key.size`` and ``relay.value.size``."""
    if record_bytes(key, value) <= MAX_RECORD_BYTES:
        return key, value, []
    headers = [("relay.truncated", b"true"),
               ("relay.key.size", str(-1 if key is None else len(key)).encode()),
               ("relay.value.size", str(-1 if value is None else len(value)).encode())]
    return (None if key is None else key[:TRUNCATED_BYTES],
            None if value is None else value[:TRUNCATED_BYTES], headers)
