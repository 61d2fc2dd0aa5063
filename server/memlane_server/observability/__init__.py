"""Metrics, structured logs and the admin HTTP endpoint. Imports nothing from the domain."""
