"""The names Relay composes, each parsed here and nowhere else.

    <root>                  a root run's id (letters and digits, or 32 random hex digits)
    <parent>.<call>         a specialist's run: its parent's id, a dot, the delegate call's
                            id; so every run of a tree starts with its root's id
    m<seq>                  a model call of a run, named by the step it answers
    a|<run>                 outbox members (the messages to send, and send again if lost):
    m|<run>|<seq>           wake the run, make its model call `m<seq>`, run its tool call
    t|<run>|<call>
    <run>|<kind>|<what>     a pending entry: kind plan, call, question or budget; what the
                            call's id, or the step (seq) the plan, question or budget is at

The store spells its keys from these (`workers.store.layout`); the engine, the
tasks and the client only ever compose and read them through this module.
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "OutboxMember",
    "PendingKind",
    "child_id",
    "in_tree",
    "model_call",
    "parent_of",
    "pending_member",
    "pending_parts",
    "root_of",
    "tree_parts",
]

PendingKind = Literal["plan", "call", "question", "budget"]


def root_of(run_id: str) -> str:
    """The id of the root of the tree `run_id` belongs to (itself, for a root)."""
    return run_id.split(".", 1)[0]


def tree_parts(run_id: str) -> tuple[str, str]:
    """(root id, the rest with its leading dot): `("r1", ".call-2")` for `r1.call-2`."""
    root, dot, rest = run_id.partition(".")
    return root, dot + rest


def child_id(parent: str, call_id: str) -> str:
    """The id of the specialist's run that answers the delegate call `call_id` of `parent`."""
    return f"{parent}.{call_id}"


def parent_of(run_id: str) -> tuple[str, str] | None:
    """(the parent's id, its delegate call's id) of a specialist's run; None for a root."""
    parent, dot, call = run_id.rpartition(".")
    return (parent, call) if dot else None


def in_tree(run_id: str, of: str) -> bool:
    """Whether `run_id` is the run `of` or one of its specialists (at any depth)."""
    return run_id == of or run_id.startswith(f"{of}.")


def model_call(seq: int) -> str:
    """The name a model call goes by in leases, fields and traces: `m<seq>`."""
    return f"m{seq}"


class OutboxMember:
    """The outbox's members: one per message that must be sent (and sent again if lost).

    CLAIM and SAVE spell a call's member themselves (lua/claim.lua, lua/save.lua), as
    `model` and `tool` below do: a change here is a change there."""

    @staticmethod
    def advance(run_id: str) -> str:
        """`a|<run>`: wake the run; removed by a save that leaves its inbox empty."""
        return f"a|{run_id}"

    @staticmethod
    def model(run_id: str, seq: int) -> str:
        """`m|<run>|<seq>`: make the model call; removed when its outcome is saved."""
        return f"m|{run_id}|{seq}"

    @staticmethod
    def tool(run_id: str, call_id: str) -> str:
        """`t|<run>|<call>`: run the tool call; removed when its outcome is saved."""
        return f"t|{run_id}|{call_id}"

    @staticmethod
    def run_of(member: str) -> str:
        """The run a member is about."""
        return member.split("|", 2)[1]

    @staticmethod
    def parts(member: str) -> tuple[str, ...]:
        """The member's parts: `("a", run)`, `("m", run, seq)` or `("t", run, call)`."""
        return tuple(member.split("|"))


def pending_member(run_id: str, kind: PendingKind, what: str) -> str:
    """`<run>|call|<call>`, `<run>|plan|<seq>`, `<run>|question|<seq>`, `<run>|budget|<seq>`."""
    return f"{run_id}|{kind}|{what}"


def pending_parts(member: str) -> tuple[str, str, str]:
    """(run id, kind, what) of a pending member."""
    run_id, kind, what = member.rsplit("|", 2)
    return run_id, kind, what
