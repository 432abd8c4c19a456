"""Realistic agent traffic, deterministic by seed: what a coding agent sends a keeper.

The benchmark's stream is small, evenly sized batches read by a well-behaved reader. Real agents
send something else, and each of these once broke a thread: file reads and test logs of 1K to
500K characters, parallel tool calls, a user pasting tens of thousands of characters mid-session,
verbose replies bigger than the window, Chinese, Japanese and emoji, search loops with a new query
every time, and hostile search arguments (``2**70``, ranges backwards, lone surrogates, 100KB
queries, wrong types). The second round (``ROUND_TWO``, and ``imported=``) adds what broke next:
a history imported at once (hundreds of messages in the first invoke), bursts of 50+ parallel
tool results, content blocks (an image beside the text, tool results as JSON blocks), item
numbers that restart, jump and go back, and a model that never stops searching.

:func:`coding_session` writes one session as data (what the user says, which tools the model
calls in which rounds, what it replies); :class:`TrafficModel` plays the model's side of it
against whatever the keeper sends, so the same session runs through every entry point.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from keeper_middleware.messages.facts import keeper_kind, storable_args, text_of
from keeper_middleware.notes.block import NOTES_CHECK_TAG, NOTES_REQUEST_TAG, NOTES_TAG
from keeper_middleware.reinjection.additions import RETRIEVED_TAG, RULES_TAG
from keeper_middleware.search.schema import SEARCH_TOOL_NAME
from keeper_middleware.step.excerpts import EXCERPT_TAG

__all__ = [
    "KINDS",
    "ROUND_TWO",
    "RULE",
    "TOOL_NAMES",
    "Call",
    "Session",
    "TrafficModel",
    "Turn",
    "coding_session",
    "imported_history",
]

TOOL_NAMES = ("read_file", "run_tests")
RULE = "Always run the tests before you say that a change is done."
SYSTEM_PROMPT = "You are a careful coding agent. Use the tools; search the archive for old turns."
_NAMES = ("parser", "ledger", "cache", "router", "auth", "billing", "export", "search")
_CJK = "解析器缓存路由认证计费导出搜索测试失败成功文件函数变量错误修复"
_KANA = "ファイルをよみこみますテストがしっぱいしました"
_EMOJI = ("🔥", "✅", "❌", "🚀", "🐛", "👍🏽", "👨‍💻")
_KEEPERS = (RULES_TAG, RETRIEVED_TAG, NOTES_TAG)
KINDS = ("read", "tests", "parallel", "paste", "question", "hostile", "verbose")
"""The first round's turn kinds (the default of :func:`coding_session`)."""
ROUND_TWO = (*KINDS, "burst", "blocks", "renumber", "loop")
"""With the second round's: a burst of parallel results, content blocks, renumbered items and
a search loop that never stops on its own."""
_TINY_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
_RENUMBERED = (999, 1000, 21, 22, 3, 1, 50_000, 7, 2**70)
_HOSTILE: tuple[dict[str, Any], ...] = (
    {"query": "parser", "from_item": 9, "to_item": 2},
    {"query": "ledger", "from_item": 2**70},
    {"query": "cache", "to_item": 10**30},
    {"query": "router \ud800 failure"},
    {"query": 12345},
    {"query": ["auth"]},
    {"query": "export", "from_item": "soon"},
    {"query": "x " * 50_000},
    {"read": "m0000000000", "page": 0},
    {},
)


@dataclass(frozen=True, slots=True)
class Call:
    name: str
    args: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Turn:
    """One user turn: the input, the model's rounds of (parallel) tool calls, its reply."""

    kind: str
    user: str
    rounds: tuple[tuple[Call, ...], ...] = ()
    reply: str = "Done."
    question: bool = False


