"""Circuits known by their client at every hop: relay-side CELL_STATS records chained from
the client's own circuits, with no volume rule.

What the records give (docs/records.md):

- cellstats.jsonl (every relay): a circuit at a relay is named by its inbound channel and
  the circuit id on it (``inbound.conn``, ``inbound.queue``), or by ``circuit`` = its ID when
  the relay built it; ``outbound.conn``/``outbound.queue`` is the channel toward the next
  hop and the circuit id there. Channel ids (``conn``) are each tor's own counter; a circuit
  id is the same at both ends of a channel.
- circuits.jsonl (every client's driver): ``event: "link"`` records give, for each of the
  client tor's circuits (``id``, the id transfers.jsonl names), its channel to the guard and
  the circuit id on it (from the client's own CELL_STATS).
- transfers.jsonl and circuits.jsonl's ``event: "stream"`` records: which circuits (client,
  circuit ID) carried the workload's streams.

Method (``attribute``):

1. A *hop* is one circuit at one node: (node, session, inbound conn, inbound queue) at a
   relay, (node, session, "id", ID) for a circuit the node built itself (clients, and relays'
   own circuits). ``session`` tells a restarted tor's records apart (its channel ids start
   again).
2. Channel ends are paired: an end is (node, session, conn). A circuit leaving end A with id
   q and a circuit entering end B (at another node) with id q, seen within ``SLACK_S`` of each
   other, is one vote for "A and B are the two ends of one channel". Circuit ids are random
   31-bit numbers, so a collision across channels adds one stray vote, while the true pair
   gets a vote from every circuit the channel carried (in either direction). Pairs are taken
   in order of votes; an end that would pair equally well with two others is left unpaired
   (``Attribution.ambiguous``) rather than guessed.
3. Chains: from each origin circuit (a client's, or a relay's own) the next hop is the
   circuit entering the paired end with the same circuit id; from there its outbound side,
   and so on. Every hop on a client's chain gets that client, its group, the client's circuit
   id and its position (``guard``, ``middle``, ``exit``: first, in between, last relay of a
   client circuit with a known path; ``hop<i>`` otherwise).

Public API:

- ``attribute(cellstats, client_circuits, transfers=(), names=None) -> Attribution``
- ``Attribution``: ``labels`` (hop key -> Label), ``label_of(record) -> Label | None``,
  ``pairs``, ``ambiguous``, ``workload`` ({(client, circuit id)}), ``summary() -> dict``
- ``coverage(attribution, cellstats) -> dict``: workload circuits found at every hop, relay-side
  hops that carried data and are unlabelled (the report's per-repetition ``circuits``)
- ``hop_key(record) -> tuple | None`` (a cellstats record's hop), ``Label``
- ``position_name(i, n) -> str``; ``SLACK_S``
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

SLACK_S = 5.0   # CELL_STATS come once a second; ends of one circuit are seen within seconds


@dataclass(frozen=True)
class Label:
    origin: str                 # "client" or "relay" (a relay's own circuit)
    node: str                   # the client (or relay) that built the circuit
    group: str | None           # its group (client group for client circuits)
    circuit: str                # the circuit's ID at its origin (transfers.jsonl circuit.id)
    hop: int                    # 0 = the first relay after the origin; -1 = the origin itself
    position: str               # guard / middle / exit / hop<i> / origin
    relay: str | None = None    # the relay this hop is at (None for the origin)


@dataclass
class _Hop:
    key: tuple
    node: str
    session: object
    inbound: tuple | None = None     # (conn, queue)
    outbound: tuple | None = None
    t_first: float = float("inf")
    t_last: float = float("-inf")
    origin_id: str | None = None

    def seen(self, t) -> None:
        if isinstance(t, (int, float)):
            self.t_first = min(self.t_first, t)
            self.t_last = max(self.t_last, t)

    def overlaps(self, other: "_Hop") -> bool:
        return self.t_first - SLACK_S <= other.t_last and other.t_first - SLACK_S <= self.t_last


@dataclass
class Attribution:
    labels: dict[tuple, Label] = field(default_factory=dict)
    pairs: dict[tuple, tuple] = field(default_factory=dict)     # channel end -> the other end
    ambiguous: set[tuple] = field(default_factory=set)          # channel ends left unpaired (ties)
    workload: set[tuple[str, str]] = field(default_factory=set)
    mismatched: set[tuple] = field(default_factory=set)         # client circuits whose chain left their path
    paths: dict[tuple[str, str], list] = field(default_factory=dict)    # (client, circuit) -> its relays (names, else fingerprints)
    hops: int = 0                                               # relay-side hops seen

    def label_of(self, rec: dict) -> Label | None:
        key = hop_key(rec)
        return self.labels.get(key) if key else None

    def summary(self) -> dict:
        relay_side = [lb for lb in self.labels.values() if lb.hop >= 0]
        return {"hops": self.hops, "labelled": len(relay_side),
                "client": sum(lb.origin == "client" for lb in relay_side),
                "relay_own": sum(lb.origin == "relay" for lb in relay_side),
                "channel_pairs": len(self.pairs) // 2, "ambiguous_channel_ends": len(self.ambiguous)}


DATA_CELLS = 20    # coverage(): a hop "carried data" from this many relay cells (10 KB)


def coverage(att: Attribution, cellstats, data_cells: int = DATA_CELLS) -> dict:
    """How complete the attribution of one repetition is: ``workload_circuits`` (client
    circuits that carried transfers), ``workload_complete`` (of those, found at every relay
    of their path that records CELL_STATS, or at one relay at least when the path is
    unknown), ``data_hops`` (relay-side hops with at least ``data_cells`` relay cells),
    ``data_hops_unlabelled``, and ``summary()``'s counts."""
    cellstats = list(cellstats)
    collected = {str(r.get("relay")) for r in cellstats}
    found: dict[tuple, set] = defaultdict(set)
    for lb in att.labels.values():
        if lb.origin == "client":
            found[(lb.node, lb.circuit)].add(lb.relay)
    complete = sum(1 for k in att.workload if found.get(k) and
                   {n for n in att.paths.get(k, ()) if n in collected} <= found[k])
    cells: dict[tuple, float] = defaultdict(float)
    for rec in cellstats:
        key = hop_key(rec)
        if key is None:
            continue
        for side in ("inbound", "outbound"):
            s = rec.get(side)
            if isinstance(s, dict):
                v = (s.get("removed") or {}).get("relay", 0)
                cells[key] += v if isinstance(v, (int, float)) else 0
    data = [k for k, n in cells.items() if n >= data_cells]
    return {**att.summary(), "workload_circuits": len(att.workload), "workload_complete": complete,
            "data_hops": len(data), "data_hops_unlabelled": sum(k not in att.labels for k in data),
            "data_cells": data_cells}


