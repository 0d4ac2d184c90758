"""Telemetry: Prometheus metrics, OpenTelemetry traces and structured logs.

The bottom layer beside ``joch.api``: every other layer may import it, and it imports nothing of Joch's
but ``joch.api``, so a store, a controller and a route can each record what they do.
"""
