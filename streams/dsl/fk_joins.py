"""Foreign-key table-table joins (KIP-213): each row of the left table joins the right
table's row whose key its ``foreign_key(value)`` names, the tables partitioned apart.

Kafka Streams' design, in three steps across two repartition topics:

1. the left side (with the left table's partitions) keeps each row in ``<join>-rows``; an
   update sends a subscription, keyed by the foreign key, to the subscription topic: a
   delete of the row's old foreign key when it changed, and the row's key with a hash of
   its value;
2. the right side (with the right table's partitions) keeps the subscriptions in
   ``<join>-subscriptions`` keyed ``(foreign_key, left_key)``; a subscription answers with
   the right row, and an update of a right row answers every subscription to it; answers go
   to the response topic keyed by the left key;
3. the left side joins an answer with its row if the answer's hash is that of the row's
   current value (else the answer is stale: a later one is on its way) and forwards
   ``joiner(left, right)``, or a tombstone (inner join, no right row), or ``joiner(left,
   None)`` (left join).

Deletes of either side flow through: a deleted left row unsubscribes and answers with a
tombstone; a deleted right row answers its subscribers with None.

Timestamps are Kafka Streams': an answer to a subscription carries the larger of the left
update's timestamp and the right row's (kept with the row in the right table's store), an
answer to a right update carries that update's, and the result carries its answer's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack

from streams.dsl.processors import Node, ProcessorContext, stamped


def value_hash(value: Any) -> bytes | None:
    if value is None:
        return None
    return hashlib.blake2b(msgpack.packb(value, use_bin_type=True), digest_size=8).digest()


@dataclass
class ForeignKeyJoin:
    foreign_key: Callable[[Any], Any]
    joiner: Callable[[Any, Any], Any]
    left: bool  # a left join (else inner)
    rows_store: str
    subscriptions_store: str
    right_store: str


class ForeignKeyStep(Node):
    """A step of one foreign-key join: each knows the join it belongs to."""

    def __init__(self, name: str, join: ForeignKeyJoin) -> None:
        super().__init__(name)
        self.join = join


class SubscribeNode(ForeignKeyStep):
    """Step 1: a left row's update becomes subscriptions keyed by foreign key, as
    ``[left_key, hash or None, answer_without_right]`` (hash None: unsubscribe). A new row of
    an inner join, or an update that keeps its foreign key, asks for an answer only if the
    right row exists: without one there is no result to replace (Kafka Streams'
    PROPAGATE_ONLY_IF_FK_VAL_AVAILABLE)."""

    def store_names(self) -> list[str]:
        return [self.join.rows_store]

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        if key is None:
            return
        rows = ctx.store(self.join.rows_store)
        old = rows.get(key)
        rows.put(key, value)
        old_fk = None if old is None else self.join.foreign_key(old)
        new_fk = None if value is None else self.join.foreign_key(value)
        if old_fk is not None and old_fk != new_fk:
            if new_fk is None and not self.join.left:
                # The inner join's result goes: answered by the old right row's side, so that
                # the tombstone is stamped with that row's time too (Kafka Streams'
                # DELETE_KEY_AND_PROPAGATE).
                self.forward(ctx, old_fk, [key, None, True, value_hash(value)])
                return
            self.forward(ctx, old_fk, [key, None])
        if new_fk is not None:
            # An inner join's row whose foreign key stayed had no result if the right row
            # is missing: nothing to delete (Kafka Streams' PROPAGATE_ONLY_IF_FK_VAL_AVAILABLE
            # for inserts and such updates; a changed key may leave a result to delete).
            self.forward(ctx, new_fk, [key, value_hash(value),
                                       self.join.left or (old_fk is not None
                                                          and old_fk != new_fk)])
        elif old is not None or value is not None:
            # No foreign key now (a delete, or a row naming none): the result goes, or is
            # the row joined with nothing, at once.
            self.forward(ctx, _RESPOND_DIRECTLY, [key, value_hash(value)])


#: A subscription that needs no right row: answered by the left side itself.
_RESPOND_DIRECTLY = "\x00relay.fk.none"


class SubscriptionNode(ForeignKeyStep):
    """Step 2, on a subscription: record it, answer with the right row. The answer is stamped
    with the larger of the subscription's timestamp (the left row's) and the right row's, or
    the subscription's without a right row (Kafka Streams' SubscriptionJoinProcessor).

    An unsubscription ``[left_key, None]`` is not answered; ``[left_key, None, True, hash]``
    (an inner join's row that names no right row any more) is, with no right value."""

    def store_names(self) -> list[str]:
        return [self.join.subscriptions_store, self.join.right_store]

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        left_key, digest = value[0], value[1]
        # Written before the third element: always answered.
        answer_without_right = value[2] if len(value) > 2 else True
        left_key = tuple(left_key) if isinstance(left_key, list) else left_key
        if key == _RESPOND_DIRECTLY:
            self.forward(ctx, left_key, [digest, None])
            return
        subscriptions = ctx.store(self.join.subscriptions_store)
        if digest is None:
            subscriptions.delete((key, left_key))
            if len(value) > 3:
                self.forward_at(ctx, left_key, [value[3], None],
                                self._stamp(ctx, key))
            return
        subscriptions.put((key, left_key), digest)
        right_row = ctx.store(self.join.right_store).get_timestamped(key)
        if right_row is not None or answer_without_right:
            self.forward_at(ctx, left_key, [digest, None if right_row is None else right_row[1]],
                            stamped(right_row, ctx.timestamp_ms))

    def _stamp(self, ctx: ProcessorContext, foreign_key: Any) -> int:
        return stamped(ctx.store(self.join.right_store).get_timestamped(foreign_key),
                       ctx.timestamp_ms)


class RightUpdateNode(ForeignKeyStep):
    """Step 2, on an update of a right row: answer every subscription to it, with the hash
    the subscription carried, stamped with the update's timestamp (as Kafka Streams'
    ForeignTableJoinProcessor does: not the left rows')."""

    def store_names(self) -> list[str]:
        return [self.join.subscriptions_store]

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        if key is None:
            return
        subscriptions = ctx.store(self.join.subscriptions_store)
        for (_, left_key), digest in list(subscriptions.prefix((key,))):
            self.forward(ctx, left_key, [digest, value])


class ResponseNode(ForeignKeyStep):
    """Step 3: join an answer with the current left row, unless it is stale."""

    def store_names(self) -> list[str]:
        return [self.join.rows_store]

    def process(self, ctx: ProcessorContext, key: Any, value: Any) -> None:
        digest, right = value
        current = ctx.store(self.join.rows_store).get(key)
        if digest != value_hash(current):
            return  # stale: the row changed since, and the answer to that follows
        if current is None or (right is None and not self.join.left):
            self.forward(ctx, key, None)
        else:
            self.forward(ctx, key, self.join.joiner(current, right))
