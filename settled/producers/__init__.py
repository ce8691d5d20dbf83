"""settled.producers."""
