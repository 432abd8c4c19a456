"""Adapters that put the keeper in front of other things: an OpenAI-compatible proxy, LangChain
agent middleware, and local model server launchers."""
