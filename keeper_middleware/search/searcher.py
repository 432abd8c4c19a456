"""The archive search tool's body: the model's arguments checked, the guards applied, the
archive searched or an excerpted message read back page by page, the reply sized to the room.

Never raises for anything the model can send: a bad argument, a repeat or a search past the
budget gets a "Refused: …" text the model can act on, and the guards' state is read, decided
and written while the session is held, so parallel searches cannot race past them.

A search runs on a branch (its head, ``branches``): it finds only what that branch archived,
reads only the records it holds, and, in a graph, takes the guards' state from the branch's own
messages (``branch_guards``) rather than from the session.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage

from keeper_middleware.archive.records import TIP, ArchivedTurn, Head
from keeper_middleware.config import KeeperConfig
from keeper_middleware.retrievers.background import background_worker
from keeper_middleware.retrievers.base import Retriever, search_and_count
from keeper_middleware.search.args import ReadArgs, Refusal, parse_search_args
from keeper_middleware.search.branch_guards import GuardBefore, guard_before
from keeper_middleware.search.guards import SearchCommand, decide, input_budget
from keeper_middleware.search.results import render_results
from keeper_middleware.sessions.branches import Branches
from keeper_middleware.sessions.state import SessionState
from keeper_middleware.step.arrivals import ROOM_KEY
from keeper_middleware.step.excerpts import MIN_EXCERPT_TOKENS, Count, archived_text, read_page
from keeper_middleware.step.fold import ROUND_KEY_PREFIX, round_text
from keeper_middleware.tokens.counting import TokenCounter

log = logging.getLogger(__name__)

KEEPER_CHANNEL = "keeper"
"""The graph state's channel that holds the keeper state (``KeeperGraphState.keeper``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ArchiveSearch:
    """Answers ``search_archive`` calls for one keeper's sessions."""

    sessions: SessionState
    retriever: Retriever
    config: KeeperConfig
    tokens: TokenCounter
    branches: Branches
    is_new_input: Callable[[BaseMessage], bool]
    """What counts as new input (the guards start over after it)."""
    index_ready: Callable[[str], None] = lambda session: None
    """Makes sure the session's archived turns are indexed before a search reads the index
    (its catch-up may still be queued right after a cut)."""

    def answer(
        self, session: str, args: object, *, state: Mapping[str, Any], call_id: str
    ) -> tuple[str, dict[str, Any] | None]:
        """Answer the call ``call_id`` of a graph whose state is ``state``: on the branch its
        keeper state names, with the guards' state its messages carry. A state without a keeper
        step's values (a graph that archives by itself, and keeps the session's guards) searches
        the session as of its latest cut, with the session's guards."""
        messages = list(state.get("messages") or [])
        kstate = state.get(KEEPER_CHANNEL)
        if not isinstance(kstate, Mapping) or not kstate:
            return self.run(session, args)
        budget = self.turn_budget(messages, call_id)
        guard = guard_before(messages, call_id, self.is_new_input, budget=budget)
        room = kstate.get(ROOM_KEY)
        return self.run(
            session,
            args,
            head=self.branches.head(session, kstate, messages),
            guard=guard,
            room=room if isinstance(room, int) else None,
        )

    def turn_budget(self, messages: Sequence[BaseMessage], call_id: str) -> int | None:
        """The searches the turn of the call ``call_id`` may run: scaled to the questions of
        the newest input before it (:func:`~keeper_middleware.search.guards.turn_budget`)."""
        at = next(
            (
                i
                for i in range(len(messages) - 1, -1, -1)
                if isinstance(messages[i], AIMessage)
                and any(call.get("id") == call_id for call in messages[i].tool_calls)  # type: ignore[attr-defined]
            ),
            len(messages),
        )
        asked = next((m for m in reversed(messages[:at]) if self.is_new_input(m)), None)
        return input_budget(self.config.search_budget, self.config.searches_per_question, asked)

    def run(
        self,
        session: str,
        args: object,
        *,
        head: Head = TIP,
        guard: GuardBefore | None = None,
        room: int | None = None,
    ) -> tuple[str, dict[str, Any] | None]:
        """Answer one call from the model's raw arguments, on the branch ``head``: the reply,
        and what its result carries for the next search (None: nothing).

        ``guard``: the guards' state the call meets, from the branch's messages; without it
        the session's own is read and written (the proxy, a tool called outside a graph).
        ``room``: the room a message has in view, as the branch's last step measured it."""
        sessions = self.sessions
        parsed = parse_search_args(args)
        if isinstance(parsed, Refusal):
            log.info("search refused session=%s: %s", session, parsed.text)
            with sessions.hold(session):
                sessions.counters(session).search_refusals += 1
                sessions.save_counters(session)
            return parsed.text, None
        if isinstance(parsed, ReadArgs):
            command = SearchCommand(query="", read=parsed.ref, page=parsed.page)
        else:
            command = SearchCommand(
                query=parsed.query, from_item=parsed.from_item, to_item=parsed.to_item
            )
        artifact = None
        with sessions.hold(session):
            counters = sessions.counters(session)
            budget = self.config.search_budget
            if guard is None:
                decision = decide(sessions.guard(session), command, budget=budget)
                sessions.set_guard(session, decision.state)
            else:
                decision = decide(guard.state, command, budget=budget)
                artifact = guard.artifact(decision.state)
            if decision.verdict != "run":
                log.info(
                    "search %s session=%s key=%r",
                    "stopped" if decision.verdict == "stop" else "refused",
                    session,
                    command.key[:200],
                )
                counters.search_refusals += 1
                counters.search_stops += decision.verdict == "stop"
            else:
                counters.searches += 1
            sessions.save_counters(session)
            if room is None:
                room = sessions.room(session, self.config.message_tokens)
        if decision.verdict != "run":
            return decision.message, artifact
        if isinstance(parsed, ReadArgs):
            return self.read(session, parsed, room, head), artifact
        with background_worker().foreground():  # indexing pauses while the model waits
            self.index_ready(session)
            hits, total = search_and_count(
                self.retriever,
                parsed.query,
                session=session,
                k=self.config.search_results,
                limit=self.config.search_scan,
                from_item=parsed.from_item,
                to_item=parsed.to_item,
                within=self.branches.passages(session, head),
            )
        text = render_results(
            command,
            hits,
            total=total,
            shown=self.config.search_results,
            scanned=self.config.search_scan,
            max_tokens=max(MIN_EXCERPT_TOKENS, room - 16),
            count=self.tokens.count_text,
        )
        return text, artifact

    def read(self, session: str, args: ReadArgs, room: int, head: Head = TIP) -> str:
        """One page of an archived message (what an excerpt's pointer leads to), as the branch
        ``head`` archived it."""
        archive = self.sessions.archive
        chain = self.branches.chain(session, head)
        folded = archive.get_value(session, f"{ROUND_KEY_PREFIX}{args.ref}")
        if isinstance(folded, list):  # a folded round: each of its messages in turn
            turn = _round_turn(
                [archive.turn(session, str(i), within=chain) for i in folded], args.ref
            )
        else:
            msg_id = archive.get_value(session, f"ref:{args.ref}")
            turn = archive.turn(
                session, msg_id if isinstance(msg_id, str) else args.ref, within=chain
            )
        page_tokens = max(MIN_EXCERPT_TOKENS, min(self.config.page_tokens, room - 64))
        return render_page(turn, args, page_tokens, self.tokens.count_text)


