"""The compiler: Agent + AgentProvider (+ what they reference) → a deterministic, content-hashed
``CompiledAgentManifest`` (``manifest``), and the sandboxed rendering of a provider's templates into
an invocation (``render``)."""
