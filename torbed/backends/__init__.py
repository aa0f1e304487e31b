"""Backends: where a scenario's network runs. The engine (``torbed.engine``) drives them.

Adding a backend: a module here with a class implementing ``torbed.engine.Backend``
(and ``from_args(args, console)`` to build it from ``torbed run``'s options), plus its row
in ``BACKENDS``. ``torbed run --backend NAME`` and ``torbed plan`` pick it up from there.

Public API: ``BACKENDS`` {name: "module:Class"}, ``backend_class(name) -> type``.
"""

from __future__ import annotations

import importlib

# Imported on use: the k8s backend needs the kubernetes client, the local one root tools.
BACKENDS = {
    "local": "torbed.backends.local.backend:LocalBackend",
    "k8s": "torbed.backends.k8s.backend:K8sBackend",
}


def backend_class(name: str) -> type:
    module, _, cls = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)
