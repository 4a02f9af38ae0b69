"""Scripted models that behave like the rows of the agent core's model table, for the
built-in eval suite (workers/evals/builtin.toml), served by `ModelServer`:

- `strong`: solves every built-in case (like the 27B model);
- `seven_b`: wraps replies in prose, invents a tool name and recovers, invents one
  for good, loses track with a specialist and after a summary, notes a thing to
  remember over and over (that run makes no progress, though the next recalls it),
  and will not name its source (like qwen2.5:7b);
- `three_b`: cannot keep the format at all.

Each reply is a function of the prompt alone (what the history shows so far), so a
retried or repeated call gets the same reply and two runs of the suite give the
same figures.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from tests.support.brain import PLAN_ASK, SUMMARY_SYSTEM, batch, call, final
from tests.support.model_server import ChatCall, Reply

__all__ = ["seven_b", "strong", "strong_tools", "three_b"]

SENT_BACK = "needs its source"


def _task(chat: ChatCall) -> str:
    return chat.prompt.split("\n\n", 1)[0].removeprefix("Task:\n")


def _results(chat: ChatCall) -> int:
    return chat.prompt.count("\n→ ")


def _summary(chat: ChatCall) -> str:
    colours = [c for c in ("green", "red", "blue") if c in chat.prompt]
    return "Summary: read notes so far; colours found: " + (", ".join(colours) or "none")


# --- the strong model: what each case wants ------------------------------------------------


def _copy(chat: ChatCall) -> str:
    if "apples" not in chat.prompt:
        return call("read_note", name="a.txt")
    if "wrote" not in chat.prompt:
        return call("write_note", name="b.txt", text="Shopping: apples, pears and plums.")
    return final("Copied a.txt to b.txt.")


def _lookups(chat: ChatCall) -> str:
    if "3,878,100" not in chat.prompt:
        return batch(*(("lookup_city", {"city": c}) for c in ("Paris", "Berlin", "Madrid")))
    return final("Berlin is the largest: population 3,878,100. Source: lookup_city")


def _arithmetic(chat: ChatCall) -> str:
    if "395" not in chat.prompt:
        return call("calculate", expression="17 * 23 + 4")
    return final("17 * 23 + 4 = 395")


def _specialist(chat: ChatCall) -> str:
    if "748" not in chat.prompt:
        return call("delegate", specialist="researcher", task="Find the population of Rome.")
    if "wrote" not in chat.prompt:
        return call("write_note", name="rome.txt", text="Rome: 2,748,109 people")
    return final("Wrote Rome's figure to rome.txt.")


def _researcher(chat: ChatCall) -> str:
    if "2,748,109" not in chat.prompt:
        return call("lookup_city", city="Rome")
    return final("Rome: population 2,748,109. Source: lookup_city")


def _remember(chat: ChatCall) -> str:
    if "You noted:" not in chat.prompt:
        return call("remember", note="The office door code is 4711.")
    return final("Noted the door code.")


def _recall(chat: ChatCall) -> str:
    found = re.search(r"door code is (\d+)", chat.prompt)
    return final(f"The office door code is {found.group(1)}." if found else "I do not know.")


def _long(chat: ChatCall) -> str:
    for name, colour in (("long1.txt", "green"), ("long2.txt", "red"), ("long3.txt", "blue")):
        if colour not in chat.prompt:
            return call("read_note", name=name)
    return final("long1.txt: green; long2.txt: red; long3.txt: blue.")


def _question(chat: ChatCall) -> str:
    if "Ada" not in chat.prompt:
        return json.dumps({"ask_user": "What is your name?"})
    if "wrote" not in chat.prompt:
        return call("write_note", name="greeting.txt", text="Hello Ada, have a good day!")
    return final("Wrote greeting.txt for Ada.")


def _transfer(chat: ChatCall) -> str:
    if _results(chat) == 0:
        return call("transfer", source="checking", target="savings", amount=500)
    return final("The transfer was refused, so no money moved.")


def _lisbon(chat: ChatCall) -> str:
    if "545,796" not in chat.prompt:
        return call("lookup_city", city="Lisbon")
    if SENT_BACK in chat.prompt:
        return final("Lisbon has a population of 545,796. Source: lookup_city")
    return final("Lisbon has a population of 545,796.")


CASES: dict[str, Callable[[ChatCall], str]] = {
    "Copy the note a.txt": _copy,
    "Look up the populations of Paris": _lookups,
    "What is 17 * 23 + 4": _arithmetic,
    "Ask the researcher specialist": _specialist,
    "Find the population of Rome": _researcher,
    "Remember for later tasks": _remember,
    "What is the office door code": _recall,
    "Read the notes long1.txt": _long,
    "Write a short greeting note": _question,
    "Move 500 EUR": _transfer,
    "What is the population of Lisbon": _lisbon,
}


def _case(chat: ChatCall) -> Callable[[ChatCall], str]:
    task = _task(chat)
    for opening, play in CASES.items():
        if task.startswith(opening):
            return play
    raise AssertionError(f"no built-in case begins the task {task[:200]!r}")


def strong(chat: ChatCall) -> str:
    """Solves every built-in case."""
    if chat.system.startswith(SUMMARY_SYSTEM):
        return _summary(chat)
    if PLAN_ASK in chat.prompt:
        return json.dumps({"plan": ["Use the tools the task needs.", "Report."]})
    return _case(chat)(chat)


# --- the 7B-like model ---------------------------------------------------------------------


def _seven_b_fault(play: Callable[[ChatCall], str], chat: ChatCall) -> str | None:
    """The reply a 7B model gives instead of the right one, if it errs here."""
    said = chat.prompt
    faults: dict[Callable[[ChatCall], str], tuple[bool, str]] = {
        # invents a name once, then recovers
        _lookups: ("there is no tool named" not in said, call("lookup", city="Paris")),
        # invents a name for good
        _arithmetic: (True, call("calculator", expression="17 * 23 + 4")),
        # never hands over to the specialist
        _specialist: ("748" not in said, call("lookup_city", city="Rome")),
        # notes the code again and again (no progress; the next run still recalls it)
        _remember: ("You noted:" in said, call("remember", note="The office door code is 4711.")),
        # lost track after the summary: reads the first note again
        _long: ("Summary:" in said, call("read_note", name="long1.txt")),
        # never names its source
        _lisbon: ("545,796" in said, final("Lisbon has a population of 545,796.")),
    }
    errs, reply = faults.get(play, (False, ""))
    return reply if errs else None


def seven_b(chat: ChatCall) -> str:
    """The strong model's replies wrapped in prose, with a 7B model's failures."""
    if chat.system.startswith(SUMMARY_SYSTEM):
        return "Summary: I read some notes."  # (loses the colours)
    if PLAN_ASK in chat.prompt:
        return 'Sure! Here is my plan: {"plan": ["Do the task."]} Let me know.'
    play = _case(chat)
    return _seven_b_fault(play, chat) or "Here is my reply: " + play(chat)


# --- the 3B-like model ---------------------------------------------------------------------


def three_b(chat: ChatCall) -> str:
    """Cannot keep the format: prose, or an object with none of the forms."""
    if chat.system.startswith(SUMMARY_SYSTEM):
        return "Summary."
    if _results(chat) % 2:
        return '{"action": "done"}'
    return "I think the answer is probably in the notes, let me check them for you."


# --- a server with native function calling ---------------------------------------------------

_FORM_FUNCTIONS = {"plan": "submit_plan", "ask_user": "ask_user", "final": "final_answer"}


def _as_function_calls(reply: str) -> list[dict[str, Any]]:
    """The reply object the strong model wrote, as the function calls a server with
    native function calling would return for it."""
    data = json.loads(reply)
    if "tools" in data:
        made = [(c["tool"], c["args"]) for c in data["tools"]]
    elif "tool" in data:
        made = [(data["tool"], data["args"])]
    else:
        (form,) = (key for key in _FORM_FUNCTIONS if key in data)
        made = [(_FORM_FUNCTIONS[form], data)]
    return [
        {
            "id": f"c{n}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)},
        }
        for n, (name, args) in enumerate(made)
    ]


def strong_tools(chat: ChatCall) -> Reply | str:
    """The strong model behind a server that speaks function calls: asked with `tools`,
    it answers with `tool_calls` only (no text); asked without, as `strong`."""
    reply = strong(chat)
    if "tools" not in chat.body:
        return reply
    offered = {f["function"]["name"] for f in chat.body["tools"]}
    calls = _as_function_calls(reply)
    missing = [c["function"]["name"] for c in calls if c["function"]["name"] not in offered]
    assert not missing, f"called functions it was not offered: {missing}"
    return Reply(text="", tool_calls=calls)
