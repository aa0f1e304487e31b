"""Identity keys of the private network, made by tor's own tools.

Public API:

- ``make_authority_keys(datadir, address, dir_port, tor_gencert, months) -> AuthorityKeys``
  runs ``tor-gencert --create-identity-key`` into ``datadir/keys``; ``v3ident`` is the
  certificate's fingerprint, ``expires`` its ``dir-key-expires`` (UTC, ISO 8601).
- ``make_relay_identity(datadir, nickname, tor) -> str`` runs ``tor --list-fingerprint``,
  which creates the relay keys in ``datadir`` and returns the RSA identity fingerprint.
- ``node_keys(node, datadir, tor_gencert, tor, cache) -> (fingerprint, AuthorityKeys | None,
  "cached" | "generated")``: a node's keys from the per-scenario key cache or made afresh
- ``KeyGenerationError`` when a tool fails; the message has its output.

Keys are generated per run (never baked into images or committed).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from . import constants
from .errors import RunFailed


class KeyGenerationError(RunFailed):
    """tor-gencert or tor --list-fingerprint failed; the message carries its output."""


@dataclass(frozen=True)
class AuthorityKeys:
    v3ident: str         # fingerprint of the authority identity key (certificate)
    expires: str         # dir-key-expires of the signing key certificate, ISO 8601 UTC
    certificate: Path


def _run(cmd: list[str], stdin: str = "") -> str:
    try:
        proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise KeyGenerationError(f"{cmd[0]}: {e}") from e
    if proc.returncode != 0:
        raise KeyGenerationError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def read_certificate(cert: Path) -> AuthorityKeys:
    fields = {}
    for line in cert.read_text().splitlines():
        key, _, value = line.partition(" ")
        if key in ("fingerprint", "dir-key-expires"):
            fields[key] = value.strip()
    if "fingerprint" not in fields or "dir-key-expires" not in fields:
        raise KeyGenerationError(f"{cert}: no fingerprint/dir-key-expires line")
    expires = datetime.strptime(fields["dir-key-expires"], "%Y-%m-%d %H:%M:%S").isoformat() + "Z"
    return AuthorityKeys(v3ident=fields["fingerprint"], expires=expires, certificate=cert)


def make_authority_keys(datadir: Path, address: str | None, dir_port: int, tor_gencert: str = "tor-gencert",
                        months: int = constants.AUTHORITY_CERT_MONTHS) -> AuthorityKeys:
    """``address`` goes into the certificate's optional dir-address line; None leaves it out
    (on Kubernetes keys are made before the authority's Service has an address)."""
    keys = datadir / "keys"
    keys.mkdir(parents=True, exist_ok=True)
    cert = keys / "authority_certificate"
    addr = ["-a", f"{address}:{dir_port}"] if address else []
    _run([tor_gencert, "--create-identity-key", "-m", str(months), *addr,
          "-i", str(keys / "authority_identity_key"), "-s", str(keys / "authority_signing_key"),
          "-c", str(cert), "--passphrase-fd", "0"], stdin="\n")
    return read_certificate(cert)


def make_relay_identity(datadir: Path, nickname: str, tor: str = "tor") -> str:
    datadir.mkdir(parents=True, exist_ok=True)
    datadir.chmod(0o700)
    empty = datadir / "empty.torrc"
    empty.write_text("")
    _run([tor, "--list-fingerprint", "--defaults-torrc", str(empty), "-f", str(empty),
          "--DataDirectory", str(datadir), "--ORPort", str(constants.OR_PORT),
          "--Nickname", nickname, "--Log", "err stderr"])
    empty.unlink()
    name, _, fpr = (datadir / "fingerprint").read_text().strip().partition(" ")
    fpr = fpr.replace(" ", "")
    if name != nickname or len(fpr) != 40:
        raise KeyGenerationError(f"{datadir}/fingerprint: unexpected content {name!r} {fpr!r}")
    return fpr


KEY_FILES = ("keys", "fingerprint", "fingerprint-ed25519")


def node_keys(node, datadir: Path, tor_gencert: str, tor: str, cache: Path | None):
    """Identity keys of an authority or relay (a ``network.Node``): from the per-scenario
    key cache when present (same fingerprints run after run; certificates within 30 days
    of expiry are remade), else generated with tor's tools and stored in the cache.
    Returns (fingerprint, AuthorityKeys or None, "cached" | "generated")."""
    entry = cache / f"{node.name}-{node.address}" if cache else None
    if entry and (entry / "done").exists():
        try:
            auth = read_certificate(entry / "keys" / "authority_certificate") if node.role == "authority" else None
            fresh = auth is None or dt.datetime.fromisoformat(auth.expires.rstrip("Z")) > \
                dt.datetime.utcnow() + dt.timedelta(days=30)
            if fresh:
                _copy_key_files(entry, datadir, exist_ok=True)
                if auth:
                    auth = read_certificate(datadir / "keys" / "authority_certificate")
                fpr = (datadir / "fingerprint").read_text().split()[1]
                return fpr, auth, "cached"
        except (OSError, IndexError, ValueError, KeyGenerationError):
            pass  # a damaged cache entry is regenerated below
    auth = make_authority_keys(datadir, node.address, node.ports["dir"], tor_gencert) if node.role == "authority" else None
    fpr = make_relay_identity(datadir, node.nickname, tor)
    if entry:
        tmp = entry.with_name(entry.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        _copy_key_files(datadir, tmp, exist_ok=False)
        (tmp / "done").write_text("")
        shutil.rmtree(entry, ignore_errors=True)
        tmp.rename(entry)
    return fpr, auth, "generated"


def _copy_key_files(src_dir: Path, dst_dir: Path, exist_ok: bool) -> None:
    for f in KEY_FILES:
        src = src_dir / f
        if src.is_dir():
            shutil.copytree(src, dst_dir / f, dirs_exist_ok=exist_ok)
        elif src.exists():
            shutil.copy2(src, dst_dir / f)
