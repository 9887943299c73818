"""Running the runbook: notebooks with papermill (one stage or a whole deploy, on a shared
kernel), the run folder and its records, interactive sessions, the deploy lock, signals."""
