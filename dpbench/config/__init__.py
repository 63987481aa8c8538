"""Typed settings (structured configs) and their validation."""
