"""Messages too big for the room they need: archived word for word at once, an excerpt in view.

Three phases meet such a message (taking new inputs in, fitting a request, finishing a cut), and
each needs only "archive this whole now and give me its bounded excerpt": the excerpt keeps the
message's id and carries a pointer the model can follow to read the rest, page by page.

Archiving a message whole is a commit of its own on the branch (it moves the branch's head, the
``head`` of the keeper state given), so the branch sees the record at once, and another branch
never does. The excerpt says which record it stands for (:data:`EXCERPT_KEY`: the record's
digest, and the excerpt's own); when a cut later moves the excerpt out of view, that record is
what the cut archives, once, whole. An excerpt edited since (its digest no longer its own) is
archived as the text it now holds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

from langchain_core.messages import BaseMessage

from keeper_middleware.archive.records import ArchivedTurn
from keeper_middleware.archive.store import ArchiveStore, put_values
from keeper_middleware.model.setup import ModelSetup
from keeper_middleware.sessions.branches import HEAD_KEY, Branches, commit_on_branch, state_head
from keeper_middleware.step.cut import whole_key
from keeper_middleware.step.entries import Entry, messages_of
from keeper_middleware.step.excerpts import EXCERPT_TAG, excerpt_ref, excerpt_within, smallest_form
from keeper_middleware.step.fold import ROUND_KEY_PREFIX, folded_pair, reply_stub, round_ref
from keeper_middleware.step.turns import archived_turn
from keeper_middleware.step.window import WindowPolicy
from keeper_middleware.tokens.counting import TokenCounter

EXCERPT_KEY = "keeper_excerpt"
"""``additional_kwargs`` key of an excerpt: ``{"of": digest of the record archived whole,
"is": digest of the excerpt as made}`` (its form alone: the item a step numbers it with may come
later)."""

KState = MutableMapping[str, Any]


class OversizedMessages:
    def __init__(
        self,
        *,
        archive: ArchiveStore,
        tokens: TokenCounter,
        window: WindowPolicy,
        page_tokens: int,
        sync_index: Callable[[str], None],
        branches: Branches,
    ) -> None:
        self.archive = archive
        self.tokens = tokens
        self.window = window
        self.page_tokens = page_tokens
        self.sync_index = sync_index
        self.branches = branches

    def shrink_in_view(
        self,
        session: str,
        entries: Sequence[Entry],
        kstate: KState,
        setup: ModelSetup,
    ) -> tuple[list[BaseMessage], bool]:
        """Excerpt what :meth:`WindowPolicy.in_view_excess` names; each is archived whole."""
        over, level = self.window.in_view_excess(entries, setup)
        items: Mapping[str, int] = kstate.get("items", {})
        result = messages_of(entries)
        changed = False
        for index in over:
            message = entries[index].message
            shrunk = self.archive_whole(session, message, items.get(str(message.id)), level, kstate)
            changed = changed or shrunk is not message
            result[index] = shrunk
        return result, changed

    def excerpter(self, session: str, kstate: KState) -> Callable[[BaseMessage, int], BaseMessage]:
        items: Mapping[str, int] = kstate.get("items", {})

        def excerpt(message: BaseMessage, cap: int) -> BaseMessage:
            return self.archive_whole(session, message, items.get(str(message.id)), cap, kstate)

        return excerpt

    def archive_whole(
        self,
        session: str,
        message: BaseMessage,
        item: int | None,
        cap: int,
        kstate: KState,
    ) -> BaseMessage:
        """Archive ``message`` word for word now, on the branch ``kstate`` names (its head moves
        to the new commit), and return its excerpt (same id) for the view.

        A later cut that moves the excerpt out archives this record again, which its branch
        already holds: the turn is in it exactly once, whole. An untouched excerpt shrunk again
        (a burst that leaves it less room) is not archived: it keeps pointing at its record.
        """
        msg_id = str(message.id)
        ref = excerpt_ref(session, msg_id)
        size = self.tokens.count_messages([message])
        smallest = smallest_form(message, ref)
        cap = max(cap, min(size, self.tokens.count_messages([smallest])))
        if size <= cap:
            return message  # an excerpt would be no smaller than the message itself
        turn = archived_turn(session, message, item)
        marker = message.additional_kwargs.get(EXCERPT_KEY)
        if isinstance(marker, dict) and marker.get("is") == _form_digest(session, message):
            whole = str(marker.get("of"))  # an excerpt made smaller still: its record stands
        else:
            whole = turn.digest
            head = state_head(kstate)
            key = whole_key(session, head, msg_id, turn.digest)
            commit_on_branch(self.archive, session, head, cut_key=key, turns=[turn], notes=None)
            kstate[HEAD_KEY] = key
            self.archive.put_value(session, f"ref:{ref}", msg_id)
            self.sync_index(session)
        shrunk = excerpt_within(
            message,
            cap=cap,
            ref=ref,
            page_tokens=self.page_tokens,
            count=self.tokens.count_text,
            count_message=lambda m: self.tokens.count_messages([m]),
        )
        made = _form_digest(session, shrunk)
        kwargs = {**shrunk.additional_kwargs, EXCERPT_KEY: {"of": whole, "is": made}}
        return shrunk.model_copy(update={"additional_kwargs": kwargs})

    def fold_round(
        self,
        session: str,
        messages: Sequence[BaseMessage],
        item: int | None,
        kstate: KState,
    ) -> list[BaseMessage]:
        """Archive every message of a round of tool calls word for word now, in one commit on
        the branch ``kstate`` names, and return the pointer pair it stands as in view
        (:mod:`~keeper_middleware.step.fold`). Each message stays readable by its own
        reference too."""
        turns = [archived_turn(session, m, item) for m in messages]
        reply_id = turns[0].msg_id
        ref = excerpt_ref(session, reply_id)
        head = state_head(kstate)
        digest = hashlib.sha256("".join(t.digest for t in turns).encode()).hexdigest()[:32]
        key = whole_key(session, head, reply_id, digest)
        commit_on_branch(self.archive, session, head, cut_key=key, turns=turns, notes=None)
        kstate[HEAD_KEY] = key
        values: dict[str, Any] = {f"ref:{excerpt_ref(session, t.msg_id)}": t.msg_id for t in turns}
        values[f"{ROUND_KEY_PREFIX}{round_ref(ref)}"] = [t.msg_id for t in turns]
        put_values(self.archive, session, values)
        self.sync_index(session)
        reply, pointer = folded_pair(messages, round_ref(ref), reply_stub(ref))
        marked: list[BaseMessage] = []
        for shown, whole in ((reply, turns[0]), (pointer, _record_of(turns, pointer))):
            if whole is None:
                marked.append(shown)
                continue
            mark = {"of": whole.digest, "is": _form_digest(session, shown)}
            kwargs = {**shown.additional_kwargs, EXCERPT_KEY: mark}
            marked.append(shown.model_copy(update={"additional_kwargs": kwargs}))
        return marked

    def whole_of(
        self, session: str, head: str | None, turn: ArchivedTurn, message: BaseMessage
    ) -> ArchivedTurn:
        """The turn a cut archives for ``message``: for an untouched excerpt, the record it
        stands for (read back from the branch), else ``turn`` itself. An excerpt made before
        excerpts said which record they stand for is known by its own pointer line."""
        marker = message.additional_kwargs.get(EXCERPT_KEY)
        if isinstance(marker, dict):
            if marker.get("is") != _form_digest(session, message):
                return turn  # edited since it was made: archived as it now reads
            wanted = marker.get("of")
        elif EXCERPT_TAG in turn.content and (
            f'read="{excerpt_ref(session, turn.msg_id)}"' in turn.content
        ):
            wanted = None  # the branch's latest record of the message, whatever it holds
        else:
            return turn
        whole = self.archive.turn(session, turn.msg_id, within=self.branches.chain(session, head))
        if whole is None:  # archived whole where the branch cannot see it (a lost state): link it
            whole = self.archive.turn(session, turn.msg_id)
        if whole is None or (wanted is not None and whole.digest != wanted):
            return turn
        return whole


def _record_of(turns: Sequence[ArchivedTurn], message: BaseMessage) -> ArchivedTurn | None:
    """The archived record a message of a folded round stands for (by its id)."""
    return next((t for t in turns if t.msg_id == str(message.id)), None)


def _form_digest(session: str, message: BaseMessage) -> str:
    """The digest of what ``message`` holds, whatever item it is numbered with."""
    return archived_turn(session, message, None).digest
