"""dpbench."""
