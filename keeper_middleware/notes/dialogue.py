"""The note-taking conversation: the note request, the re-asks, and the replies read back.

The conversation is a generator of model requests (messages and call kwargs) that receives
the replies, so the sync and async steps pump the same generator and differ only in how the
model is called. What the replies mean is decided by :class:`~keeper_middleware.notes.taking.
NoteTaking` (in-place changes) or :mod:`~keeper_middleware.notes.rewrite` (full rewrites).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, SystemMessage

from keeper_middleware.config import KeeperConfig
from keeper_middleware.messages.facts import (
    keeper_message,
    strip_reasoning,
    text_of,
    thought_to_limit,
)
from keeper_middleware.model.setup import AsyncNoteCall, ModelSetup, NoteCall
from keeper_middleware.model.thinking import call_kwargs, differing
from keeper_middleware.notes.block import Notes
from keeper_middleware.notes.changes import SetLine, UnsetLine
from keeper_middleware.notes.checks import NoteCheck
from keeper_middleware.notes.checks.names import compile_names
from keeper_middleware.notes.recall import named_in, recall_block, settle_recalled, with_recalled
from keeper_middleware.notes.rewrite import REWRITE_REQUEST_TEXT, merge_rewrite, parse_rewrite
from keeper_middleware.notes.rules import looks_like_instruction, quoted_in
from keeper_middleware.notes.standing import with_stated_rules
from keeper_middleware.notes.taking import Ask, Done, NoteOutcome, NoteTaking, notes_request_text
from keeper_middleware.reinjection.questions import QuestionDetector
from keeper_middleware.search.schema import SEARCH_TOOL_NAME
from keeper_middleware.sessions.counters import Counters
from keeper_middleware.step.result import Pending
from keeper_middleware.tokens.counting import TokenCounter

log = logging.getLogger(__name__)

Request = tuple[list[BaseMessage], Mapping[str, Any]]
"""One model call of the conversation: the messages and the call kwargs."""


@dataclass(frozen=True, slots=True)
class NoteDialogue:
    """The note-taking conversation of one keeper: its configuration, counter, checks and
    question detector."""

    config: KeeperConfig
    tokens: TokenCounter
    checks: tuple[NoteCheck, ...]
    detector: QuestionDetector

    def request(self, pending: Pending, setup: ModelSetup) -> list[BaseMessage]:
        """The conversation up to the cut's boundary, with the note request appended."""
        assert pending.plan is not None
        if self.config.notes_mode == "rewrite":
            text = REWRITE_REQUEST_TEXT
        else:
            text = notes_request_text(0)
        convo = setup.render(pending.messages[: pending.plan.boundary])
        if self.config.notes_mode == "in_place" and pending.moved_entries:
            named = named_in(pending.moved_entries, self.noted_text(pending))
            room = self.config.budget - self.tokens.count_messages(
                [*convo, keeper_message(text, "notes_request")], setup.tool_schemas
            )
            block, pending.recalled = recall_block(
                [(key, pending.moved_entries[key]) for key in named],
                room=max(0, min(room - 16, self.config.notes_tokens)),
                count_text=self.tokens.count_text,
            )
            if block:
                text = f"{text}\n{block}"
        return [*convo, keeper_message(text, "notes_request")]

    def named_names(self, noted_text: str) -> set[str]:
        """The tracked names ``noted_text`` gives, case folded: the ones the checks ask the
        archive about (``Pending.archived_keys``)."""
        pattern = compile_names(self.config.tracked_names)
        if pattern is None:
            return set()
        return {match.group().casefold() for match in pattern.finditer(noted_text)}

    def noted_text(self, pending: Pending) -> str:
        """The text of the turns being noted: question sets change nothing, and search results
        are copies of what is already noted, so neither may demand (or supply) a note; the
        pinned task is in view in every request, so it is a source notes may quote too."""
        assert pending.plan is not None
        sources = [*range(pending.plan.layout.head_end), *pending.plan.noted]
        return "\n".join(
            entry.text
            for entry in (pending.entries[i] for i in sources)
            if entry.kind is None
            and not entry.is_system
            and not entry.question
            and not (entry.is_tool_result and entry.message.name == SEARCH_TOOL_NAME)
        )

    def take(self, pending: Pending, counters: Counters, call: NoteCall) -> NoteOutcome | Notes:
        """Run the conversation with a sync model call."""
        dialogue = self.dialogue(pending, counters)
        try:
            request = next(dialogue)
            while True:
                request = dialogue.send(call(*request))
        except StopIteration as done:
            result: NoteOutcome | Notes = done.value
            return result

    async def atake(
        self, pending: Pending, counters: Counters, call: AsyncNoteCall
    ) -> NoteOutcome | Notes:
        """Run the conversation with an async model call."""
        dialogue = self.dialogue(pending, counters)
        try:
            request = next(dialogue)
            while True:
                request = dialogue.send(await call(*request))
        except StopIteration as done:
            result: NoteOutcome | Notes = done.value
            return result

    def dialogue(
        self, pending: Pending, counters: Counters
    ) -> Generator[Request, AIMessage, NoteOutcome | Notes]:
        """The note-taking conversation, as a generator of model requests.

        The sync and async steps pump the same generator; only the model call differs.
        """
        assert pending.plan is not None
        counters.note_requests += 1
        convo = list(pending.request)
        thinking_on = call_kwargs(self.config.thinking, thinking=True)
        if self.config.notes_mode == "rewrite":
            return (yield from self._rewrite(pending, counters, convo, thinking_on))
        recalled_keys = {key for key, _ in pending.recalled}
        taking = NoteTaking(
            notes=with_recalled(pending.notes, pending.recalled),
            noted_text=self.noted_text(pending),
            checks=self.checks,
            max_reasks=self.config.max_reasks,
            tracked_names=self.config.tracked_names,
            instruction_text=self.instruction_text(pending),
            max_rules=self.config.max_rules,
            archived_keys=pending.archived_keys.without(recalled_keys),
        )
        step: Ask | Done = taking.first_step()
        last_text = ""
        while isinstance(step, Ask):
            if step.text is not None:
                with_reply = [*convo, AIMessage(content=last_text)]
                text = self.fit_reask(step.text, with_reply, pending.tool_schemas)
                if text is not None:
                    convo = with_reply
                else:
                    # a reply too long to send back beside the re-ask is left out of it: the
                    # model writes its lines again from the turns (giving up here kept no
                    # line of a reply that had none, and lost the rule the turns stated)
                    text = self.fit_reask(_without_reply(step.text), convo, pending.tool_schemas)
                    log.info(
                        "reask session=%s: without the reply, which is too long", pending.session
                    )
                if text is None:
                    log.info("reask skipped session=%s: it does not fit", pending.session)
                    step = taking.give_up()  # a re-ask that does not fit is not sent
                    break
                convo = [*convo, keeper_message(text, "notes_reask")]
                log.info("reask session=%s: %s", pending.session, _first_line(text))
            reply = yield from self._ask_once(counters, convo, thinking_on)
            last_text = text_of(reply)
            step = taking.receive(last_text)
        assert isinstance(step, Done)
        outcome = step.outcome
        stated = self.with_stated_rules(pending, outcome.notes)
        if stated is not outcome.notes:
            outcome = replace(outcome, notes=stated)
        if pending.recalled:
            touched = {c.key for c in outcome.changes if isinstance(c, SetLine | UnsetLine)}
            settled = settle_recalled(pending.notes, outcome.notes, pending.recalled, touched)
            outcome = replace(outcome, notes=settled)
            pending.recalled = tuple(e for e in pending.recalled if e[0] in touched)
        counters.reasks += outcome.reasks
        counters.garbage_note_lines += outcome.garbage_lines
        counters.dropped_note_lines += len(outcome.dropped)
        if not outcome.usable:
            counters.empty_note_replies += 1
        if not outcome.usable or outcome.dropped:
            log.warning(
                "notes refused session=%s usable=%s dropped_lines=%d reasks=%d",
                pending.session,
                outcome.usable,
                len(outcome.dropped),
                outcome.reasks,
            )
        return outcome

    def fit_reask(
        self, text: str, convo: Sequence[BaseMessage], schemas: list[dict[str, Any]]
    ) -> str | None:
        """The re-ask, shortened to its first lines when all of them do not fit after
        ``convo``; None when not even the header and one questioned line fit."""
        room = self.config.budget - self.tokens.count_messages(convo, schemas)
        lines = text.split("\n")

        def cost(kept: int) -> int:
            shown = "\n".join(lines[:kept])
            return self.tokens.count_messages([keeper_message(shown, "notes_reask")])

        if cost(len(lines)) <= room:
            return text
        low, high = 0, len(lines)
        while low < high:
            middle = (low + high + 1) // 2
            if cost(middle) + 16 <= room:
                low = middle
            else:
                high = middle - 1
        if low < 2:
            return None
        return "\n".join([*lines[:low], f"(and {len(lines) - low} more lines like these)"])

    def instruction_text(self, pending: Pending) -> str:
        """What the user and the system prompt said in the request: the only text a RULE may
        quote. Inputs delivered by an item tool are the user's inputs; other tool results and
        model replies never count."""
        assert pending.plan is not None
        sources = [*range(pending.plan.layout.head_end), *pending.plan.noted]
        # the request as rendered carries the system prompt even when the messages do not
        texts = [text_of(m) for m in pending.request if isinstance(m, SystemMessage)]
        for entry in (pending.entries[i] for i in sources):
            if entry.kind is not None or entry.is_system or isinstance(entry.message, AIMessage):
                continue
            if entry.is_tool_result and entry.message.name not in self.config.item_tools:
                continue
            texts.append(entry.text)
        return "\n".join(texts)

    def stated_text(self, pending: Pending) -> list[str]:
        """What the users (and system messages) said in the turns being noted, as the texts
        a standing rule is read from: not the pinned task, in view in every request, and not
        question sets, which change nothing."""
        assert pending.plan is not None
        texts = []
        for entry in (pending.entries[i] for i in pending.plan.noted):
            if entry.kind is not None or entry.question or isinstance(entry.message, AIMessage):
                continue
            if entry.is_tool_result and entry.message.name not in self.config.item_tools:
                continue
            texts.append(entry.text)
        return texts

    def with_stated_rules(self, pending: Pending, notes: Notes) -> Notes:
        """``notes`` with the standing rules the noted turns state that they lack, word for
        word, whatever the note-taker wrote (:mod:`~keeper_middleware.notes.standing`)."""
        stated = with_stated_rules(notes, self.stated_text(pending), self.config.max_rules)
        if stated is not notes:
            log.info(
                "rules carried session=%s: %d stated by the user, not written by the note-taker",
                pending.session,
                len(stated.rules) - len(notes.rules),
            )
        return stated

    def _rewrite(
        self,
        pending: Pending,
        counters: Counters,
        convo: list[BaseMessage],
        kwargs: Mapping[str, Any],
    ) -> Generator[Request, AIMessage, Notes]:
        """The earlier form: the model rewrites the whole NOTES; rules are restored after."""
        for attempt in range(self.config.max_reasks + 1):
            reply = yield from self._ask_once(counters, convo, kwargs)
            rewritten = parse_rewrite(text_of(reply))
            if rewritten is not None:
                merged, _repairs = merge_rewrite(
                    pending.notes,
                    rewritten,
                    accept=_instruction_from(self.instruction_text(pending)),
                    max_rules=self.config.max_rules,
                )
                return self.with_stated_rules(pending, merged)
            if attempt < self.config.max_reasks:
                counters.reasks += 1
                convo = [
                    *convo,
                    AIMessage(content=text_of(reply)),
                    keeper_message(
                        "[NOTES CHECK] Your reply had no NOTES block. Write the complete NOTES "
                        "with the sections RULES, STATE and OPEN, one '- ' line per entry.",
                        "notes_reask",
                    ),
                ]
        counters.empty_note_replies += 1
        return self.with_stated_rules(pending, pending.notes)

    def _ask_once(
        self, counters: Counters, convo: list[BaseMessage], kwargs: Mapping[str, Any]
    ) -> Generator[Request, AIMessage, AIMessage]:
        """One note call; a reply that thought to its limit is asked again without thinking."""
        reply = yield (convo, kwargs)
        counters.notes_calls += 1
        counters.add_usage(reply, management=True)
        policy = self.config.thinking
        if thought_to_limit(reply) and policy.retry_empty_without_thinking:
            counters.thinking_retries += 1
            again = differing(call_kwargs(policy, thinking=False), kwargs, policy)
            reply = yield (convo, again)
            counters.notes_calls += 1
            counters.add_usage(reply, management=True)
        return strip_reasoning(reply)


REPLY_LEFT_OUT = (
    "(Your last reply is not shown again: it was too long to fit beside this request. "
    "Write your change lines again from the turns above.)"
)


def _without_reply(reask: str) -> str:
    """A re-ask that stands without the reply it questions (which is not sent back)."""
    header, _, rest = reask.partition("\n")
    return "\n".join(part for part in (header, REPLY_LEFT_OUT, rest) if part)


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else ""


def _instruction_from(source: str) -> Callable[[str], bool]:
    """Whether a rule is an instruction quoted from ``source`` (what the user and system said)."""
    return lambda rule: looks_like_instruction(rule) and quoted_in(rule, source)
