"""Adapters between memlane and agent frameworks. Each lives in its own subpackage and needs its extra
(``pip install 'memlane[langgraph]'``); ``import memlane`` never imports a framework."""
