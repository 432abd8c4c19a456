"""Messages too big for the room they need: archived word for word at once, an excerpt in view.

Three phases meet such a message (taking new inputs in, fitting a request, finishing a cut), and
each needs only "archive this whole now and give me its bounded excerpt": the excerpt keeps the
message's id and carries a pointer the model can follow to read the rest, page by page.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.messages import BaseMessage

from keeper_middleware.archive.store import ArchiveStore
from keeper_middleware.cut import cut_key
from keeper_middleware.entries import Entry, messages_of
from keeper_middleware.excerpts import excerpt_ref, excerpt_within, smallest_form
from keeper_middleware.model_setup import ModelSetup
from keeper_middleware.tokens import TokenCounter
from keeper_middleware.turns import archived_turn
from keeper_middleware.window import WindowPolicy


class OversizedMessages:
    def __init__(
        self,
        *,
        archive: ArchiveStore,
        tokens: TokenCounter,
        window: WindowPolicy,
        page_tokens: int,
        sync_index: Callable[[str], None],
    ) -> None:
        self.archive = archive
        self.tokens = tokens
        self.window = window
        self.page_tokens = page_tokens
        self.sync_index = sync_index

    def shrink_in_view(
        self,
        session: str,
        entries: Sequence[Entry],
        kstate: Mapping[str, Any],
        setup: ModelSetup,
    ) -> tuple[list[BaseMessage], bool]:
        """Excerpt what :meth:`WindowPolicy.in_view_excess` names; each is archived whole."""
        over, level = self.window.in_view_excess(entries, setup)
        items: Mapping[str, int] = kstate.get("items", {})
        result = messages_of(entries)
        changed = False
        for index in over:
            message = entries[index].message
            shrunk = self.archive_whole(session, message, items.get(str(message.id)), level)
            changed = changed or shrunk is not message
            result[index] = shrunk
        return result, changed

    def excerpter(
        self, session: str, items: Mapping[str, int]
    ) -> Callable[[BaseMessage, int], BaseMessage]:
        def excerpt(message: BaseMessage, cap: int) -> BaseMessage:
            return self.archive_whole(session, message, items.get(str(message.id)), cap)

        return excerpt

    def archive_whole(
        self, session: str, message: BaseMessage, item: int | None, cap: int
    ) -> BaseMessage:
        """Archive ``message`` word for word now, and return its excerpt (same id) for the view.

        A later cut archives the excerpt's id again, which the archive skips: the turn is in it
        exactly once, whole.
        """
        msg_id = str(message.id)
        ref = excerpt_ref(session, msg_id)
        size = self.tokens.count_messages([message])
        smallest = smallest_form(message, ref)
        cap = max(cap, min(size, self.tokens.count_messages([smallest])))
        if size <= cap:
            return message  # an excerpt would be no smaller than the message itself
        turn = archived_turn(session, message, item)
        self.archive.commit_cut(
            session, cut_key=f"whole-{cut_key(session, [], msg_id)}", turns=[turn], notes=None
        )
        self.archive.put_value(session, f"ref:{ref}", msg_id)
        self.sync_index(session)
        return excerpt_within(
            message,
            cap=cap,
            ref=ref,
            page_tokens=self.page_tokens,
            count=self.tokens.count_text,
            count_message=lambda m: self.tokens.count_messages([m]),
        )
