"""What every adapter asks the keeper around the agent's own model calls (a mixin of
:class:`~keeper_middleware.keeper.Keeper`): the call's kwargs, whether the search tool is
offered, a reply recorded and perhaps asked again, and the search tool's answers.

The node, the middleware and the proxy each call these the same way, so thinking, retries and
the search guards behave alike whichever adapter runs the agent. Nothing here takes messages
in or cuts: that is the step's (:meth:`~keeper_middleware.keeper.Keeper.step`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from langchain_core.messages import AIMessage, BaseMessage

from keeper_middleware.archive.records import TIP, Head
from keeper_middleware.archive.store import ArchiveStore
from keeper_middleware.config import KeeperConfig
from keeper_middleware.errors import UnknownSessionError
from keeper_middleware.messages.facts import strip_reasoning, with_storable_calls
from keeper_middleware.model.thinking import call_kwargs, retry_of
from keeper_middleware.reinjection.questions import QuestionDetector, open_question_index
from keeper_middleware.retrievers.background import background_worker
from keeper_middleware.retrievers.base import Hit, Retriever, search_within
from keeper_middleware.search.branch_guards import sample_now, withheld_now
from keeper_middleware.search.guards import GuardState, without_search_calls
from keeper_middleware.search.indexing import BackgroundIndexing
from keeper_middleware.search.run_steps import room_for_a_search
from keeper_middleware.search.searcher import KEEPER_CHANNEL, ArchiveSearch
from keeper_middleware.sessions.branches import Branches
from keeper_middleware.sessions.copies import ThreadCopies
from keeper_middleware.sessions.counters import Counters
from keeper_middleware.sessions.state import SessionState
from keeper_middleware.step.items import ItemNumbering
from keeper_middleware.step.known import LastEntries
from keeper_middleware.step.window import WindowPolicy

__all__ = ["WorkCalls"]

log = logging.getLogger(__name__)
"""A search call dropped from a reply because the tool was withheld (INFO)."""


class WorkCalls:
    """The keeper's side of the agent's own model calls and searches (mixed into
    :class:`~keeper_middleware.keeper.Keeper`, which builds every part named here)."""

    config: KeeperConfig
    archive: ArchiveStore
    retriever: Retriever
    detector: QuestionDetector
    items: ItemNumbering
    window: WindowPolicy
    sessions: SessionState
    branches: Branches
    indexing: BackgroundIndexing
    searcher: ArchiveSearch
    last_entries: LastEntries
    copies: ThreadCopies

    if TYPE_CHECKING:  # the keeper's own, defined beside its state

        def session(self, session: str) -> AbstractContextManager[None]: ...

        def counters(self, session: str) -> Counters: ...

        def archived_as(
            self,
            session: str,
            state: Mapping[str, Any] | None,
            messages: Sequence[BaseMessage] = (),
        ) -> str: ...

        def _guard(self, session: str) -> GuardState: ...

        def _set_guard(self, session: str, guard: GuardState) -> None: ...

        def _span(self, phase: str, session: str) -> AbstractContextManager[None]: ...

        def _check_index(self, session: str) -> None: ...

    def work_kwargs(self, session: str, messages: Sequence[BaseMessage]) -> dict[str, Any]:
        """Call kwargs for the agent's own next model call.

        Thinking stays on while a question is open (without it a measured run repeated one
        search 790 times); the one reply after a stop line is sampled with some randomness.
        """
        facts = self.last_entries.facts_of(session, messages)  # the window a step just left
        if facts is None:
            layout = self.window.layout(messages)
            open_at = open_question_index(messages, self.detector, start=layout.head_end)
        else:
            open_at = facts.open_at
        kwargs = call_kwargs(self.config.thinking, thinking=open_at is not None)
        carried = sample_now(messages)  # the branch's own search results say, in a graph
        if carried is not None:
            if carried:
                kwargs.update(self.config.thinking.sample_after_stop)
            return kwargs
        with self.session(session):
            guard = self._guard(session)
            if guard.sample_next:
                kwargs.update(self.config.thinking.sample_after_stop)
                self._set_guard(session, replace(guard, sample_next=False))
        return kwargs

    def search_offered(self, session: str, messages: Sequence[BaseMessage] | None = None) -> bool:
        """Whether the next work call is offered the search tool: not after the stop line,
        until new input arrives (every adapter asks here, and leaves the tool out). In a graph,
        ``messages`` (the branch's) say it: their search results carry the guards' state.
        Never when the graph run is too near its recursion limit for one more search and the
        answer after it (:mod:`~keeper_middleware.search.run_steps`)."""
        if not room_for_a_search():
            return False
        if messages is not None:
            carried = withheld_now(messages, self.items.is_new_input)
            if carried is not None:
                return not carried
        with self.session(session):
            return not self._guard(session).withheld

    def answer_only(self, session: str, reply: AIMessage) -> AIMessage:
        """A work reply as it stands when the search tool was withheld from its call: any call
        to it is dropped (it would be refused again), so a model that never stops searching
        ends with what else it said."""
        stripped = without_search_calls(reply)
        if stripped is not reply:
            log.info("search call dropped session=%s: the tool was withheld", session)
        return stripped

    def record_reply(self, session: str, reply: AIMessage) -> AIMessage:
        """Count a work reply and strip its reasoning before it is stored."""
        with self.session(session):
            counters = self.counters(session)
            counters.model_calls += 1
            counters.add_usage(reply, management=False)
            self.sessions.save_counters(session)
        return with_storable_calls(strip_reasoning(reply))

    def retry_kwargs(
        self, session: str, kwargs: Mapping[str, Any], reply: BaseMessage
    ) -> dict[str, Any] | None:
        """Whether a work reply is asked again, and with which call kwargs (None: it stands).

        A reply that thought to its limit and wrote nothing is asked again without thinking; an
        empty reply once more with some randomness, so it can come out different. Every adapter
        (node, middleware, proxy) asks here, so they retry alike.
        """
        decided = retry_of(self.config.thinking, kwargs, reply)
        if decided is None:
            return None
        counter, again = decided
        self._count_retry(session, counter)
        return again

    def _count_retry(self, session: str, field: str) -> None:
        with self.session(session):
            counters = self.counters(session)
            setattr(counters, field, getattr(counters, field) + 1)
            self.sessions.save_counters(session)

    def search(
        self,
        session: str,
        query: object = None,
        from_item: object = None,
        to_item: object = None,
        *,
        read: object = None,
        page: object = None,
        head: Head = TIP,
    ) -> str:
        """The archive search tool's body, guards included; see :meth:`run_search_tool`.
        ``head``: the branch to search (:meth:`head_of` a graph state; default: the session's
        latest cut's)."""
        args = {"query": query, "from_item": from_item, "to_item": to_item}
        if read is not None:
            args.update(read=read, page=page)
        return self.run_search_tool(session, args, head=head)

    def run_search_tool(self, session: str, args: object, *, head: Head = TIP) -> str:
        """Answer one ``search_archive`` call from the model's raw arguments, with the
        session's own guards (the proxy, a tool called outside a graph).

        Never raises for anything the model can send: bad arguments get a "Refused: …" text
        (:func:`~keeper_middleware.search.args.parse_search_args`). The guards' state is read,
        decided and written under one lock, so parallel searches cannot race past them. The
        reply is sized to the room a message has in view.
        """
        session = self.copies.of(session)
        with self._span("search", session):
            self._check_index(session)
            return self.searcher.run(session, args, head=head)[0]

    def answer_search(
        self, session: str, args: object, *, state: Mapping[str, Any], call_id: str
    ) -> tuple[str, dict[str, Any] | None]:
        """Answer the ``search_archive`` call ``call_id`` of a graph whose state is ``state``:
        on that state's branch, with the guards' state its messages carry. Returns the reply
        and the result's artifact (the guards' state after the search, for the next one). A
        state without a keeper step's values (a graph that archives by itself) searches the
        session as of its latest cut, with the session's own guards."""
        kstate = state.get(KEEPER_CHANNEL)
        session = self.archived_as(session, kstate if isinstance(kstate, Mapping) else None)
        with self._span("search", session):
            return self.searcher.answer(session, args, state=state, call_id=call_id)

    def retrieve(self, session: str, query: str, *, k: int = 10, head: Head = TIP) -> list[Hit]:
        """The archive's best matches for ``query`` on the branch ``head``, as the search
        tool finds them (without its guards or its rendering).

        Args:
            session: the thread id.
            query: what to search for.
            k: how many hits at most.
            head: the branch (a cut key from :meth:`head_of`); the thread's latest by default.

        Raises:
            UnknownSessionError: no step ever ran under ``session`` with this archive (a
                mistyped thread id, or another archive), so there is nothing to search.
        """
        session = self.copies.of(session)
        if not self.sessions.known(session):
            raise UnknownSessionError(
                f"thread {session!r} is unknown to this keeper: no step ran under that thread id "
                f"with the archive {self.archive!r}. Check the thread id (the run's "
                "config['configurable']['thread_id']) and that the keeper opens the archive "
                f"the thread ran with; known threads: keeper.archive.sessions()"
            )
        self._check_index(session)
        with background_worker().foreground():
            self.indexing.ready(session)
            return search_within(
                self.retriever,
                query,
                session=session,
                k=k,
                within=self.branches.passages(session, head),
            )
