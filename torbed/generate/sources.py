"""Reading the user's CollecTor documents: one network-status consensus and server descriptors.

Public API:

- ``read_consensus(path) -> (list[ConsensusRelay], SourceDocument)``
- ``read_descriptors(paths) -> (dict[fingerprint, Descriptor], list[SourceDocument])``; a path
  is a file (one or many descriptors, CollecTor's ``@type server-descriptor`` annotation or
  none), a directory (searched recursively, as CollecTor's monthly tarballs unpack), or a
  ``.tar``/``.tar.xz`` archive
- ``join(relays, descriptors, consensus_path, descriptor_paths) -> list[Relay]``: the
  consensus' relays that have a descriptor, with their capacity
- ``from_consensus(relays) -> list[Relay]``: the documented fallback when no server
  descriptors can be had (``torbed generate --capacity-from-consensus``): capacity = the
  consensus weight read as kB/s (``w Bandwidth=``, 1000 bytes/s per unit)
- ``SourceError`` (an ``InputError``: exit 2) names the file and says what is wrong with it

Parsing is stem's (``stem.descriptor.parse_file``, ``validate=True``); nothing here downloads.
"""

from __future__ import annotations

import hashlib
import tarfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from ..provenance import file_sha256

CONSENSUS_TYPE = "network-status-consensus-3 1.0"
MICRODESC_CONSENSUS_TYPE = "network-status-microdesc-consensus-3 1.0"
DESCRIPTOR_TYPE = "server-descriptor 1.0"


class SourceError(InputError):
    """A source document that cannot be used; the message names the file."""


@dataclass(frozen=True)
class SourceDocument:
    """What the generated scenario records about one input file."""
    kind: str            # "consensus" | "server-descriptors"
    path: str
    sha256: str
    entries: int
    valid_after: str | None = None     # consensus: its valid-after time (UTC, ISO 8601)
    published: str | None = None       # descriptors: "<oldest> .. <newest>" published times


@dataclass(frozen=True)
class ConsensusRelay:
    fingerprint: str
    nickname: str
    flags: frozenset[str]
    weight: int                        # consensus weight ("w Bandwidth=", kB/s as voted)
    descriptor_digest: str | None      # ns flavor: the server descriptor's digest (hex, upper)


@dataclass(frozen=True)
class Descriptor:
    fingerprint: str
    nickname: str
    digest: str
    published: str
    average: int                       # bytes/s, "bandwidth" line: rate, burst, observed
    burst: int
    observed: int

    @property
    def advertised(self) -> int:
        """tor's advertised bandwidth: min(rate, burst, observed) (router.c), bytes/s."""
        return min(self.average, self.burst, self.observed)


@dataclass(frozen=True)
class Relay:
    """A consensus relay joined with its server descriptor."""
    fingerprint: str
    nickname: str
    flags: frozenset[str]
    weight: int
    capacity: int                      # bytes/s: the largest advertised bandwidth of its descriptors
    observed: int                      # bytes/s: the largest observed bandwidth of its descriptors

    @property
    def position(self) -> str:
        """Position class as in tornettools: guard, exit, guardexit or middle. A BadExit
        relay is not used as an exit by clients, so it counts as a middle (or guard)."""
        exit_ = "Exit" in self.flags and "BadExit" not in self.flags
        guard = "Guard" in self.flags
        return "guardexit" if guard and exit_ else "guard" if guard else "exit" if exit_ else "middle"


