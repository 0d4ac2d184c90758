"""Runtime adapters (``base`` is the contract; ``local`` runs processes in git worktrees;
``kubernetes`` runs a ``batch/v1`` Job per attempt; ``routing`` holds several and sends each run
where its ``runtime.type`` says) and ``joch runner``, the one execution wrapper every runtime starts
around the agent (``reports``: how a runner the server cannot read reports back).

Nothing here imports more than the standard library at module level: ``joch runner`` starts once
per run, and its start-up time is part of every run's dispatch latency."""
