"""Helios: prepared-graph scheduling by expected useful value per execution time."""

__version__ = "0.1.0"
