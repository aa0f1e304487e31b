"""The few Kubernetes API calls the key hooks make, with the pod's service account.

Plain HTTPS (urllib): two verbs on Secrets and ConfigMaps do not justify a client library
in the image. Raises ``ApiError`` with the API's status message.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from ..errors import RunFailed

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class ApiError(RunFailed):
    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class Api:
    def __init__(self, namespace: str):
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise SystemExit("torbed.pods.api: not running in a pod (KUBERNETES_SERVICE_HOST is not set)")
        self.base = f"https://{host}:{port}/api/v1/namespaces/{namespace}"
        self.token = (SA_DIR / "token").read_text().strip()
        self.ctx = ssl.create_default_context(cafile=str(SA_DIR / "ca.crt"))

    def _call(self, method: str, path: str, body: dict | None = None, query: dict | None = None,
              content_type: str = "application/json") -> dict:
        url = self.base + path + (("?" + urllib.parse.urlencode(query)) if query else "")
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": content_type,
            "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=30) as r:
                return json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            try:
                msg = json.loads(e.read()).get("message", e.reason)
            except ValueError:
                msg = e.reason
            raise ApiError(e.code, f"{method} {path}: {msg}") from None

    def list(self, kind: str, selector: str) -> list[dict]:
        return self._call("GET", f"/{kind}", query={"labelSelector": selector}).get("items") or []

    def get(self, kind: str, name: str) -> dict | None:
        """The object, or None when there is none (404)."""
        try:
            return self._call("GET", f"/{kind}/{name}")
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def patch(self, kind: str, name: str, patch: dict) -> dict:
        """A JSON merge patch."""
        url_kind = f"/{kind}/{name}"
        return self._call("PATCH", url_kind, patch, content_type="application/merge-patch+json")

    def create(self, kind: str, obj: dict) -> dict:
        return self._call("POST", f"/{kind}", obj)

    def delete(self, kind: str, name: str) -> None:
        try:
            self._call("DELETE", f"/{kind}/{name}")
        except ApiError as e:
            if e.status != 404:
                raise

    def delete_collection(self, kind: str, selector: str) -> None:
        self._call("DELETE", f"/{kind}", query={"labelSelector": selector})
