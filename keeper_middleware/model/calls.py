"""How the keeper gets a chat model and calls it for itself.

Models come as LangChain takes them: a chat model object, or an ``init_chat_model`` string such as
``"openai:gpt-4o"``. Tools are bound with a message that names ``search=False`` when the model
cannot take them, and a server that refuses a request because it carries tools gets the same.

The keeper's own calls (notes, re-asks, rewrites) are not the user's: a chat UI streaming with
``stream_mode="messages"`` or ``astream_events`` must not show a NOTES reply to the end user, and a
callback handler written for the agent's calls must not count them. So they run with callbacks of
their own: the tags ``nostream`` (LangGraph's ``TAG_NOSTREAM``, as LangChain's
``SummarizationMiddleware`` uses) and ``keeper``, a run name (``keeper_notes``), and only the
handlers that trace (LangSmith's tracer, any non-streaming ``BaseTracer``) or that ask for them by
setting ``sees_keeper_calls = True`` (the benchmark's call recorder does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler, BaseCallbackManager, CallbackManager
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.runnables import Runnable, RunnableConfig, ensure_config
from langchain_core.tracers.base import BaseTracer
from langgraph.constants import TAG_NOSTREAM

from keeper_middleware.errors import (
    ConfigurationError,
    MissingDependencyError,
    ToolsNotSupportedError,
)

KEEPER_TAG = "keeper"
NOTES_RUN_NAME = "keeper_notes"

_SEARCH_OFF = (
    "pass search=False to run the keeper without its archive search tool (and give no tools of "
    "your own), or use a chat model that supports tool calling"
)


def resolve_chat_model(model: BaseChatModel | str) -> BaseChatModel:
    """A chat model from what LangChain accepts: the object itself or an ``init_chat_model``
    string (``"openai:gpt-4o"``, ``"anthropic:claude-sonnet-4-5"``). An object that is not a
    ``BaseChatModel`` but binds tools like one (a wrapper) passes as it is."""
    if isinstance(model, BaseChatModel):
        return model
    if isinstance(model, str):
        try:
            from langchain.chat_models import init_chat_model
        except ImportError as exc:
            raise MissingDependencyError(
                "langchain", "langchain", needed_by=f"The model string {model!r}"
            ) from exc
        resolved = init_chat_model(model)
        if not isinstance(resolved, BaseChatModel):  # a configurable model: bind what it makes
            raise ConfigurationError(
                f"model={model!r} did not name one chat model; give 'provider:model', e.g. "
                "'openai:gpt-4o', or a chat model object"
            )
        return resolved
    if callable(getattr(model, "bind_tools", None)) or isinstance(model, Runnable):
        return model  # type: ignore[return-value]  # a wrapper that binds like a chat model
    raise ConfigurationError(
        f"model={model!r} is a {type(model).__name__}; give a LangChain chat model "
        "(e.g. ChatOpenAI(...)) or a string such as 'openai:gpt-4o'"
    )


def bind_tools_clearly(
    model: BaseChatModel, tools: Sequence[Any], **kwargs: Any
) -> Runnable[Any, BaseMessage]:
    """``model.bind_tools(tools)``; a model without tool support gets a message that says what
    to do. With no tools at all the model is used as it is."""
    if not tools:
        return model.bind(**kwargs) if kwargs else model
    try:
        return model.bind_tools(list(tools), **kwargs)
    except NotImplementedError as exc:
        raise ToolsNotSupportedError(
            f"{type(model).__name__} cannot bind tools (bind_tools is not implemented); "
            + _SEARCH_OFF
        ) from exc


def tool_refusal(error: BaseException, *, tools_sent: bool) -> ToolsNotSupportedError | None:
    """The clear error for a server that refused a request because it carried tools, if that is
    what ``error`` says (an HTTP 400/404/422/501 whose text mentions tools)."""
    if not tools_sent:
        return None
    status = getattr(error, "status_code", None) or getattr(
        getattr(error, "response", None), "status_code", None
    )
    text = str(error).lower()
    if status in (400, 404, 422, 501) and "tool" in text:
        return ToolsNotSupportedError(
            f"the model's server refused a request that carried tools ({error}); " + _SEARCH_OFF
        )
    return None


def internal_call_config(run_name: str = NOTES_RUN_NAME) -> RunnableConfig:
    """The config for one of the keeper's own model calls, made inside the current run.

    Only tracers and handlers that set ``sees_keeper_calls`` are kept, under the current run, so
    a trace shows the call (named ``run_name``) where it happened; streaming handlers
    (``stream_mode="messages"``, ``astream_events``) and the user's own handlers never see it.
    """
    parent = ensure_config()
    callbacks = parent.get("callbacks")
    parent_run_id = None
    handlers: list[BaseCallbackHandler]
    if isinstance(callbacks, BaseCallbackManager):
        handlers = list(callbacks.handlers)
        parent_run_id = callbacks.parent_run_id
    else:
        handlers = list(callbacks or [])
    kept = [h for h in handlers if _sees_internal_calls(h)]
    manager = CallbackManager(handlers=kept, inheritable_handlers=kept, parent_run_id=parent_run_id)
    return {
        "callbacks": manager,
        "tags": [TAG_NOSTREAM, KEEPER_TAG],
        "run_name": run_name,
        "metadata": dict(parent.get("metadata") or {}),
    }


def _sees_internal_calls(handler: BaseCallbackHandler) -> bool:
    if getattr(handler, "sees_keeper_calls", False):
        return True
    # stream_mode="messages", astream_events and astream_log all feed on this mixin
    streaming = any(c.__name__ == "_StreamingCallbackHandler" for c in type(handler).__mro__)
    return isinstance(handler, BaseTracer) and not streaming