def _iso(t) -> str | None:
    return None if t is None else t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _first_line(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as e:
        raise SourceError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        text = head.decode("latin-1")
        if "\x00" in text:
            raise SourceError(f"{path}: a binary file, not a Tor directory document "
                              "(unpack CollecTor's archives first, or pass the .tar/.tar.xz itself "
                              "for descriptors)") from None
    # tor's own caches annotate each descriptor ("@uploaded-at", "@source", "@downloaded-at");
    # CollecTor's files start with "@type". Only "@type" says what the document is.
    for line in text.splitlines():
        line = line.strip()
        if line and (line.startswith("@type ") or not line.startswith("@")):
            return line
    return ""


def read_consensus(path: str | Path) -> tuple[list[ConsensusRelay], SourceDocument]:
    """Parse a network-status consensus (CollecTor's ``consensuses-YYYY-MM/DD/...-consensus``
    files; the microdescriptor flavor is accepted too). Raises SourceError naming the file."""
    import stem.descriptor
    path = Path(path)
    if not path.is_file():
        raise SourceError(f"{path}: no such file (the consensus)")
    first = _first_line(path)
    if first.startswith("@type "):
        doc_type = first[len("@type "):]
    elif first.startswith("network-status-version 3"):
        doc_type = MICRODESC_CONSENSUS_TYPE if "microdesc" in first else CONSENSUS_TYPE
    else:
        raise SourceError(f"{path}: not a network-status consensus (its first line is {first[:60]!r}; "
                          "expected '@type network-status-consensus-3 1.0' or 'network-status-version 3')")
    if doc_type not in (CONSENSUS_TYPE, MICRODESC_CONSENSUS_TYPE):
        raise SourceError(f"{path}: a '{doc_type}' document, not a consensus (votes and other documents "
                          "are not accepted: download from CollecTor's recent/relay-descriptors/consensuses/)")
    def parse(validate: bool) -> list:
        return list(stem.descriptor.parse_file(str(path), descriptor_type=doc_type,
                                               document_handler=stem.descriptor.DocumentHandler.DOCUMENT,
                                               validate=validate))
    try:
        docs = parse(True)
    except (ValueError, TypeError, IOError) as e:
        # A private network's consensus (tor's own cached-consensus, e.g. torbed's authorities')
        # has empty client-versions/server-versions lines, which stem's validation refuses but
        # tor accepts; such a document is read without validation when it still has a
        # valid-after time and relays with fingerprints.
        try:
            docs = parse(False)
        except (ValueError, TypeError, IOError):
            docs = []
        if not (len(docs) == 1 and docs[0].valid_after is not None and docs[0].routers
                and all(fp and e_.nickname for fp, e_ in docs[0].routers.items())):
            raise SourceError(f"{path}: not a valid consensus: {e}") from None
    if len(docs) != 1:
        raise SourceError(f"{path}: holds {len(docs)} consensus documents; pass exactly one")
    doc = docs[0]
    if not getattr(doc, "is_consensus", False):
        raise SourceError(f"{path}: a vote, not a consensus")
    relays = []
    for fp, entry in doc.routers.items():
        relays.append(ConsensusRelay(
            fingerprint=fp.upper(), nickname=entry.nickname, flags=frozenset(entry.flags or ()),
            weight=int(entry.bandwidth or 0),
            descriptor_digest=(entry.digest.upper() if getattr(entry, "digest", None) else None)))
    if not relays:
        raise SourceError(f"{path}: the consensus lists no relays")
    info = SourceDocument(kind="consensus", path=str(path), sha256=file_sha256(path), entries=len(relays),
                          valid_after=_iso(doc.valid_after))
    return relays, info


def _descriptor_files(p: Path) -> list[Path]:
    if p.is_dir():
        # Empty files are skipped: a relay or authority's cached-descriptors.new often is one.
        files = sorted(f for f in p.rglob("*") if f.is_file() and not f.name.startswith(".") and f.stat().st_size)
        if not files:
            raise SourceError(f"{p}: the directory holds no files (expected server descriptors)")
        return files
    if p.is_file():
        return [p]
    raise SourceError(f"{p}: no such file or directory (server descriptors)")


def read_descriptors(paths: list[str | Path]) -> tuple[dict[str, list[Descriptor]], list[SourceDocument]]:
    """Parse server descriptors from files, directories (recursively) or tar archives.
    Returns descriptors by fingerprint and one SourceDocument per path given. Raises
    SourceError naming the file that is not a server descriptor."""
    import stem.descriptor
    by_fp: dict[str, list[Descriptor]] = {}
    infos = []
    for given in paths:
        given = Path(given)
        count, published = 0, []
        digest = hashlib.sha256()
        is_tar = given.is_file() and tarfile.is_tarfile(given)
        files = [given] if is_tar else _descriptor_files(given)
        for f in files:
            # Directories are hashed over their files' names and contents, in sorted order.
            file_hash = file_sha256(f)
            digest.update(f"{f.relative_to(given) if given.is_dir() else f.name}\0{file_hash}\n".encode())
            try:
                if is_tar:
                    found = stem.descriptor.parse_file(str(f), validate=True)
                else:
                    first = _first_line(f)
                    if first.startswith("@type ") and first[len("@type "):] != DESCRIPTOR_TYPE:
                        raise SourceError(f"{f}: a '{first[len('@type '):]}' document, not server descriptors "
                                          "(download from CollecTor's relay-descriptors/server-descriptors/)")
                    if not first.startswith("@type ") and not first.startswith("router "):
                        raise SourceError(f"{f}: not a server descriptor (its first line is {first[:60]!r}; "
                                          "expected '@type server-descriptor 1.0' or 'router ...')")
                    found = stem.descriptor.parse_file(str(f), descriptor_type=DESCRIPTOR_TYPE, validate=True)
                for d in found:
                    if type(d).__name__ != "RelayDescriptor":
                        raise SourceError(f"{f}: holds a {type(d).__name__}, not a relay's server descriptor")
                    fp = (d.fingerprint or "").upper()
                    if not fp or d.observed_bandwidth is None:
                        raise SourceError(f"{f}: a server descriptor without fingerprint or bandwidth line")
                    by_fp.setdefault(fp, []).append(Descriptor(
                        fingerprint=fp, nickname=d.nickname, digest=d.digest().upper(),
                        published=_iso(d.published) or "", average=int(d.average_bandwidth),
                        burst=int(d.burst_bandwidth), observed=int(d.observed_bandwidth)))
                    published.append(_iso(d.published) or "")
                    count += 1
            except SourceError:
                raise
            except (ValueError, TypeError, IOError, tarfile.TarError) as e:
                raise SourceError(f"{f}: not a valid server descriptor: {e}") from None
        if count == 0:
            raise SourceError(f"{given}: holds no server descriptors")
        published = sorted(p for p in published if p)
        infos.append(SourceDocument(kind="server-descriptors", path=str(given),
                                    sha256=file_sha256(given) if given.is_file() else digest.hexdigest(),
                                    entries=count,
                                    published=f"{published[0]} .. {published[-1]}" if published else None))
    return by_fp, infos


def join(relays: list[ConsensusRelay], descriptors: dict[str, list[Descriptor]], consensus_path: str,
         descriptor_paths: list[str], min_coverage: float = 0.5) -> tuple[list[Relay], int]:
    """The consensus relays that have a descriptor, with capacity = the largest advertised
    bandwidth among their descriptors (CollecTor's month of descriptors has several per
    relay; tornettools likewise takes the relay's largest observed bandwidth). Returns
    (relays, number of consensus relays without a descriptor). Raises SourceError when fewer
    than ``min_coverage`` of the consensus' relays have one: the descriptors belong to
    another period (or are missing)."""
    out, missing = [], 0
    for r in relays:
        ds = descriptors.get(r.fingerprint)
        if not ds:
            missing += 1
            continue
        out.append(Relay(fingerprint=r.fingerprint, nickname=r.nickname, flags=r.flags, weight=r.weight,
                         capacity=max(d.advertised for d in ds), observed=max(d.observed for d in ds)))
    if len(out) < min_coverage * len(relays):
        raise SourceError(f"{', '.join(descriptor_paths)}: server descriptors for only {len(out)} of the "
                          f"{len(relays)} relays of {consensus_path}: download the server descriptors of the "
                          "consensus' month (and the month before, for relays that published then)")
    return out, missing


# dir-spec: "w Bandwidth=" is in kilobytes per second (1000 bytes), measured by the bandwidth
# authorities (or self-advertised, capped, when Unmeasured=1).
CONSENSUS_WEIGHT_UNIT = 1000


def from_consensus(relays: list[ConsensusRelay]) -> list[Relay]:
    """Every consensus relay, with capacity = its consensus weight x 1000 bytes/s: the fallback
    when no server descriptors are at hand. The weight is what the bandwidth authorities
    measured (sbws), not the relay's own advertised bandwidth: it ranks relays as clients do,
    but it is scaled by the network's measurement ratio, so its absolute values differ from
    capacities (which the budget rescales anyway: only ratios between relays carry over)."""
    return [Relay(fingerprint=r.fingerprint, nickname=r.nickname, flags=r.flags, weight=r.weight,
                  capacity=r.weight * CONSENSUS_WEIGHT_UNIT, observed=r.weight * CONSENSUS_WEIGHT_UNIT)
            for r in relays]
