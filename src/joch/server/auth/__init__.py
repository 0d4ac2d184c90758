"""Authentication and authorization for the HTTP API.

* ``options``: the ``joch server`` flags (token file, OIDC) and the start-up refusal of an exposed
  server without an authenticator.
* ``tokenfile``, ``oidc``: the two authenticators.
* ``requests``: what a request asks to do (verb, group, resource, namespace, name).
* ``rbac``: the built-in roles and RoleBindings; ``authorize_documents`` for batch applies.
* ``middleware``: the ASGI middleware that puts them in front of every route (401, 403, audit).
* ``setup``: ``install`` wires them into an app.
* ``reviews``: ``/v1/whoami`` and the self-reviews ``kubectl auth whoami`` and ``can-i`` use.

``setup.install`` wires them into an app; ``app.state.authorizer`` is what routes that authorize
themselves (the batch apply, the access reviews) ask.
"""
