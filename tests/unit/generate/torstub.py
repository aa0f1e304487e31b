"""Realistic CollecTor-style input for torbed generate, made with stem's ``create()``.

``write_network(dir, n=300, seed=0)`` writes ``consensus`` (a network-status consensus, ns
flavor, with CollecTor's ``@type`` annotation) and ``server-descriptors/`` (one file per
relay, some relays with two descriptors) and returns a ``Network`` with the relays as
written. The spread follows the real network's shape: consensus weights log-normal
(a few heavy relays carry most weight), about 40 % guards, 12 % exits, 8 % guard+exit, the
rest middles, a few relays without Fast, Running or Valid, a BadExit, advertised bandwidths
near the weights with noise. No third-party data: everything is drawn from the seed (the RSA keys are fresh, so
fingerprints differ between calls; the rest does not).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import random
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from stem.descriptor.networkstatus import NetworkStatusDocumentV3
from stem.descriptor.router_status_entry import RouterStatusEntryV3
from stem.descriptor.server_descriptor import RelayDescriptor

VALID_AFTER = "2024-03-01 12:00:00"
PUBLISHED = "2024-03-01 10:00:00"
PUBLISHED_OLD = "2024-02-28 22:00:00"


@dataclass
class StubRelay:
    nickname: str
    fingerprint: str
    flags: list[str]
    weight: int
    descriptors: list[tuple[int, int, int]] = field(default_factory=list)   # (rate, burst, observed)
    key: tuple = field(default=(), repr=False)                              # (private key, PEM)

    @property
    def position(self) -> str:
        exit_ = "Exit" in self.flags and "BadExit" not in self.flags
        guard = "Guard" in self.flags
        return "guardexit" if guard and exit_ else "guard" if guard else "exit" if exit_ else "middle"

    @property
    def capacity(self) -> int:
        return max(min(d) for d in self.descriptors)


@dataclass
class Network:
    consensus: Path
    descriptors: Path
    relays: list[StubRelay]


def _b64(hexstr: str) -> str:
    return base64.b64encode(binascii.unhexlify(hexstr)).decode().rstrip("=")


def make_relays(n: int, seed: int) -> list[StubRelay]:
    rng = random.Random(seed)
    relays = []
    for i in range(n):
        u = rng.random()
        flags = ["Fast", "Running", "Stable", "V2Dir", "Valid"]
        if u < 0.40:
            flags.append("Guard")
        elif u < 0.52:
            flags.append("Exit")
        elif u < 0.60:
            flags += ["Guard", "Exit"]
        if i % 50 == 7:
            flags.remove("Fast")
        if i % 97 == 11:
            flags.remove("Running")
        if i % 61 == 5:
            flags.remove("Stable")
        if i == 13 and "Exit" in flags:
            flags.append("BadExit")
        weight = max(1, int(rng.lognormvariate(8.5, 1.4)))             # kB/s-ish, median ~5000
        obs = int(weight * 1000 * rng.uniform(0.7, 1.5))
        descs = [(max(obs * 2, 1 << 20), max(obs * 3, 1 << 21), obs)]
        if i % 5 == 0:                                                   # an older descriptor too
            descs.append((descs[0][0], descs[0][1], int(obs * rng.uniform(0.5, 1.2))))
        key, pem, fp = new_identity()
        relays.append(StubRelay(nickname=f"stub{i}", fingerprint=fp, flags=sorted(flags), weight=weight,
                                descriptors=descs, key=(key, pem)))
    return relays


def new_identity() -> tuple[object, str, str]:
    """An RSA-1024 identity key: (private key, PEM of the public key as a descriptor's
    signing-key, fingerprint = SHA-1 of its DER)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    pub = key.public_key()
    der = pub.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.PKCS1)
    pem = pub.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.PKCS1).decode().strip()
    return key, pem, hashlib.sha1(der).hexdigest().upper()


def _sign(key, digest: bytes) -> str:
    """tor's signature: PKCS#1 v1.5 type-1 padding of the bare digest (no DigestInfo), raw RSA.
    (stem 1.8's own signing does not work with today's cryptography.)"""
    nums = key.private_numbers()
    size = (key.key_size + 7) // 8
    block = b"\x00\x01" + b"\xff" * (size - 3 - len(digest)) + b"\x00" + digest
    sig = pow(int.from_bytes(block, "big"), nums.d, nums.public_numbers.n).to_bytes(size, "big")
    b64 = base64.b64encode(sig).decode()
    return "-----BEGIN SIGNATURE-----\n" + "\n".join(b64[i:i + 64] for i in range(0, len(b64), 64)) + \
        "\n-----END SIGNATURE-----\n"


def descriptor_text(r: StubRelay, i: int, bw: tuple[int, int, int], published: str) -> tuple[str, str]:
    """A signed server descriptor (text, digest in hex) that stem parses with validation."""
    key, pem = r.key
    spaced = " ".join(r.fingerprint[j:j + 4] for j in range(0, 40, 4))
    body = RelayDescriptor.content({
        "router": f"{r.nickname} 10.{i // 250}.{i % 250}.1 9001 0 0",
        "fingerprint": spaced,
        "published": published,
        "bandwidth": " ".join(map(str, bw)),
        "signing-key": "\n" + pem,
    }).decode()
    signed_part = body[:body.index("router-signature\n") + len("router-signature\n")]
    digest = hashlib.sha1(signed_part.encode()).digest()
    return signed_part + _sign(key, digest), digest.hex().upper()


def write_network(dest: Path, n: int = 300, seed: int = 0, relays: list[StubRelay] | None = None) -> Network:
    dest.mkdir(parents=True, exist_ok=True)
    relays = relays if relays is not None else make_relays(n, seed)
    ddir = dest / "server-descriptors"
    ddir.mkdir(exist_ok=True)
    entries = []
    for i, r in enumerate(relays):
        texts = []
        current = None
        for k, bw in enumerate(r.descriptors):
            text, digest = descriptor_text(r, i, bw, PUBLISHED if k == 0 else PUBLISHED_OLD)
            current = current or digest
            texts.append("@type server-descriptor 1.0\n" + text)
        (ddir / f"{r.fingerprint.lower()}").write_text("".join(texts))
        entries.append(RouterStatusEntryV3.create({
            "r": f"{r.nickname} {_b64(r.fingerprint)} {_b64(current)} {PUBLISHED} "
                 f"10.{i // 250}.{i % 250}.1 9001 0",
            "s": " ".join(r.flags),
            "w": f"Bandwidth={r.weight}",
        }))
    doc = NetworkStatusDocumentV3.create({"valid-after": VALID_AFTER, "fresh-until": "2024-03-01 13:00:00",
                                          "valid-until": "2024-03-01 15:00:00"}, routers=entries)
    cons = dest / "consensus"
    cons.write_text("@type network-status-consensus-3 1.0\n" + str(doc))
    return Network(consensus=cons, descriptors=ddir, relays=relays)
