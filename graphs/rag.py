"""Retrieval alone (RAG): every input is stored as it arrives; questions get the best matches.

No notes, no pinned rules and no search tool: the model cannot reach the store (a measured build
whose model could reach the stored files answered with its own scripts instead). When a question
set arrives, the best-matching stored sentences for each question, each with the sentence that
follows it, are placed right after it. The window is otherwise managed like window-drop.

Measured: retrieval alone kept up with the keeper where a rule names what it covers, and answered
0 of 16 questions governed by a rule that names nothing ("any figure below zero is reported as
overdrawn"): nothing in "What value does X hold now?" leads a search back to such a rule.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Any, NotRequired

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Checkpointer

from keeper_middleware.errors import ConfigurationError
from keeper_middleware.graphs.baselines import (
    ArmState,
    ModelCall,
    RequestSize,
    WindowPolicy,
    assemble,
    drop_oldest,
    head_end,
    messages_update,
)
from keeper_middleware.keeper import ModelSetup, Tool
from keeper_middleware.messages.facts import keeper_message, text_of
from keeper_middleware.reinjection.additions import (
    merge_hits,
    question_queries,
    render_retrieved_block,
)
from keeper_middleware.reinjection.questions import PatternQuestionDetector, QuestionDetector
from keeper_middleware.retrievers.base import Hit, Retriever
from keeper_middleware.retrievers.passages import PASSAGE_UNITS, passages_of
from keeper_middleware.search.tool import session_of
from keeper_middleware.step.items import Counting, ItemNumbering
from keeper_middleware.tokens.counting import TokenCounter, resolve_token_counter

RAG_STATE_KEY = "rag"
DEFAULT_ITEM_PATTERN = r"^\s*(?:Item|Batch|Ticket)\s+#?(\d+)\b"
DEFAULT_QUESTION_PATTERNS = (r"\?\s*$", r"^\s*(?:Final )?[Qq]uestions\b")


class RagState(ArmState):
    """The messages, and the bookkeeping of what was stored (plain JSON, checkpoint-safe)."""

    rag: NotRequired[dict[str, Any]]


def fitting_hits(hits: Sequence[Hit], limit_tokens: int, counter: TokenCounter) -> list[Hit]:
    """The best hits (in the order given) whose rendered block stays within ``limit_tokens``."""
    shown: list[Hit] = []
    for hit in hits:
        if counter.count_text(render_retrieved_block([*shown, hit])) > limit_tokens:
            break
        shown.append(hit)
    return shown


class RetrieveNode:
    """Stores new inputs, shows retrieved sentences after new questions, then drops the oldest
    turns when the window is full."""

    def __init__(
        self,
        retriever: Retriever,
        size: RequestSize,
        *,
        policy: WindowPolicy,
        per_question: int,
        item_numbering: ItemNumbering,
        detector: QuestionDetector,
        retrieved_share: float = 0.5,
        passages: str = "sentences",
    ) -> None:
        self.retriever = retriever
        self.passages = passages
        self.size = size
        self.policy = policy
        self.per_question = per_question
        self.items = item_numbering
        self.detector = detector
        self.limit_tokens = int(policy.budget * retrieved_share)

    def __call__(self, state: RagState, config: RunnableConfig) -> dict[str, Any]:
        session = session_of(config)
        given = list(state["messages"])
        book: dict[str, Any] = json.loads(json.dumps(state.get(RAG_STATE_KEY) or {}))
        observed = self._observe(session, given, book)
        kept = drop_oldest(observed, head_end(observed, self.policy.pinned_head), self.size.fits)
        live = {str(m.id) for m in kept}
        book["seen"] = [i for i in book["seen"] if i in live]
        return {**messages_update(given, kept), RAG_STATE_KEY: book}

    async def acall(self, state: RagState, config: RunnableConfig) -> dict[str, Any]:
        return self(state, config)

    def _observe(
        self, session: str, messages: Sequence[BaseMessage], book: dict[str, Any]
    ) -> list[BaseMessage]:
        """Store every new input (a question set is not story and is not stored) and put the
        retrieved sentences right after each new question set."""
        seen = set(book.get("seen", []))
        counting = Counting.load(book)
        position = int(book.get("next_position", 0))
        result: list[BaseMessage] = []
        for message in messages:
            result.append(message)
            msg_id = str(message.id)
            if msg_id in seen:
                continue
            seen.add(msg_id)
            if not self.items.is_new_input(message):
                continue
            is_question = self.detector.is_question(message)
            self.items.take(counting, message, question=is_question)
            last_item = counting.last_item
            if is_question:
                block = self._retrieved(session, message)
                seen.add(str(block.id))
                result.append(block)
                continue
            passages = passages_of(self.passages, session, last_item, text_of(message), position)
            if passages:
                self.retriever.add(passages)
                position += len(passages)
        counting.save(book)
        book.update(seen=sorted(seen), next_position=position)
        return result

    def _retrieved(self, session: str, question: BaseMessage) -> BaseMessage:
        queries = question_queries(question)
        per_query = [
            self.retriever.search(query, session=session, k=self.per_question) for query in queries
        ]
        hits = merge_hits(per_query, self.per_question * max(1, len(queries)))
        shown = fitting_hits(hits, self.limit_tokens, self.size.counter)
        return keeper_message(
            render_retrieved_block(shown),
            "retrieved",
            msg_id=f"retrieved-{question.id or uuid.uuid4().hex}",
        )


def rag_graph(
    model: BaseChatModel,
    retriever: Retriever,
    *,
    policy: WindowPolicy,
    per_question: int = 20,
    tools: Sequence[Tool] = (),
    system_prompt: str | None = None,
    token_counter: TokenCounter | str | None = None,
    item_tools: Sequence[str] = (),
    item_pattern: str | None = DEFAULT_ITEM_PATTERN,
    question_patterns: Sequence[str] = DEFAULT_QUESTION_PATTERNS,
    checkpointer: Checkpointer = None,
    name: str = "rag",
    passages: str = "sentences",
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """Retrieval alone. ``tools`` are the agent's own; the store is never offered as one.

    ``item_tools`` names tools whose results are new inputs (stored like user messages);
    ``passages`` is what the store indexes as one passage ("sentences" or "messages").
    """
    if passages not in PASSAGE_UNITS:
        raise ConfigurationError(f"passages={passages!r}; use one of {', '.join(PASSAGE_UNITS)}")
    if per_question < 1:
        raise ConfigurationError(
            f"per_question={per_question}; show at least 1 sentence per question"
        )
    setup = ModelSetup(system_prompt=system_prompt, tools=tuple(tools))
    size = RequestSize(setup, resolve_token_counter(token_counter), policy.budget)
    node = RetrieveNode(
        retriever,
        size,
        policy=policy,
        per_question=per_question,
        item_numbering=ItemNumbering(item_pattern, item_tools),
        detector=PatternQuestionDetector(question_patterns),
        passages=passages,
    )
    return assemble(
        RagState,
        "retrieve",
        RunnableLambda(node.__call__, afunc=node.acall, name="retrieve"),
        ModelCall(model, setup),
        tools=tools,
        checkpointer=checkpointer,
        name=name,
    )
