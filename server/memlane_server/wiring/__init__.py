"""Builders of the sidecar's parts, one module per concern. Each takes the settings sections it needs
(whole) and the parts already built, and returns what it built; ``app.py`` calls them in order, starts
the background jobs and stops everything. Nothing here starts a job or serves a call."""
