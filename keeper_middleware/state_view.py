"""Where the keeper's view of a conversation lives in a graph's state.

A keeper step turns the stored messages into the view the model is sent: the task, the NOTES,
the newest exchanges, the RULES beside a new question. Where that view is kept is the
``state_messages`` setting (:class:`~keeper_middleware.config.KeeperConfig`):

- ``"window"``: ``state["messages"]`` holds the view without the keeper's own messages (the
  history is cut down to the window, as the archive took the rest); the NOTES, RULES and
  retrieved passages live in the keeper's own state channel and are put back into what the model
  is sent, at the places they held. A chat UI streaming ``stream_mode="messages"`` or reading the
  thread's state never meets them.
- ``"all"``: ``state["messages"]`` keeps every message; the keeper's channel says which of them
  are in view, and holds the keeper's messages and any excerpt that stands in view for a
  message too big for it (like ``llm_input_messages`` of a pre-model hook).
- ``"window_with_keeper"``: the view itself is the state's messages, keeper messages included
  (marked: :func:`~keeper_middleware.is_keeper_message`).

In the first two, the keeper's channel holds the view as a list of entries, one per message in
view, in order: ``{"ref": id}`` for a message of the state taken as it is, ``{"ref": id, "msg":
...}`` for one that stands in view in another form (an excerpt), and ``{"msg": ...}`` for the
keeper's own. The view is rebuilt from the entries and the state's messages, and whatever the
state gained after the last message the entries name (new input, the reply, tool results) is
appended: the same list, byte for byte, that the keeper's step handed on, so the note calls and
work calls render as before and the server's prefix cache keeps hitting. The channel forks,
travels back and is replayed with the graph, so the view follows branches as the messages do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import BaseMessage, RemoveMessage, message_to_dict, messages_from_dict
from langgraph.graph.message import REMOVE_ALL_MESSAGES

from keeper_middleware.config import StateMessages
from keeper_middleware.messages.facts import keeper_kind
from keeper_middleware.step.result import StepResult

VIEW_KEY = "view"
"""Where the view's entries live in the keeper's state channel."""
KEEPER_STATE_KEY = "keeper"
_CHECKPOINTER = "__pregel_checkpointer"
"""Where LangGraph puts a run's checkpointer in its config (private there, so named here)."""
_NS_SEP = "|"
"""LangGraph's separator of nested checkpoint namespaces (a subgraph's task in a task)."""


def effective_mode(mode: StateMessages, config: Mapping[str, Any] | None) -> StateMessages:
    """``mode``, or ``"window_with_keeper"`` for a run whose keeper channel does not come back
    on the next run: a graph without a checkpointer (the caller hands back ``messages`` only),
    or a graph run as a subgraph node (its state starts afresh from the parent's on every call
    of the node). The keeper's messages then go where the next run finds them: the messages.

    Args:
        mode: the ``state_messages`` setting.
        config: the run's config (``RunnableConfig``).
    """
    if mode == "window_with_keeper":
        return mode
    configurable = (config or {}).get("configurable") or {}
    nested = _NS_SEP in str(configurable.get("checkpoint_ns") or "")  # a task of a task
    if configurable.get(_CHECKPOINTER) is None or nested:
        return "window_with_keeper"
    return mode


def engine_state(kstate: object) -> dict[str, Any] | None:
    """The keeper channel as the engine keeps it: without the view, which only adapters read."""
    if not isinstance(kstate, Mapping):
        return None
    return {k: v for k, v in kstate.items() if k != VIEW_KEY}


def model_view(messages: Sequence[BaseMessage], kstate: object) -> list[BaseMessage]:
    """What the keeper's step and the model see of a state: its messages as the view's entries
    name them, then what arrived after the last of them. A state without entries (the
    ``window_with_keeper`` setting, a thread from before them) is its messages as they are.

    Args:
        messages: ``state["messages"]``.
        kstate: the keeper's state channel (``state["keeper"]``).
    """
    entries = kstate.get(VIEW_KEY) if isinstance(kstate, Mapping) else None
    if not isinstance(entries, list):
        return list(messages)
    at = {m.id: i for i, m in enumerate(messages) if m.id}
    view: list[BaseMessage] = []
    last = -1
    for entry in entries:
        ref = entry.get("ref")
        if ref is not None:
            index = at.get(ref)
            if index is None:
                continue  # removed from the state since (a RemoveMessage): out of view too
            last = max(last, index)
            stored = entry.get("msg")
            view.append(messages[index] if stored is None else _message(stored))
        elif "msg" in entry:
            view.append(_message(entry["msg"]))
    view.extend(messages[last + 1 :])
    return view


def _message(stored: Mapping[str, Any]) -> BaseMessage:
    return messages_from_dict([dict(stored)])[0]


def _same(a: BaseMessage, b: BaseMessage) -> bool:
    return a is b or a == b


def view_update(
    stored: Sequence[BaseMessage],
    given: Sequence[BaseMessage],
    result: StepResult,
    mode: StateMessages,
) -> dict[str, Any]:
    """The graph update that keeps the step's view as ``mode`` says.

    Args:
        stored: the state's messages before the step.
        given: the view the step was given (:func:`model_view` of them).
        result: what the step handed back.
        mode: the ``state_messages`` setting.
    """
    if mode == "window_with_keeper":
        if list(given) != list(stored):
            # the thread kept its view in the channel until now: the state becomes the view
            return {
                KEEPER_STATE_KEY: result.state,
                "messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *result.messages],
            }
        return messages_update(given, result)
    view = result.messages
    if mode == "window":
        target = [m for m in view if keeper_kind(m) is None]
    else:
        # every message the state had stays; new ones of the view's own (a call the keeper
        # closed) are added; an excerpt stands in view only
        known = {m.id for m in stored}
        target = [*stored, *(m for m in view if keeper_kind(m) is None and m.id not in known)]
    by_id = {m.id: m for m in target}
    entries: list[dict[str, Any]] = []
    for message in view:
        if keeper_kind(message) is not None:
            entries.append({"msg": message_to_dict(message)})
        elif _same(by_id[message.id], message):
            entries.append({"ref": message.id})
        else:
            entries.append({"ref": message.id, "msg": message_to_dict(message)})
    update: dict[str, Any] = {KEEPER_STATE_KEY: {**result.state, VIEW_KEY: entries}}
    written = _written(stored, target)
    if written is not None:
        update["messages"] = written
    return update


def _written(stored: Sequence[BaseMessage], target: Sequence[BaseMessage]) -> list[Any] | None:
    """The messages update that turns ``stored`` into ``target``: none, the messages appended,
    or the whole list rewritten."""
    if len(target) >= len(stored) and all(
        _same(s, t) for s, t in zip(stored, target, strict=False)
    ):
        added = list(target[len(stored) :])
        return added or None
    return [RemoveMessage(id=REMOVE_ALL_MESSAGES), *target]


def messages_update(given: Sequence[BaseMessage], result: StepResult) -> dict[str, Any]:
    """The graph update of a step whose view is the state's messages: nothing, appended
    messages, or a rewritten history."""
    update: dict[str, Any] = {KEEPER_STATE_KEY: result.state}
    if result.rewritten:
        update["messages"] = [RemoveMessage(id=REMOVE_ALL_MESSAGES), *result.messages]
    elif result.changed:
        update["messages"] = result.messages[len(given) :]
    return update
