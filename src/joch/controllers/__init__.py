"""Controllers: the manager (informers, work queues, backoff, leader election) and one module per
controller (agents, runs, approvals). See ``base`` for what a controller is."""
