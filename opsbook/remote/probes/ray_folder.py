"""Probe part: which processes name a Ray node's own temp folder (ray_cluster, ray_node).

Standard library only; joined into the probes that import it.
"""

from __future__ import annotations


def names_folder(cmd, folder):
    """Whether a command line names ``folder`` itself or a path in it (not a longer name that
    begins alike: the folder of node 127.0.0.1 is a prefix of node 127.0.0.10's)."""
    if not folder:
        return False
    return any(
        word == folder
        or word.startswith(folder + "/")
        or word.endswith("=" + folder)
        or ("=" + folder + "/") in word
        for word in cmd.split()
    )
