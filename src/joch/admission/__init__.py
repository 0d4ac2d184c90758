"""Admission: everything between a manifest a user sent and the store.

``documents`` reads manifests (YAML streams, JSON, Lists, files, directories, stdin);
``validation.admit`` validates, defaults and checks the references of one object, reporting every
problem at its field path; ``apply`` writes batches atomically and offers the single-object writes
the HTTP server uses; ``merge`` is RFC 7386. ``diagnostics``, ``metadata`` and ``references`` are
the pieces ``admit`` is built from.

``policies`` is the policy preflight: Policies compiled when applied, admission rules evaluated on
every write (deny, warn).

Layering: admission imports ``joch.policy``, ``joch.store`` and ``joch.api`` (see tests/test_layers.py).
"""

from joch.admission.apply import ApplyItem as ApplyItem
from joch.admission.apply import ApplyResult as ApplyResult
from joch.admission.apply import apply_documents as apply_documents
from joch.admission.apply import create_documents as create_documents
from joch.admission.documents import Document as Document
from joch.admission.documents import load_documents as load_documents
from joch.admission.documents import load_paths as load_paths
from joch.admission.merge import merge_patch as merge_patch
from joch.admission.validation import AdmissionOptions as AdmissionOptions
from joch.admission.validation import Admitted as Admitted
from joch.admission.validation import admit as admit
from joch.admission.validation import validate_status as validate_status
