"""Runners that train or sweep and then read: the reproductions and the overhead timer."""
