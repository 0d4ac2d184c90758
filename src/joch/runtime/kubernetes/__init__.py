"""The Kubernetes runtime: ``runtime`` (each run attempt a ``batch/v1`` Job running ``joch runner``),
``jobs`` (what that Job is), ``settings`` (``joch server --kube-*``). With ``store/kubernetes``, the
only place that imports lightkube; importing this package does not (``settings`` is read at every
start)."""
