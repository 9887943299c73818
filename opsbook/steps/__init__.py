"""One stage's work on one host: host facts, the download check, the config patch, the launch
script, starting and stopping the server, its triage, the Ray cluster, and the plots."""