@dataclass(frozen=True, slots=True)
class Session:
    seed: int
    task: str
    turns: tuple[Turn, ...]
    files: Mapping[str, str] = field(default_factory=dict)
    system_prompt: str = SYSTEM_PROMPT
    imported: tuple[BaseMessage, ...] = ()
    """History imported with the task, all in the first invoke (none by default)."""

    def tool_result(self, name: str, args: Mapping[str, Any]) -> str | list[dict[str, Any]]:
        """What ``read_file`` or ``run_tests`` returns for these arguments: text, or for a
        ``.json`` file a list of content blocks (a text block and a JSON block)."""
        key = f"{name}:{args.get('path') or args.get('target')}"
        found = self.files.get(key, f"{name}: nothing at {key}")
        if key.endswith(".json") and found.startswith("{"):
            return [
                {"type": "text", "text": f"{key}:"},
                {"type": "json", "json": json.loads(found)},
            ]
        return found

    def user_content(self, turn: Turn) -> str | list[dict[str, Any]]:
        """A turn's user input as sent: text, or for ``blocks`` text beside an image."""
        if turn.kind != "blocks":
            return turn.user
        image = {"url": f"data:image/png;base64,{_TINY_PNG}"}
        return [{"type": "text", "text": turn.user}, {"type": "image_url", "image_url": image}]


def _size(rng: random.Random, low: int, high: int) -> int:
    """Sizes spread evenly on a log scale, so a few are huge and most are not."""
    return int(math.exp(rng.uniform(math.log(low), math.log(high))))


def source_file(rng: random.Random, chars: int, name: str) -> str:
    lines: list[str] = [f"# {name}.py — {rng.choice(_CJK)}{rng.choice(_CJK)}模块"]
    n = 0
    while sum(map(len, lines)) < chars:
        n += 1
        lines.append(f"def {name}_{n}(value: int, items: list[str]) -> dict[str, int]:")
        lines.append(f'    """{rng.choice(_KANA)}{rng.choice(_KANA)} step {n}."""')
        lines.append(f"    total = value * {rng.randint(2, 99)} + len(items)  # {rng.choice(_CJK)}")
        lines.append(f"    return {{'{name}': total, 'n': {n}}}")
    return "\n".join(lines)[:chars]


def test_log(rng: random.Random, chars: int, target: str) -> str:
    lines: list[str] = [f"============ test session starts: {target} ============"]
    n = 0
    while sum(map(len, lines)) < chars:
        n += 1
        if rng.random() < 0.05:
            code = "".join(rng.choice("0123456789abcdef") for _ in range(24))
            lines.append(f"FAILED tests/test_{target}.py::test_{n} - AssertionError {code} ❌")
        else:
            lines.append(
                f"tests/test_{target}.py::test_{n} PASSED [{n % 100:3d}%] {rng.random():.6f}s"
            )
    return "\n".join(lines)[:chars]


def paste(rng: random.Random, chars: int) -> str:
    parts: list[str] = []
    while sum(map(len, parts)) < chars:
        roll = rng.random()
        if roll < 0.4:
            parts.append("The service logs show the cache warming slowly after each deploy. " * 2)
        elif roll < 0.6:
            parts.append("".join(rng.choice(_CJK) for _ in range(60)) + "。")
        elif roll < 0.75:
            parts.append("".join(rng.choice(_KANA) for _ in range(40)) + "。")
        elif roll < 0.9:
            parts.append(" ".join(rng.choice(_EMOJI) for _ in range(20)))
        else:
            parts.append(str(rng.getrandbits(512)))
    return "\n".join(parts)[:chars]


def imported_history(rng: random.Random, messages: int) -> list[BaseMessage]:
    """An earlier conversation, exported and imported at once: numbered status items with the
    agent's replies, and now and then a round of two parallel tool calls with their results."""
    history: list[BaseMessage] = []
    item = 0
    while len(history) < messages:
        item += 1
        name = rng.choice(_NAMES)
        history.append(
            HumanMessage(
                f"Item {item}. Earlier: the {name} module failed {rng.randint(1, 40)} tests "
                f"after change {rng.getrandbits(24):06x}; {rng.choice(_KANA)} {rng.choice(_EMOJI)}"
            )
        )
        if item % 7 == 0:
            calls = [
                {"name": "run_tests", "args": {"target": name}, "id": f"imp{item}a"},
                {"name": "read_file", "args": {"path": f"src/{name}.py"}, "id": f"imp{item}b"},
            ]
            history.append(AIMessage("", tool_calls=calls))
            history += [
                ToolMessage(f"{name}: {rng.randint(1, 9)} failed", tool_call_id=f"imp{item}a"),
                ToolMessage(source_file(rng, 600, name), tool_call_id=f"imp{item}b"),
            ]
        history.append(AIMessage(f"Noted the {name} failures of item {item}."))
    return history


