"""Synthetic Kafka record batches (message format v2) for decoding tests: data batches,
transactional batches and commit or abort markers, as a broker would return them."""

from __future__ import annotations

import struct

from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.util import calc_crc32c

#: Control record keys and the value every marker carries.
ABORT_KEY = struct.pack(">hh", 0, 0)
COMMIT_KEY = struct.pack(">hh", 0, 1)
MARKER_VALUE = struct.pack(">hi", 0, 0)


def record_batch(base_offset: int, records: list[tuple[bytes, bytes | None]], *,
                 producer_id: int = -1, transactional: bool = False,
                 control: bool = False, epoch: int = 0) -> bytes:
    builder = DefaultRecordBatchBuilder(2, 0, int(transactional), producer_id, epoch, 0, 2**20)
    for delta, (key, value) in enumerate(records):
        builder.append(delta, 1_000, key, value, [])
    raw = bytearray(builder.build())
    raw[0:8] = struct.pack(">q", base_offset)
    if control:
        # The builder cannot flag a control batch: set the attribute bit, fix the CRC.
        attributes = struct.unpack_from(">h", raw, 21)[0] | 0x20
        struct.pack_into(">h", raw, 21, attributes)
        struct.pack_into(">I", raw, 17, calc_crc32c(memoryview(raw)[21:]))
    return bytes(raw)


def marker(base_offset: int, producer_id: int, *, abort: bool, epoch: int = 0) -> bytes:
    """A transaction's commit or abort marker."""
    return record_batch(base_offset, [(ABORT_KEY if abort else COMMIT_KEY, MARKER_VALUE)],
                        producer_id=producer_id, transactional=True, control=True,
                        epoch=epoch)
