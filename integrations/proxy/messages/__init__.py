"""Anthropic Messages (``POST /v1/messages``): its requests read into the conversation form, its
replies written from it (pure).
"""
