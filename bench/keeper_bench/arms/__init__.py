"""The benchmark's comparison arms."""
