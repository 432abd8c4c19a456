"""Retrieval backends behind one ``Retriever`` protocol."""

from keeper_middleware.retrievers.base import Hit, Passage, Retriever

__all__ = ["Hit", "Passage", "Retriever"]
