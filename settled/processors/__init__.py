"""settled.processors."""
