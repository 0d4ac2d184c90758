"""Joch: a control plane for fleets of AI coding agents."""

__version__ = "0.1.0"
