"""The floor everything stands on: results and states, the exception tree, redaction, the
deployment schema, and the runner-kernel channel (every ``OPSBOOK_*`` name the two exchange).
Imports nothing of opsbook."""
