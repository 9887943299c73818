"""Everything that touches a machine: the SSH seam (:mod:`.hosts`), the one host protocol and
its shipped test doubles, the journal of remote commands, and the probes sent to a host's
python. Imports only :mod:`opsbook.core`."""
