"""How the keeper reaches and calls the chat model for itself."""
