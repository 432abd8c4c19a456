"""The public surface is pinned: a name added or removed here is a deliberate API change."""

import inspect

import keeper_middleware

EXPECTED = {
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
}


def test_public_names_are_exactly_the_documented_ones():
    assert set(keeper_middleware.__all__) == EXPECTED


def test_every_public_name_is_ours_callable_and_documented():
    """A public name is defined in this package (not a third party's re-exported), is a class or
    a function, and says in its docstring why it exists."""
    for name in keeper_middleware.__all__:
        member = getattr(keeper_middleware, name)
        assert member.__name__ == name, f"{name} is an alias of {member.__name__}"
        assert member.__module__.startswith("keeper_middleware."), name
        assert inspect.isclass(member) or inspect.isfunction(member), name
        assert len(inspect.getdoc(member) or "") >= 20, f"{name} has no docstring"


def test_a_star_import_gives_exactly_the_public_names():
    namespace: dict[str, object] = {}
    exec("from keeper_middleware import *", namespace)
    assert {k for k in namespace if not k.startswith("__")} == EXPECTED


# The archive and search packages keep the names their modules had before they became packages:
# ``from keeper_middleware.archive import ArchiveStore`` and the like are in users' code.
ARCHIVE_NAMES = {
    "ROLES",
    "SCHEMA_VERSION",
    "ArchiveError",
    "ArchiveSchemaError",
    "ArchiveStore",
    "ArchivedTurn",
    "CutRecord",
    "MovedUpdate",
    "NotesDraft",
    "NotesVersion",
    "open_archive",
    "put_values",
    "turn_from_message",
}
SEARCH_NAMES = {
    "PASSAGE_CHARS",
    "QUERY_ECHO_CHARS",
    "SEARCH_TOOL_DESCRIPTION",
    "SEARCH_TOOL_NAME",
    "SEARCH_TOOL_PARAMETERS",
    "STOP_LINE",
    "GuardDecision",
    "GuardState",
    "ReadArgs",
    "Refusal",
    "SearchArgs",
    "SearchCommand",
    "Verdict",
    "after_new_input",
    "decide",
    "parse_search_args",
    "render_results",
}


def test_the_archive_and_search_packages_keep_their_modules_names():
    import keeper_middleware.archive as archive
    import keeper_middleware.search as search

    assert set(archive.__all__) == ARCHIVE_NAMES
    assert set(search.__all__) == SEARCH_NAMES
    for package, names in ((archive, ARCHIVE_NAMES), (search, SEARCH_NAMES)):
        for name in names:
            assert getattr(package, name) is not None, f"{package.__name__}.{name}"
