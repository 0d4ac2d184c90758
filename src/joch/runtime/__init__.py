"""Runtime adapters (``base`` is the contract; ``local`` runs processes in git worktrees) and
``joch runner``, the one execution wrapper every runtime starts around the agent.

Nothing here imports more than the standard library at module level: ``joch runner`` starts once
per run, and its start-up time is part of every run's dispatch latency."""
