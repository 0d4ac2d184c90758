"""The ``joch`` command: a kubectl-like client of the Joch HTTP API.

The CLI is a pure HTTP client (``client``) of a running ``joch server``: it resolves kind names
through the server's discovery (``resolve``), prints what the server returns (``printers``,
``describe``) and never touches the store. The one exception is ``joch server`` itself, which
imports ``joch.server`` lazily so every other command starts without loading the web stack.
"""
