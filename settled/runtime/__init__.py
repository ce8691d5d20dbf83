"""settled.runtime."""