def _s(x) -> str | None:
    return None if x is None or x == "" else str(x)


def _side(rec: dict, name: str) -> tuple | None:
    s = rec.get(name)
    if not isinstance(s, dict) or _s(s.get("queue")) is None or _s(s.get("conn")) is None:
        return None
    return _s(s.get("conn")), _s(s.get("queue"))


def hop_key(rec: dict) -> tuple | None:
    """The hop (circuit at a relay) of one cellstats record: (relay, session, conn, queue) of
    its inbound side, or (relay, session, "id", ID) for the relay's own circuits."""
    node, session = str(rec.get("relay")), rec.get("session")
    inbound = _side(rec, "inbound")
    if inbound is not None:
        return node, session, *inbound
    c = _s(rec.get("circuit"))
    if c is not None and ":" not in c:
        return node, session, "id", c
    return None


def position_name(i: int, n: int | None) -> str:
    """Where hop ``i`` (0 = first relay) of an ``n``-relay circuit is: guard, middle, exit."""
    if n is None or n < 1:
        return f"hop{i}"
    if i == 0:
        return "guard"
    if i == n - 1:
        return "exit"
    return "middle" if n == 3 else f"middle{i}"


def _relay_hops(cellstats) -> dict[tuple, _Hop]:
    hops: dict[tuple, _Hop] = {}
    for rec in cellstats:
        key = hop_key(rec)
        if key is None:
            continue
        h = hops.get(key)
        if h is None:
            h = hops[key] = _Hop(key, key[0], key[1])
            if key[2] == "id":
                h.origin_id = key[3]
            else:
                h.inbound = (key[2], key[3])
        out = _side(rec, "outbound")
        if out is not None:
            h.outbound = out
        h.seen(rec.get("t"))
    return hops


def _client_hops(client_circuits) -> tuple[dict[tuple, _Hop], dict[tuple, dict]]:
    """The client tors' circuits as origin hops, and what their CIRC events said (path)."""
    hops: dict[tuple, _Hop] = {}
    info: dict[tuple, dict] = {}
    for rec in client_circuits:
        client, cid = str(rec.get("client")), _s(rec.get("id"))
        if cid is None:
            continue
        key = (client, rec.get("session"), "id", cid)
        if rec.get("event") == "link":
            if _s(rec.get("conn")) is None or _s(rec.get("queue")) is None:
                continue
            h = hops.get(key)
            if h is None:
                h = hops[key] = _Hop(key, client, rec.get("session"), origin_id=cid)
            h.outbound = (str(rec["conn"]), str(rec["queue"]))
            h.seen(rec.get("t"))
        i = info.setdefault(key, {})
        i["group"] = rec.get("group")
        if rec.get("event") == "built" and rec.get("path"):
            i["path"] = list(rec["path"])
        elif rec.get("event") in ("closed", "failed"):
            i["t_closed"] = rec.get("t")
    for key, i in info.items():
        if key in hops and isinstance(i.get("t_closed"), (int, float)):
            hops[key].seen(i["t_closed"])
    return hops, info


