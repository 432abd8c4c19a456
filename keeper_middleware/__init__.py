"""keeper-middleware: keeps long-running agents working far past their context window.

The keeper archives the oldest turns word for word, keeps a small checked NOTES block (RULES /
STATE / OPEN) updated in place, gives the model a search tool over the archive, and repeats the
RULES wherever new questions arrive.
"""

from keeper_middleware.agent import create_keeper_agent
from keeper_middleware.archive.records import ArchivedTurn, NotesVersion
from keeper_middleware.archive.sqlite import SQLiteArchive
from keeper_middleware.archive.store import ArchiveStore
from keeper_middleware.config import KeeperConfig, ThinkingPolicy
from keeper_middleware.errors import (
    ArchiveError,
    ArgumentTypeError,
    ConfigurationError,
    InvalidStateError,
    KeeperError,
    MalformedDataError,
    MissingDependencyError,
    ToolsNotSupportedError,
    UnknownSessionError,
    WindowTooSmallError,
)
from keeper_middleware.keeper import Keeper, ModelSetup, StepResult
from keeper_middleware.messages.facts import is_keeper_message
from keeper_middleware.node import KeeperGraphState, KeeperNode, keeper_node
from keeper_middleware.notes.block import Notes, parse_notes, render_notes
from keeper_middleware.notes.checks import CheckContext, Issue, NoteCheck, default_checks
from keeper_middleware.reinjection.questions import PatternQuestionDetector, QuestionDetector
from keeper_middleware.retrievers.base import Hit, Passage, Retriever
from keeper_middleware.search.tool import archive_search_tool
from keeper_middleware.sessions.counters import Counters
from keeper_middleware.startup import collect_young_less_often, freeze_startup_objects
from keeper_middleware.tokens.counting import ApproximateTokenCounter, TokenCounter

__all__ = [
    "ApproximateTokenCounter",
    "ArchiveError",
    "ArchiveStore",
    "ArchivedTurn",
    "ArgumentTypeError",
    "CheckContext",
    "ConfigurationError",
    "Counters",
    "Hit",
    "InvalidStateError",
    "Issue",
    "Keeper",
    "KeeperConfig",
    "KeeperError",
    "KeeperGraphState",
    "KeeperNode",
    "MalformedDataError",
    "MissingDependencyError",
    "ModelSetup",
    "NoteCheck",
    "Notes",
    "NotesVersion",
    "Passage",
    "PatternQuestionDetector",
    "QuestionDetector",
    "Retriever",
    "SQLiteArchive",
    "StepResult",
    "ThinkingPolicy",
    "TokenCounter",
    "ToolsNotSupportedError",
    "UnknownSessionError",
    "WindowTooSmallError",
    "archive_search_tool",
    "collect_young_less_often",
    "create_keeper_agent",
    "default_checks",
    "freeze_startup_objects",
    "is_keeper_message",
    "keeper_node",
    "parse_notes",
    "render_notes",
]
