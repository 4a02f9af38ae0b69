"""Every way a model call can end gives its reservation on the tree's budget back, once.

A model call reserves its estimate on the root when it is claimed (CLAIM) and
the save that applies its outcome settles it (SAVE). Here, on a real Redis with
the real engine and store (no workers: each step is advanced in this process),
a root with a token budget asks the model; the call is claimed (once, or again
after its first worker "died"); then it ends in each way it can: replied,
failed, the run cancelled under it, its turn interrupted by a person's follow-up,
its time budget spent, with or without a reply that comes late. After each,
the tree's reserved sums are back to zero, and the same combination run twice
never settles twice (they would go negative).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from agent_core import Config
from tests.apps.notes import build
from tests.support.redis_server import RedisServer
from workers.client.start import new_run
from workers.engine.budget import Admission, Budget
from workers.engine.effects import Message
from workers.engine.events import CancelRun, FollowUp, InboxEvent, ModelFailed, ModelReplied
from workers.engine.ids import OutboxMember
from workers.engine.records import RunRecord, Usage
from workers.runtime.steps import Steps
from workers.settings import Settings, now_ms
from workers.store.runs import RunStore
from workers.store.scripts import ClaimStatus, Recorded

ENDINGS = ["replied", "failed", "cancelled", "interrupted", "deadline"]
CONFIG = Config(require_plan=False)


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with RedisServer(tmp_path_factory.mktemp("reservations")) as server:
        yield server.url


class _Tree:
    """A root run on a token budget, advanced step by step in this process."""

    def __init__(self, url: str, prefix: str) -> None:
        relay = build(Settings.from_env({"RELAY_REDIS_URL": url, "RELAY_PREFIX": prefix}))
        self.store = RunStore(url, prefix)
        self.sent: list[Message] = []
        self.steps = Steps(self.store, relay.kit, relay.settings.timing, self.sent.extend, now_ms)
        record, snapshot, start = new_run(
            relay.kit, "Say hello.", "", CONFIG, attachments=None, budget=Budget(tokens=50_000),
            tools=None, notes=None, recipe=None, schedule=None, run_id=None, key=None,
            memory=None, remembered=lambda _name: [], app=relay.name,
        )  # fmt: skip
        self.run: RunRecord = record
        assert self.store.create(record, snapshot, due_ms=now_ms() + 60_000, start=start)
        self.steps.advance(record.id)  # the agent asks the model: m<seq> is sent

    @property
    def seq(self) -> int:
        found = self.store.read(self.run.id)
        assert found is not None
        asked = found[0].asked
        assert asked is not None, "the run asks the model for nothing"
        return asked

    def claim(self, seq: int, token: str) -> int:
        claim = self.store.claim(
            self.run.id, f"m{seq}", seq=seq, token=token, lease_ms=5_000, now_ms=now_ms(),
            admission=Admission(4_096, 0.0, 0.0),
        )  # fmt: skip
        assert claim.status is ClaimStatus.CLAIMED, claim.status
        assert claim.over is None
        return claim.attempts

    def record(self, seq: int, event: InboxEvent, attempt: int, token: str) -> Recorded:
        recorded, loaded = self.store.record(
            self.run.id, f"m{seq}", event, attempt=attempt,
            member=OutboxMember.model(self.run.id, seq), token=token,
            due_ms=now_ms() + 60_000, counted=False,
        )  # fmt: skip
        self.steps.advance(self.run.id, loaded)
        return recorded

    def tell(self, event: InboxEvent) -> None:
        assert self.store.append(self.run.id, event, now_ms() + 60_000, cancel_flag=True)
        self.steps.advance(self.run.id)

    def reserved(self) -> tuple[int, int, int]:
        limits = self.store.limits(self.run.id)
        assert limits is not None
        return limits.reserved


def _reply(seq: int) -> ModelReplied:
    usage = Usage(prompt_tokens=100, completion_tokens=10, total_tokens=110, model_calls=1)
    return ModelReplied(seq=seq, text='{"final": "hello"}', usage=usage)


@pytest.mark.parametrize(
    ("ending", "claimed_twice", "late_reply"),
    list(itertools.product(ENDINGS, [False, True], [False, True])),
)
def test_every_ending_of_a_model_call_settles_its_reservation_once(
    redis_url: str, ending: str, claimed_twice: bool, late_reply: bool
) -> None:
    tree = _Tree(redis_url, f"r{ENDINGS.index(ending)}{int(claimed_twice)}{int(late_reply)}:")
    seq = tree.seq
    attempt = tree.claim(seq, "first")
    if claimed_twice:  # the first worker died: its lease lapsed, another claimed the call
        tree.store.redis.delete(tree.store.keys.lease(tree.run.id, f"m{seq}"))
        attempt = tree.claim(seq, "second")
    reserved = tree.reserved()
    assert reserved[0] > 0  # the estimate, reserved once however often it was claimed
    assert reserved[2] == 1
    token = "second" if claimed_twice else "first"
    if ending == "replied":
        assert tree.record(seq, _reply(seq), attempt, token) is Recorded.ADVANCE
    elif ending == "failed":
        failed = ModelFailed(seq=seq, error="the server is down", final=True)
        assert tree.record(seq, failed, attempt, token) is Recorded.ADVANCE
    elif ending == "cancelled":
        tree.tell(CancelRun(reason="Cancelled by a person."))
    elif ending == "interrupted":
        tree.tell(FollowUp(text="Say goodbye instead.", strategy="interrupt"))
    else:
        tree.tell(CancelRun(reason="The run's time budget ran out.", stop="budget_exceeded"))
    if late_reply and ending not in ("replied", "failed"):
        # The call's worker finishes after all: its outcome is fenced off or dropped,
        # and its reservation was let go already: nothing is settled twice.
        tree.record(seq, _reply(seq), attempt, token)
    assert tree.reserved() == (0, 0, 0)
