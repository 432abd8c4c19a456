"""One keeper step: taking new messages in, sizing the window, deciding what a cut notes,
archives and keeps, and committing it.
"""
