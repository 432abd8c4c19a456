"""What the archive search tool publishes: its name, what it says it does, its JSON schema.

The LangChain tool (:func:`~keeper_middleware.search.tool.archive_search_tool`) and the proxy
(which adds the tool to an agent's request) publish these same three, so a model sees one tool
whichever way the keeper is run; the arguments it sends are read by
:func:`~keeper_middleware.search.args.parse_search_args`.
"""

from __future__ import annotations

from typing import Any

SEARCH_TOOL_NAME = "search_archive"
SEARCH_TOOL_DESCRIPTION = (
    "Search the archive of earlier turns that are no longer in view (word for word). "
    "Give a few keywords, e.g. a name. Optional from_item / to_item (inclusive) limit the search "
    "to a range of items, in the items' own numbers. Each match is shown with the sentence that "
    "follows it. A message shown as an excerpt names its reference: read=REF with page=N reads "
    "it whole, page by page."
)

SEARCH_TOOL_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "description": "A few keywords, e.g. a name."},
        "from_item": {"type": "integer", "description": "First item to search (optional)."},
        "to_item": {"type": "integer", "description": "Last item to search (optional)."},
        "read": {
            "type": "string",
            "description": (
                "Instead of searching: the reference of an archived message shown in view as an "
                "excerpt, to read it whole, page by page."
            ),
        },
        "page": {"type": "integer", "description": "The page to read (1 first; with read)."},
    },
    "required": [],
}
"""The tool's parameters as an OpenAI-style JSON schema (the same in every entry point)."""
