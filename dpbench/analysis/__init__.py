"""Analyses over finished runs (results.json records)."""
