"""Sinks that subscribe to the loop's events: results store, W&B, progress bar."""