def coding_session(
    seed: int,
    *,
    turns: int = 10,
    max_chars: int = 500_000,
    kinds: Sequence[str] = KINDS,
    imported: int = 0,
) -> Session:
    """One coding-agent session; the same seed (and arguments) give the same session.

    ``kinds`` are the turn kinds drawn from (``ROUND_TWO`` adds the second round's);
    ``imported`` messages of earlier history arrive with the task, in one invoke.
    """
    rng = random.Random(seed)
    files: dict[str, str] = {}
    result: list[Turn] = []
    task = f"Task: fix the failing tests in the repository, module by module. Rule: {RULE}"
    history = tuple(imported_history(random.Random(seed * 7919 + 1), imported)) if imported else ()
    renumbered = 0
    for _ in range(turns):
        kind = rng.choice(tuple(kinds))
        name = rng.choice(_NAMES)
        if kind == "burst":
            calls = []
            for n in range(rng.randint(50, 64)):
                path = f"src/{name}/part{n:02d}.py"
                files[f"read_file:{path}"] = source_file(rng, _size(rng, 200, 3_000), name)
                calls.append(Call("read_file", {"path": path}))
            turn = Turn(
                kind,
                f"Read every part of the {name} package at once.",
                (tuple(calls),),
                f"All {len(calls)} parts of {name} are read.",
            )
        elif kind == "blocks":
            path = f"reports/{name}-{rng.getrandbits(16):04x}.json"
            files[f"read_file:{path}"] = json.dumps(
                {"module": name, "failed": rng.randint(1, 30), "owner": rng.choice(_KANA)},
                ensure_ascii=False,
            )
            turn = Turn(
                kind,
                f"Here is a screenshot of the {name} dashboard; read its report too.",
                ((Call("read_file", {"path": path}),),),
                f"The {name} report and the screenshot agree.",
            )
        elif kind == "renumber":
            number = _RENUMBERED[renumbered % len(_RENUMBERED)]
            renumbered += 1
            turn = Turn(
                kind,
                f"Item {number}. Status of {name}: {rng.randint(0, 9)} tests still fail.",
                reply=f"Noted the {name} status.",
            )
        elif kind == "loop":
            turn = Turn(
                kind,
                f"Question: when did {name} first fail, and who changed it?",
                reply=f"I kept searching for {name}.",
                question=True,
            )
        elif kind == "read":
            path = f"src/{name}.py"
            files[f"read_file:{path}"] = source_file(rng, _size(rng, 1_000, max_chars), name)
            turn = Turn(
                kind,
                f"Look at {path} and tell me what it does.",
                ((Call("read_file", {"path": path}),),),
                f"{path} computes totals.",
            )
        elif kind == "tests":
            files[f"run_tests:{name}"] = test_log(rng, _size(rng, 1_000, max_chars), name)
            turn = Turn(
                kind,
                f"Run the {name} tests.",
                ((Call("run_tests", {"target": name}),),),
                f"The {name} tests ran; a few failed.",
            )
        elif kind == "parallel":
            calls = []
            for other in rng.sample(_NAMES, 3):
                path = f"src/{other}.py"
                files[f"read_file:{path}"] = source_file(
                    rng, _size(rng, 1_000, max_chars // 4), other
                )
                files[f"run_tests:{other}"] = test_log(
                    rng, _size(rng, 1_000, max_chars // 4), other
                )
                calls += [Call("read_file", {"path": path}), Call("run_tests", {"target": other})]
            turn = Turn(
                kind,
                "Read these modules and run their tests at once.",
                (tuple(calls),),
                "All three modules are read and tested.",
            )
        elif kind == "paste":
            turn = Turn(
                kind,
                "Here is the incident report:\n" + paste(rng, _size(rng, 1_000, 60_000)),
                reply="I read the report.",
            )
        elif kind == "question":
            searches = rng.randint(3, 16)
            rounds = tuple(
                (Call(SEARCH_TOOL_NAME, {"query": f"{rng.choice(_NAMES)} failure {i}"}),)
                for i in range(searches)
            )
            turn = Turn(
                kind,
                f"Question: which {name} test failed first, and why?",
                rounds,
                f"The first {name} failure was an assertion.",
                question=True,
            )
        elif kind == "hostile":
            picked = rng.sample(_HOSTILE, 4)
            hostile = tuple(Call(SEARCH_TOOL_NAME, args) for args in picked)
            turn = Turn(
                kind,
                f"Search the archive for the {name} changes?",
                (hostile,),
                "The searches were refused.",
                question=True,
            )
        else:
            turn = Turn(
                kind,
                f"Explain everything you know about {name}.",
                reply=paste(rng, _size(rng, 20_000, 120_000)),
            )
        result.append(turn)
    return Session(seed=seed, task=task, turns=tuple(result), files=files, imported=history)


class TrafficModel:
    """The model's side of a session: a callable for a scripted chat model.

    It answers note requests with the rule when the task is among what it notes, and otherwise
    plays the turn the latest user input belongs to, round by round; once per turn it follows an
    excerpt's pointer to read a page. It is stateful (one instance per run).
    """

    def __init__(self, session: Session, *, storable: bool = False) -> None:
        """``storable``: send arguments a checkpointer can store (numbers beyond 64 bits and
        lone surrogates as text), for graphs that store a reply before the keeper sees it."""
        self.session = session
        self._storable = storable
        self._turn: Turn | None = None
        self._round = 0
        self._read = False
        self._next = 0
        self._ids = 0

    def __call__(self, messages: Sequence[BaseMessage]) -> AIMessage | str:
        last = messages[-1]
        # over the wire (the proxy) a note request has no tag: its text says what it is
        if keeper_kind(last) in ("notes_request", "notes_reask") or text_of(last).startswith(
            (NOTES_REQUEST_TAG, NOTES_CHECK_TAG)
        ):
            seen = "\n".join(text_of(m) for m in messages)
            return f"RULE: {RULE}" if RULE in seen else "NO CHANGES"
        # over the wire (the proxy) the keeper's own messages have no tag: their text says so
        mine = [
            m for m in messages if keeper_kind(m) is None and not text_of(m).startswith(_KEEPERS)
        ]
        latest = mine[-1] if mine else last
        if isinstance(latest, HumanMessage):
            self._start(text_of(latest))
        elif isinstance(latest, ToolMessage):
            self._round += 1
        turn = self._turn
        if turn is None:
            return "Understood."
        if turn.kind == "loop":  # never stops on its own: a new search every round
            query = f"{turn.user[:24]} {self._round}"
            return self._calls((Call(SEARCH_TOOL_NAME, {"query": query}),), text=turn.reply)
        pointer = self._pointer(messages)
        if pointer is not None:
            self._read = True
            self._round -= 1  # the read takes a round of its own
            return self._calls((Call(SEARCH_TOOL_NAME, {"read": pointer, "page": 2}),))
        if self._round < len(turn.rounds):
            return self._calls(turn.rounds[self._round])
        return turn.reply

    def _start(self, text: str) -> None:
        head = text[:40]
        for index in range(self._next, len(self.session.turns)):
            if self.session.turns[index].user[:40] == head:
                self._turn, self._round, self._read = self.session.turns[index], 0, False
                self._next = index + 1
                return
        self._turn = None

    def _pointer(self, messages: Sequence[BaseMessage]) -> str | None:
        if self._read or not isinstance(messages[-1], ToolMessage):
            return None
        for message in reversed(messages):
            if not isinstance(message, ToolMessage):
                break
            text = text_of(message)
            if EXCERPT_TAG in text and 'read="' in text:
                return text.split('read="', 1)[1].split('"', 1)[0]
        return None

    def _calls(self, calls: Sequence[Call], text: str = "") -> AIMessage:
        made = []
        for call in calls:
            self._ids += 1
            args = storable_args(dict(call.args)) if self._storable else dict(call.args)
            made.append(
                {
                    "name": call.name,
                    "args": args,
                    "id": f"call-{self._ids}",
                    "type": "tool_call",
                }
            )
        return AIMessage(text, tool_calls=made)
