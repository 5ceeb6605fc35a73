"""Serializers for keys and values: msgpack (the default for values), JSON, str, bytes, an
order-preserving key encoding so that range and prefix scans follow the keys' natural order,
and the timestamped value format of the stores that keep, beside each value, the timestamp of
the record that last set it (Kafka Streams' timestamped stores, KIP-258).
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import msgpack


class SerdeError(ValueError):
    """A value could not be serialized or deserialized."""


@runtime_checkable
class Serde(Protocol):
    """Turns Python values into bytes and back. ``name`` identifies it in configs."""

    name: str

    def dumps(self, value: Any) -> bytes: ...

    def loads(self, data: bytes) -> Any: ...


class _Packers(threading.local):
    """One reusable msgpack packer per OS thread (a packer holds a buffer, so it is not
    shared between threads); ``msgpack.packb`` builds a new one per call."""

    def __init__(self) -> None:
        self.packer = msgpack.Packer(use_bin_type=True)


_packers = _Packers()


class MsgPackSerde:
    name = "msgpack"

    def dumps(self, value: Any) -> bytes:
        try:
            # A packer resets its buffer when packing fails, so it stays usable.
            return _packers.packer.pack(value)
        except (TypeError, ValueError, OverflowError) as exc:
            raise SerdeError(f"msgpack cannot encode {type(value).__name__}: {exc}") from exc

    def loads(self, data: bytes) -> Any:
        try:
            return msgpack.unpackb(data, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several unrelated types
            raise SerdeError(f"not valid msgpack ({len(data)} bytes): {exc}") from exc


#: The timestamp of a value written without one (before its store kept timestamps): what
#: Kafka Streams gives the values it converts from a plain store to a timestamped one (-1).
UNKNOWN_TIMESTAMP = -1
#: The first byte of a timestamped value: msgpack never writes it, so a plain msgpack value
#: (written before the store kept timestamps) reads unchanged.
TIMESTAMPED_TAG = 0xC1
_TIMESTAMPED_PREFIX = bytes([TIMESTAMPED_TAG])
# The tag, a msgpack array of two, and the timestamp as a msgpack int64, packed at once.
_TIMESTAMPED_HEADER = struct.Struct(">BBBq")


class TimestampedSerde:
    """A msgpack value with the timestamp of the record that last set it: ``0xC1``, then the
    msgpack array ``[timestamp, value]``, the timestamp an int64 (cheap both ways: the
    aggregation stores' per-record path). A value without the tag, plain msgpack written
    before, reads with :data:`UNKNOWN_TIMESTAMP`.

    ``loads`` and ``dumps`` see plain values (every reader that wants the value alone:
    interactive queries, scans, restore checks; ``loads`` also checks the format);
    ``loads_timestamped`` and ``dumps_timestamped`` carry the timestamp."""

    name = "timestamped"

    def __init__(self) -> None:
        # The last timestamp's encoded header: records close in time share it (a busy
        # stream has many per millisecond). One tuple, swapped whole: safe across threads.
        self._header: tuple[int, bytes] = (
            UNKNOWN_TIMESTAMP,
            _TIMESTAMPED_HEADER.pack(TIMESTAMPED_TAG, 0x92, 0xD3, UNKNOWN_TIMESTAMP))

    def dumps(self, value: Any) -> bytes:
        """``value`` without a timestamp (it reads back with :data:`UNKNOWN_TIMESTAMP`)."""
        return _MSGPACK.dumps(value)

    def dumps_timestamped(self, value: Any, timestamp: int) -> bytes:
        try:
            header = self._header
            if header[0] != timestamp:
                header = self._header = (timestamp, _TIMESTAMPED_HEADER.pack(
                    TIMESTAMPED_TAG, 0x92, 0xD3, timestamp))
            return header[1] + _packers.packer.pack(value)
        except struct.error as exc:
            raise SerdeError(f"timestamp {timestamp!r} is no 64-bit integer") from exc
        except (TypeError, ValueError, OverflowError) as exc:
            raise SerdeError(f"msgpack cannot encode {type(value).__name__}: {exc}") from exc

    def loads(self, data: bytes) -> Any:
        if data[:1] != _TIMESTAMPED_PREFIX:
            return _MSGPACK.loads(data)
        pair = self.loads_timestamped(data)
        if type(pair) is not list or len(pair) != 2 or type(pair[0]) is not int:
            raise SerdeError(f"not a valid timestamped value ({len(data)} bytes): the tag is "
                             f"followed by {type(pair).__name__}, not [timestamp, value]")
        return pair[1]

    def loads_timestamped(self, data: bytes) -> list[Any]:
        """``[timestamp, value]``; a plain value's timestamp is :data:`UNKNOWN_TIMESTAMP`.
        Trusts the format (the store wrote it; ``loads`` checks what restoration reads)."""
        if data[:1] != _TIMESTAMPED_PREFIX:
            return [UNKNOWN_TIMESTAMP, _MSGPACK.loads(data)]
        try:
            return msgpack.unpackb(data[1:], raw=False, strict_map_key=False)  # type: ignore[no-any-return]
        except Exception as exc:  # msgpack raises several unrelated types
            raise SerdeError(f"not a valid timestamped value ({len(data)} bytes): {exc}"
                             ) from exc


_MSGPACK = MsgPackSerde()


class JsonSerde:
    name = "json"

    def dumps(self, value: Any) -> bytes:
        try:
            return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()
        except (TypeError, ValueError) as exc:
            raise SerdeError(f"JSON cannot encode {type(value).__name__}: {exc}") from exc

    def loads(self, data: bytes) -> Any:
        try:
            return json.loads(data)
        except (UnicodeDecodeError, ValueError) as exc:
            raise SerdeError(f"not valid JSON ({len(data)} bytes): {exc}") from exc


class StrSerde:
    name = "str"

    def dumps(self, value: Any) -> bytes:
        if not isinstance(value, str):
            raise SerdeError(f"the str serde takes str, not {type(value).__name__}")
        return value.encode()

    def loads(self, data: bytes) -> Any:
        try:
            return data.decode()
        except UnicodeDecodeError as exc:
            raise SerdeError(f"not valid UTF-8 ({len(data)} bytes): {exc}") from exc


class BytesSerde:
    name = "bytes"

    def dumps(self, value: Any) -> bytes:
        if not isinstance(value, bytes | bytearray | memoryview):
            raise SerdeError(f"the bytes serde takes bytes, not {type(value).__name__}")
        return bytes(value)

    def loads(self, data: bytes) -> Any:
        return data


# Tags of the ordered key encoding. Values of different types sort by tag; the end-of-tuple
# marker is the smallest byte so that a tuple sorts before any longer tuple it prefixes.
_END, _NONE, _FALSE_TRUE, _INT = 0x00, 0x05, 0x08, 0x10
_FLOAT, _STR, _BYTES, _TUPLE = 0x18, 0x20, 0x30, 0x40
_INT_BIAS = 1 << 63
_TERMINATOR = b"\x00\x01"
_STR_TAG = bytes([_STR])


def _escape(raw: bytes) -> bytes:
    return raw.replace(b"\x00", b"\x00\xff")


class OrderedKeySerde:
    """Encodes str, bytes, int (64-bit), float, bool, None and tuples of them so that the
    encoded bytes sort like the values (within one type). Store keys use it by default, which
    makes ``range`` and ``prefix`` scans follow the keys' order and windowed keys
    ``(key, window_start)`` group by key and sort by time.
    """

    name = "ordered"

    def dumps(self, value: Any) -> bytes:
        if type(value) is str:
            # The common key, in one expression (what ``_encode`` writes for a str).
            return _STR_TAG + value.encode().replace(b"\x00", b"\x00\xff") + _TERMINATOR
        out = bytearray()
        self._encode(value, out)
        return bytes(out)

    def prefix(self, value: str | bytes | tuple[Any, ...]) -> bytes:
        """The bytes every encoded key that starts with ``value`` starts with.

        For a str or bytes that is its tag and escaped content without terminator; for a tuple
        the encoding of its elements without the end-of-tuple marker.
        """
        if isinstance(value, str):
            return bytes([_STR]) + _escape(value.encode())
        if isinstance(value, bytes):
            return bytes([_BYTES]) + _escape(value)
        if isinstance(value, tuple):
            return self.dumps(value)[:-1]
        raise SerdeError(f"a key prefix is a str, bytes or tuple, not {type(value).__name__}")

    def _encode(self, value: Any, out: bytearray) -> None:
        if value is None:
            out.append(_NONE)
        elif isinstance(value, bool):
            out += bytes([_FALSE_TRUE, int(value)])
        elif isinstance(value, int):
            if not -_INT_BIAS <= value < _INT_BIAS:
                raise SerdeError(f"integer key {value} does not fit in 64 bits")
            out.append(_INT)
            out += struct.pack(">Q", value + _INT_BIAS)
        elif isinstance(value, float):
            bits = struct.unpack(">Q", struct.pack(">d", value))[0]
            bits = bits ^ 0xFFFFFFFFFFFFFFFF if bits >> 63 else bits | (1 << 63)
            out.append(_FLOAT)
            out += struct.pack(">Q", bits)
        elif isinstance(value, str):
            out.append(_STR)
            out += _escape(value.encode())
            out += _TERMINATOR
        elif isinstance(value, bytes | bytearray):
            out.append(_BYTES)
            out += _escape(bytes(value))
            out += _TERMINATOR
        elif isinstance(value, tuple | list):
            out.append(_TUPLE)
            for item in value:
                self._encode(item, out)
            out.append(_END)
        else:
            raise SerdeError(
                f"store keys must be str, bytes, int, float, bool, None or tuples of them, "
                f"not {type(value).__name__}"
            )

    def loads(self, data: bytes) -> Any:
        try:
            value, end = self._decode(data, 0)
        except SerdeError:
            raise
        except (IndexError, ValueError, struct.error) as exc:
            raise SerdeError(f"truncated ordered key ({len(data)} bytes)") from exc
        if end != len(data):
            raise SerdeError(f"trailing bytes after ordered key ({len(data) - end} bytes)")
        return value

    def _decode(self, data: bytes, pos: int) -> tuple[Any, int]:
        tag = data[pos]
        pos += 1
        if tag == _NONE:
            return None, pos
        if tag == _FALSE_TRUE:
            return bool(data[pos]), pos + 1
        if tag == _INT:
            return struct.unpack_from(">Q", data, pos)[0] - _INT_BIAS, pos + 8
        if tag == _FLOAT:
            bits = struct.unpack_from(">Q", data, pos)[0]
            bits = bits & 0x7FFFFFFFFFFFFFFF if bits >> 63 else bits ^ 0xFFFFFFFFFFFFFFFF
            return struct.unpack(">d", struct.pack(">Q", bits))[0], pos + 8
        if tag in (_STR, _BYTES):
            raw, pos = self._decode_escaped(data, pos)
            if tag == _BYTES:
                return raw, pos
            try:
                return raw.decode(), pos
            except UnicodeDecodeError as exc:
                raise SerdeError(f"ordered key holds invalid UTF-8: {exc}") from exc
        if tag == _TUPLE:
            items = []
            while data[pos] != _END:
                item, pos = self._decode(data, pos)
                items.append(item)
            return tuple(items), pos + 1
        raise SerdeError(f"unknown ordered key tag 0x{tag:02x} at byte {pos - 1}")

    @staticmethod
    def _decode_escaped(data: bytes, pos: int) -> tuple[bytes, int]:
        out = bytearray()
        while True:
            zero = data.index(b"\x00", pos)
            out += data[pos:zero]
            marker = data[zero + 1]
            if marker == 0x01:
                return bytes(out), zero + 2
            if marker != 0xFF:
                raise SerdeError(f"bad escape 0x00 0x{marker:02x} in ordered key")
            out.append(0)
            pos = zero + 2


_BY_NAME: dict[str, Callable[[], Serde]] = {
    "msgpack": MsgPackSerde,
    "json": JsonSerde,
    "str": StrSerde,
    "bytes": BytesSerde,
    "ordered": OrderedKeySerde,
    "timestamped": TimestampedSerde,
}


def register_serde(name: str, factory: Callable[[], Serde]) -> None:
    """Make ``serde_from_name(name)`` build ``factory()`` (the stream layer adds ``windowed``)."""
    _BY_NAME[name] = factory


def serde_names() -> list[str]:
    return sorted(_BY_NAME)


def serde_from_name(serde: str | Serde) -> Serde:
    """A serde given by name (``msgpack``, ``json``, ``str``, ``bytes``, ``ordered``,
    ``timestamped`` (msgpack with a timestamp), and
    ``windowed`` once :mod:`streams.dsl.windows` is imported) or as an object with
    ``dumps``/``loads``."""
    if isinstance(serde, str):
        try:
            return _BY_NAME[serde]()
        except KeyError:
            raise ValueError(
                f"unknown serde {serde!r}; choose one of {serde_names()} or pass an object "
                f"with dumps() and loads()"
            ) from None
    if not (callable(getattr(serde, "dumps", None)) and callable(getattr(serde, "loads", None))):
        raise ValueError(f"{serde!r} is not a serde: it needs dumps() and loads()")
    return serde
