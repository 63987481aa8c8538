"""The shared DP training loop and what it needs around it."""
