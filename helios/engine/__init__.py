"""Engines ("cores") that execute prepared graphs, and the runtime loop that drives them."""
