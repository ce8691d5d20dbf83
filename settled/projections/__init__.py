"""settled.projections."""
