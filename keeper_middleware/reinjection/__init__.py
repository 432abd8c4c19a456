"""Repeating the RULES where new questions and instructions arrive."""
