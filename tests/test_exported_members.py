"""The public surface is pinned: a name added or removed here is a deliberate API change."""

import keeper_middleware

EXPECTED = {
    "ApproximateTokenCounter",
    "ArchiveError",
    "ArchiveStore",
    "ArchivedTurn",
    "CheckContext",
    "ConfigurationError",
    "Counters",
    "Hit",
    "Issue",
    "Keeper",
    "KeeperConfig",
    "KeeperError",
    "KeeperGraphState",
    "KeeperNode",
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
    "WindowTooSmallError",
    "archive_search_tool",
    "create_keeper_agent",
    "default_checks",
    "keeper_node",
    "parse_notes",
    "render_notes",
}


def test_public_names_are_exactly_the_documented_ones():
    assert set(keeper_middleware.__all__) == EXPECTED


def test_every_public_name_is_importable():
    for name in keeper_middleware.__all__:
        assert getattr(keeper_middleware, name) is not None
