"""Promotion asks: a ready learner's task moves in the round its member asks for, not in
the round after it.

A ready learner's task moves in a rebalance that the learner's member asks for. Revoked from
its owner in that round, it would reach the learner only in a follow-up round: the
cooperative protocol gives a task to a new member only once no member reports owning it.
On a broker whose rounds cost seconds, that follow-up round is most of what a move costs.

So before it rejoins, the learner's member says on the control topic which ready learners it
asks the round to promote, and for which generation (``PROMOTION_KEY`` records). A member
that runs one of those tasks, and whose assignment of that same generation says a learner
learns it, gives the task up as it joins the round: it commits, keeps the state as a copy,
and its subscription no longer lists the task. The leader places an unowned task on its
ready learner first, so the task moves in that very round. Nothing is ever run twice: the
owner stops before it joins, and the leader only ever sees subscriptions sent after that.

The owner reads the control topic to its end before it joins (only when it runs a task being
learned), so an ask sent before the learner's member rejoined is seen. An owner that still
misses it reports the task as owned, and the move takes its two rounds as before. A task
given up whose learner does not take it (its member gone meanwhile) goes back to its owner,
its previous one, which still holds the state. That holds for a leaving owner too: it gives
tasks up like any other, and one whose learner could not take it (that learner's member was
marked leaving meanwhile) comes back to it, until a learner on an instance that stays is
ready. A leaving member sends no ask: its own learners are never promoted.

A new instance that warmed its copies up before joining (:mod:`streams.group.warm_up`) sends a
*joining* ask: no assignment of its owners says a learner learns those tasks, since the
newcomer is not a member yet. An owner gives such a task up as it joins the round of that
generation all the same, once per ask: an owner that gives up a task the leader then does not
place on the newcomer gets it back, as its previous owner, and runs it from its copy.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import msgpack

#: Key of the ask records on the control topic.
PROMOTION_KEY = b"__promotion__"
#: How long an ask read from the control topic counts (see PromotionAsks).
ASK_TTL_S = 30.0


@dataclass(frozen=True)
class PromotionAsk:
    """A member's ask: promote these ready learners of it in the round after ``generation``
    (the generation of the assignment that placed them)."""

    member: str
    generation: int
    tasks: tuple[str, ...]
    #: Sent by a new instance about to join with these copies warmed up.
    joining: bool = False


def encode_ask(ask: PromotionAsk) -> bytes:
    fields: list[object] = [ask.member, ask.generation, list(ask.tasks)]
    if ask.joining:
        fields.append(True)
    return msgpack.packb(fields)


def decode_ask(raw: bytes) -> PromotionAsk:
    """The ask in ``raw``; raises ValueError for a malformed record."""
    try:
        fields = msgpack.unpackb(raw, raw=False)
        if not isinstance(fields, list) or len(fields) not in (3, 4):
            raise TypeError(f"not a list of 3 or 4 fields: {fields!r}")
        member, generation, tasks = fields[:3]
        joining = fields[3] if len(fields) == 4 else False
        if (not isinstance(member, str) or not isinstance(generation, int)
                or isinstance(generation, bool) or not isinstance(tasks, list)
                or not all(isinstance(t, str) for t in tasks)
                or not isinstance(joining, bool)):
            raise TypeError(f"{member!r}, {generation!r}, {tasks!r}, {joining!r}")
        return PromotionAsk(member, generation, tuple(tasks), joining)
    except Exception as exc:
        raise ValueError(f"malformed promotion ask ({len(raw)} bytes): {exc}") from exc


@dataclass
class PromotionAsks:
    """The asks a process has read from the control topic, by generation and task.

    An ask counts for ``ASK_TTL_S`` after it was read, and until an owner acts on it. The
    round it is about follows within seconds; kept longer, an ask would outlive it. The
    embedded broker keeps a static group's generation across rounds, so an old ask would
    match every later round. A newcomer that died between its ask and its join would
    otherwise take a task from its owner in some unrelated round."""

    #: Waits (up to the seconds given) until the process has read the control topic up to
    #: its end as of the call; False if it could not tell in time.
    read_to_end: Callable[[float], Awaitable[bool]] | None = None
    clock: Callable[[], float] = time.monotonic
    #: (generation, task, joining) -> when the ask was read.
    _asks: dict[tuple[int, str, bool], float] = field(default_factory=dict)

    def record(self, ask: PromotionAsk) -> None:
        if ask.generation < 0 or not ask.tasks:
            return
        now = self.clock()
        self._asks = {key: at for key, at in self._asks.items() if now - at <= ASK_TTL_S}
        for task in ask.tasks:
            self._asks[(ask.generation, task, ask.joining)] = now

    def _live(self, generation: int, joining: bool) -> frozenset[str]:
        now = self.clock()
        return frozenset(task for (g, task, j), at in self._asks.items()
                         if g == generation and j is joining and now - at <= ASK_TTL_S)

    def asked(self, generation: int) -> frozenset[str]:
        """Ready learners their members ask the round after ``generation`` to promote."""
        return self._live(generation, False)

    def joining_asked(self, generation: int) -> frozenset[str]:
        """Tasks a newcomer asks for, with its copies warmed up, in the round after
        ``generation``."""
        return self._live(generation, True)

    def acted_on(self, generation: int, tasks: Iterable[str]) -> None:
        """An owner gave these tasks up: their asks are spent (a round that gives a task
        back to its owner must not see it given up again)."""
        for task in tasks:
            for joining in (False, True):
                self._asks.pop((generation, task, joining), None)


def to_release(running: Iterable[str], being_learned: Iterable[str],
               asked: Iterable[str], joining_asked: Iterable[str] = ()) -> list[str]:
    """The running tasks a member gives up as it joins: learned elsewhere (per its current
    assignment) and asked for promotion in its current generation, or asked for by a
    newcomer that warmed them up."""
    wanted = (set(being_learned) & set(asked)) | set(joining_asked)
    return sorted(t for t in running if t in wanted)
