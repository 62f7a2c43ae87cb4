"""The simulator: real-data workloads, calibrated cost models, acceptance curves (see docs/cost-models.md)."""
