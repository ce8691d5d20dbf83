"""settled.schemas."""
