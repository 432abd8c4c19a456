"""What the keeper keeps per session besides its turns: counters, branches, locks."""
