"""The scripted chat model the tests use is the one the package ships for users' own tests
(``keeper_middleware.testing``): replies scripted per call, every request recorded."""

from __future__ import annotations

from keeper_middleware.testing import Received, Reply, ScriptedChatModel

__all__ = ["Received", "Reply", "ScriptedChatModel"]