def _round_turn(turns: list[ArchivedTurn | None], ref: str) -> ArchivedTurn | None:
    """A folded round as one message to page through (None: the branch holds none of it)."""
    held = [t for t in turns if t is not None]
    if not held:
        return None
    first = held[0]
    return ArchivedTurn(
        session=first.session,
        msg_id=ref,
        item=first.item,
        role="tool",
        content=round_text(held),
    )


def render_page(turn: ArchivedTurn | None, args: ReadArgs, page_tokens: int, count: Count) -> str:
    """The page ``args`` asks for of ``turn``, headed so the model knows where it is and how to
    read on; a refusal when there is no such message or page."""
    if turn is None:
        return (
            f'Refused: no archived message has the reference "{args.ref[:80]}"; copy it '
            "from an excerpt's pointer line."
        )
    text = archived_text(turn.content, turn.tool_calls_json)
    chunk, pages = read_page(text, args.page, page_tokens, count)
    if not chunk:
        return f"Refused: page {args.page} does not exist; the message has {pages} page(s)."
    where = f" (item {turn.item})" if turn.item is not None else ""
    head = f'[READ "{args.ref}"] page {args.page} of {pages}{where}, {turn.role} message:'
    tail = (
        f'\n[next: search_archive(read="{args.ref}", page={args.page + 1})]'
        if args.page < pages
        else "\n[end of the message]"
    )
    return f"{head}\n{chunk}{tail}"
