"""Parking a session's llama.cpp slot (its KV cache) in a file between requests, and restoring it."""
