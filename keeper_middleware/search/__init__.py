"""The archive search tool: the one tool the keeper gives the model, over what left its view.

``schema`` is what the tool publishes (name, description, JSON schema), ``args`` how the model's
arguments are read (a bad one is refused, never raised), ``guards`` what ends a loop of searches,
``results`` what a search shows, ``searcher`` the tool's body (all of these applied to one
keeper's sessions) and ``tool`` the LangChain tool around it.

Only the pure modules are imported here: ``searcher`` and ``tool`` need the keeper (its sessions,
the keeper itself), and the keeper imports the guards from this package, so importing them here
is a cycle.
"""

from keeper_middleware.search.args import (
    ReadArgs,
    Refusal,
    SearchArgs,
    parse_search_args,
)
from keeper_middleware.search.guards import (
    STOP_LINE,
    GuardDecision,
    GuardState,
    SearchCommand,
    Verdict,
    after_new_input,
    decide,
)
from keeper_middleware.search.results import PASSAGE_CHARS, QUERY_ECHO_CHARS, render_results
from keeper_middleware.search.schema import (
    SEARCH_TOOL_DESCRIPTION,
    SEARCH_TOOL_NAME,
    SEARCH_TOOL_PARAMETERS,
)

__all__ = [
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
]