def _pair_channels(hops: list[_Hop]) -> tuple[dict[tuple, tuple], set[tuple]]:
    entering: dict[str, list[_Hop]] = defaultdict(list)
    for h in hops:
        if h.inbound is not None:
            entering[h.inbound[1]].append(h)
    votes: dict[tuple, int] = defaultdict(int)
    for h in hops:
        if h.outbound is None:
            continue
        a = (h.node, h.session, h.outbound[0])
        for g in entering.get(h.outbound[1], ()):
            if g.node == h.node or not h.overlaps(g):
                continue
            b = (g.node, g.session, g.inbound[0])
            votes[(a, b) if repr(a) <= repr(b) else (b, a)] += 1
    pairs: dict[tuple, tuple] = {}
    ambiguous: set[tuple] = set()
    by_level: dict[int, list[tuple]] = defaultdict(list)
    for p, n in votes.items():
        by_level[n].append(p)
    for n in sorted(by_level, reverse=True):
        free = [p for p in by_level[n] if p[0] not in pairs and p[1] not in pairs
                and p[0] not in ambiguous and p[1] not in ambiguous]
        count: dict[tuple, int] = defaultdict(int)
        for a, b in free:
            count[a] += 1
            count[b] += 1
        for a, b in free:
            if count[a] > 1 or count[b] > 1:
                ambiguous.update(e for e in (a, b) if count[e] > 1)
                continue
            pairs[a], pairs[b] = b, a
    return pairs, ambiguous - set(pairs)


def attribute(cellstats, client_circuits, transfers=(), names: dict[str, str] | None = None,
              client_groups: dict[str, str] | None = None, relay_groups: dict[str, str] | None = None
              ) -> Attribution:
    """Label every relay-side hop reachable from an origin circuit (see the module's doc).
    ``names``: relay fingerprint -> node name (meta.json nodes), to check chains against the
    client's path; ``relay_groups``: relay -> group (for relays' own circuits)."""
    cellstats = list(cellstats)
    relay_hops = _relay_hops(cellstats)
    client_hops, info = _client_hops(client_circuits)
    relay_groups = relay_groups or {str(r.get("relay")): r.get("group") for r in cellstats}
    pairs, ambiguous = _pair_channels(list(relay_hops.values()) + list(client_hops.values()))
    entering: dict[tuple, list[_Hop]] = defaultdict(list)   # (channel end, queue) -> hops
    for h in relay_hops.values():
        if h.inbound is not None:
            entering[((h.node, h.session, h.inbound[0]), h.inbound[1])].append(h)

    att = Attribution(pairs=pairs, ambiguous=ambiguous, hops=len(relay_hops))
    _workload_circuits(att, transfers, client_circuits)

    def chain(origin: _Hop) -> list[_Hop]:
        return _chain(origin, pairs, entering)

    for key, o in client_hops.items():
        _label_client(att, key, o, info.get(key, {}), chain(o), names, client_groups)
    for o in relay_hops.values():
        if o.origin_id is None:
            continue
        grp = relay_groups.get(o.node)
        att.labels[o.key] = Label("relay", o.node, grp, o.origin_id, -1, "origin", o.node)
        for k, h in enumerate(chain(o)):
            att.labels.setdefault(h.key, Label("relay", o.node, grp, o.origin_id, k, f"hop{k}", h.node))
    return att


def _workload_circuits(att: Attribution, transfers, client_circuits) -> None:
    """The (client, circuit id) pairs that carried the workload: named by transfers.jsonl
    (fixed paths) or by circuits.jsonl's stream events (tor's own paths)."""
    for t in transfers:
        c = t.get("circuit")
        if isinstance(c, dict) and _s(c.get("id")) is not None:
            att.workload.add((str(t.get("client")), str(c["id"])))
    for rec in client_circuits:
        if rec.get("event") == "stream" and _s(rec.get("id")) is not None:
            att.workload.add((str(rec.get("client")), str(rec["id"])))


def _chain(origin: _Hop, pairs: dict, entering: dict) -> list[_Hop]:
    """The relay hops after ``origin``: each hop's outbound (channel, queue) followed to the
    one hop entering the paired channel end with that queue while ``origin`` lived."""
    out, h, seen = [], origin, set()
    while h.outbound is not None:
        end = pairs.get((h.node, h.session, h.outbound[0]))
        if end is None:
            break
        nxt = [g for g in entering.get((end, h.outbound[1]), ()) if g.key not in seen and origin.overlaps(g)]
        if len(nxt) != 1:
            break
        h = nxt[0]
        seen.add(h.key)
        out.append(h)
    return out


def _label_client(att: Attribution, key, o: _Hop, i: dict, hops: list[_Hop], names, client_groups) -> None:
    """Label the relay hops of the client circuit ``o`` (``i``: its circuits.jsonl facts),
    unless the chain does not run through the relays the client's tor built it through."""
    path = i.get("path")
    n = len(path) if path else None
    if n:
        att.paths[(o.node, o.origin_id)] = [(names or {}).get(fp.lstrip("$").upper(), fp) for fp in path]
    group = i.get("group") or (client_groups or {}).get(o.node)
    if names and path:
        want = [names.get(fp.lstrip("$").upper()) for fp in path]
        if [h.node for h in hops] != want[:len(hops)]:
            att.mismatched.add(key)
            return
    for k, h in enumerate(hops):
        att.labels[h.key] = Label("client", o.node, group, o.origin_id, k, position_name(k, n), h.node)
