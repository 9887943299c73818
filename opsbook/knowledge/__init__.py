"""What opsbook knows about vLLM, as data with its sources: the facts of each release, the
compatibility rules, the failure catalogue and the log reader that applies it, and the lint of
hand-typed commands."""
