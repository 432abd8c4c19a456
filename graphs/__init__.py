"""Prebuilt LangGraph graphs, one per way of managing context (an "arm"), with one interface."""
