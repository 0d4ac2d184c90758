"""``python -m joch``: the ``joch`` command (``joch server --workers`` starts its workers this way)."""

from joch.cli.main import main

if __name__ == "__main__":
    main()
