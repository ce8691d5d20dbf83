"""settled.protocol."""
