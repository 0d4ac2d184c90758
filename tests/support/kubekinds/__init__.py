"""Kubernetes kinds a stand-in cluster declares besides Joch's own (``support.kubecluster``): each
module here registers kinds into ``joch.api.registry`` when imported, in the cluster's process only
(never in the test process, whose registry the other tests share)."""
