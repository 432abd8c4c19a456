"""OpenAI Responses (``POST /v1/responses``): its requests read into the conversation form, its
replies written from it (pure).
"""
