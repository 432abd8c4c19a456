"""The hybrid's reply window as a benchmark option: ``noreplies`` turns it off,
``replies=W/L/N`` sets it (``retrievers/reply_window.py``: W passages before a passage lift it
by L × their fused scores, the first N fused hits keep their places). Measured in
``bench/results/locomo_recall_round14.md``.
"""

from __future__ import annotations

from keeper_middleware.errors import ConfigurationError
from keeper_middleware.retrievers.reply_window import DEFAULT_REPLY_WINDOW, ReplyWindow


def parse_replies(option: str) -> ReplyWindow | None:
    """``noreplies`` (None), ``replies`` (the product's default) or ``replies=W/L/N``.

    Raises:
        ConfigurationError: ``replies=`` not followed by three numbers W/L/N.
    """
    if option == "noreplies":
        return None
    _, _, setting = option.partition("=")
    if not setting:
        return DEFAULT_REPLY_WINDOW
    parts = setting.split("/")
    if len(parts) != 3:
        raise ConfigurationError(f"replies takes W/L/N (e.g. replies=2/0.5/3), got {option!r}.")
    try:
        return ReplyWindow(window=int(parts[0]), weight=float(parts[1]), keep=int(parts[2]))
    except ValueError as error:
        raise ConfigurationError(f"replies takes W/L/N numbers, got {option!r}.") from error


def describe_replies(option: str | None) -> str:
    """The reply window a method runs with, in words."""
    rule = DEFAULT_REPLY_WINDOW if option is None else parse_replies(option)
    if rule is None:
        return "no reply window"
    return (
        f"reply window: {rule.window} passage(s) before lift by {rule.weight:g} × their fused "
        f"scores, the first {rule.keep} fused hits kept"
    )
