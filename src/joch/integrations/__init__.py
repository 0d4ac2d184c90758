"""Talking to the trackers work comes from: GitHub (REST, through githubkit) and Linear (GraphQL),
webhook signatures, the normalised events, ``/joch run`` commands, cron schedules, and pushing a run's
patch as a branch. No store access here: controllers call these with what they read."""
