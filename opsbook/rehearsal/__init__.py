"""The rehearsal hosts: a real sshd on loopback with a simulated GPU machine behind it, fleets
of them, the real-vLLM and Ray tiers, the synthetic checkpoint, and the simulator (``sim/``)."""
