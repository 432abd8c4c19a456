"""Chat Completions (``POST /v1/chat/completions``): the upstream's completion read for the
keeper and passed on to the agent, and its server-sent chunks (pure).
"""
