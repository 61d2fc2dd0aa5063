"""Builders of the sidecar's parts, one module per concern. Each takes the settings sections it needs
(whole) and the parts already built, and returns what it built; ``app.py`` calls them in order, registers
how each part is closed, and starts the background jobs once the sidecar serves (the access policy's
reload, ``access.start_policy``, is the one job started here)."""
