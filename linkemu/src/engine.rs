//! The switch: classifies each frame to a link and schedules it. No sockets here: frames
//! come in through `ingress` and leave through a `Tx`, so tests drive it with a fake clock.
//!
//! - Broadcast/multicast (ARP requests, IPv6 neighbour discovery) is flooded to every other
//!   port at once, unshaped, as a bridge would.
//! - IPv4 frames are classified by (source IP, destination IP) to the link between the two
//!   nodes' ports; the destination port comes from the table's addresses (falling back to
//!   the learned MAC for addresses the table does not list).
//! - Other unicast (ARP replies) goes to the port that learned the destination MAC, at once.

use std::collections::HashMap;

use serde_json::{json, Value};

use crate::delayline::DelayLine;
use crate::link::{Link, LinkProps, Verdict};
use crate::table::Table;

/// Sends one frame out of a port; false when the kernel refused it.
pub trait Tx {
    fn send(&mut self, port: usize, frame: &[u8]) -> bool;
}

struct Frame {
    port: usize,
    len: usize,
    buf: Vec<u8>,
}

#[derive(Default, Clone, Copy)]
struct PortStats {
    rx_frames: u64,
    rx_bytes: u64,
    tx_frames: u64,
    tx_bytes: u64,
    tx_errors: u64,
    oversize: u64,
}

#[derive(Default)]
struct Counters {
    flooded: u64,
    unknown_dst: u64,
    runts: u64,
    hairpin: u64,
}

/// How late scheduled frames left (now - departure at egress): log2 buckets of microseconds,
/// bucket k counts lateness in [2^(k-1), 2^k) us (bucket 0: under 1 us).
#[derive(Default)]
struct Lateness {
    buckets: [u64; 24],
    max_ns: u64,
}

impl Lateness {
    fn record(&mut self, ns: u64) {
        let us = ns / 1000;
        let k = (64 - us.leading_zeros()) as usize;
        self.buckets[k.min(23)] += 1;
        self.max_ns = self.max_ns.max(ns);
    }

    fn to_json(&self) -> Value {
        let mut b = serde_json::Map::new();
        for (k, &c) in self.buckets.iter().enumerate() {
            if c > 0 {
                let upper = if k == 0 { "1us".to_string() } else { format!("{}us", 1u64 << k) };
                b.insert(format!("lt_{upper}"), json!(c));
            }
        }
        json!({"buckets": b, "max_us": self.max_ns as f64 / 1000.0})
    }
}

pub struct Engine {
    table: Table,
    n: usize,
    ip_port: HashMap<u32, usize>,
    mac_port: HashMap<[u8; 6], usize>,
    links: Vec<Link>,
    line: DelayLine<Frame>,
    pool: Vec<Vec<u8>>,
    buf_size: usize,
    ports: Vec<PortStats>,
    counters: Counters,
    lateness: Lateness,
}

const ETH_IPV4: u16 = 0x0800;

fn link_seed(seed: u64, idx: usize) -> u64 {
    seed.wrapping_mul(0x2545_f491_4f6c_dd1d).wrapping_add(idx as u64)
}

impl Engine {
    /// `buf_size`: the largest frame accepted (MTU + Ethernet header).
    pub fn new(table: Table, buf_size: usize) -> Result<Engine, String> {
        let n = table.ports.len();
        let mut ip_port = HashMap::new();
        for (i, p) in table.ports.iter().enumerate() {
            for ip in &p.ipv4 {
                ip_port.insert(u32::from(*ip), i);
            }
        }
        let mut links = Vec::with_capacity(n * n);
        for s in 0..n {
            for d in 0..n {
                links.push(Link::new(table.props_for(s, d), link_seed(table.seed, s * n + d))?);
            }
        }
        Ok(Engine {
            table,
            n,
            ip_port,
            mac_port: HashMap::new(),
            links,
            line: DelayLine::default(),
            pool: Vec::new(),
            buf_size,
            ports: vec![PortStats::default(); n],
            counters: Counters::default(),
            lateness: Lateness::default(),
        })
    }

    pub fn table(&self) -> &Table {
        &self.table
    }

    /// A receive buffer of `buf_size` bytes (recycled).
    pub fn buffer(&mut self) -> Vec<u8> {
        self.pool.pop().unwrap_or_else(|| vec![0u8; self.buf_size])
    }

    pub fn recycle(&mut self, buf: Vec<u8>) {
        if self.pool.len() < 4096 {
            self.pool.push(buf);
        }
    }

    pub fn note_oversize(&mut self, port: usize) {
        self.ports[port].oversize += 1;
    }

    /// Replace the link properties with a new table's (same ports required: they are
    /// sockets). State of each link (transmission in progress, frames in flight) is kept.
    pub fn apply_table(&mut self, table: Table) -> Result<(), String> {
        if table.ports != self.table.ports {
            return Err("the new table changes the ports; restart linkemu to change them".into());
        }
        for s in 0..self.n {
            for d in 0..self.n {
                self.links[s * self.n + d].set_props(table.props_for(s, d))?;
            }
        }
        self.table = table;
        Ok(())
    }

    fn ports_matching(&self, node: &str) -> Result<Vec<usize>, String> {
        if node == "*" {
            return Ok((0..self.n).filter(|&i| self.table.ports[i].shaped).collect());
        }
        match self.table.port_of_node(node) {
            Some(i) if self.table.ports[i].shaped => Ok(vec![i]),
            Some(_) => Err(format!("'{node}' is unshaped")),
            None => Err(format!("no port has node '{node}'")),
        }
    }

    /// Set the properties of src -> dst (and dst -> src when `symmetric`); either may be
    /// "*" (every shaped node). Returns how many directed links changed.
    pub fn set_links(&mut self, src: &str, dst: &str, props: &LinkProps, symmetric: bool) -> Result<usize, String> {
        props.validate()?;
        let (ss, ds) = (self.ports_matching(src)?, self.ports_matching(dst)?);
        let mut pairs = Vec::new();
        for &s in &ss {
            for &d in &ds {
                if s != d {
                    pairs.push((s, d));
                    if symmetric {
                        pairs.push((d, s));
                    }
                }
            }
        }
        pairs.sort_unstable();
        pairs.dedup();
        for &(s, d) in &pairs {
            self.links[s * self.n + d].set_props(props.clone())?;
        }
        Ok(pairs.len())
    }

    pub fn link_props(&self, src: &str, dst: &str) -> Result<LinkProps, String> {
        let s = self.table.port_of_node(src).ok_or_else(|| format!("no port has node '{src}'"))?;
        let d = self.table.port_of_node(dst).ok_or_else(|| format!("no port has node '{dst}'"))?;
        Ok(self.links[s * self.n + d].props().clone())
    }

    fn send(&mut self, tx: &mut impl Tx, port: usize, frame: &[u8]) {
        let st = &mut self.ports[port];
        if tx.send(port, frame) {
            st.tx_frames += 1;
            st.tx_bytes += frame.len() as u64;
        } else {
            st.tx_errors += 1;
        }
    }

    fn flood(&mut self, tx: &mut impl Tx, in_port: usize, frame: &[u8]) {
        self.counters.flooded += 1;
        for p in 0..self.n {
            if p != in_port {
                self.send(tx, p, frame);
            }
        }
    }

    /// A frame of `len` bytes (in `buf`) arrived on `in_port` at `now`.
    pub fn ingress(&mut self, now: u64, in_port: usize, buf: Vec<u8>, len: usize, tx: &mut impl Tx) {
        let st = &mut self.ports[in_port];
        st.rx_frames += 1;
        st.rx_bytes += len as u64;
        if len < 14 {
            self.counters.runts += 1;
            return self.recycle(buf);
        }
        let frame = &buf[..len];
        let mut dst_mac = [0u8; 6];
        dst_mac.copy_from_slice(&frame[0..6]);
        let mut src_mac = [0u8; 6];
        src_mac.copy_from_slice(&frame[6..12]);
        if src_mac[0] & 1 == 0 && self.mac_port.get(&src_mac) != Some(&in_port) {
            self.mac_port.insert(src_mac, in_port);
        }
        if dst_mac[0] & 1 == 1 {
            self.flood(tx, in_port, &buf[..len]);
            return self.recycle(buf);
        }
        let ethertype = u16::from_be_bytes([frame[12], frame[13]]);
        let mut src_port = in_port;
        let mut out = None;
        if ethertype == ETH_IPV4 && len >= 34 {
            let src_ip = u32::from_be_bytes([frame[26], frame[27], frame[28], frame[29]]);
            let dst_ip = u32::from_be_bytes([frame[30], frame[31], frame[32], frame[33]]);
            out = self.ip_port.get(&dst_ip).copied();
            if let Some(&p) = self.ip_port.get(&src_ip) {
                src_port = p;
            }
        }
        let out = match out.or_else(|| self.mac_port.get(&dst_mac).copied()) {
            Some(p) => p,
            None => {
                // Unknown unicast: a bridge floods it.
                self.counters.unknown_dst += 1;
                self.flood(tx, in_port, &buf[..len]);
                return self.recycle(buf);
            }
        };
        if out == in_port {
            self.counters.hairpin += 1;
            return self.recycle(buf);
        }
        let link = &mut self.links[src_port * self.n + out];
        if ethertype != ETH_IPV4 || link.passthrough(now) {
            self.send(tx, out, &buf[..len]);
            return self.recycle(buf);
        }
        match link.admit(now, len) {
            Verdict::Depart(at) => self.line.push(at, Frame { port: out, len, buf }),
            Verdict::Lost | Verdict::QueueFull => self.recycle(buf),
        }
    }

    /// Send every frame due at `now`; returns how many left.
    pub fn egress(&mut self, now: u64, tx: &mut impl Tx) -> usize {
        let mut sent = 0;
        while let Some((at, f)) = self.line.pop_due(now) {
            self.lateness.record(now - at);
            self.send(tx, f.port, &f.buf[..f.len]);
            self.recycle(f.buf);
            sent += 1;
        }
        sent
    }

    /// When the next scheduled frame is due.
    pub fn next_departure(&self) -> Option<u64> {
        self.line.next_at()
    }

    /// The queue backlog at `now` of every link with a rate that has carried a frame: what
    /// the mechanism gate samples once a second (torbed/gates.py), small where `stats` is
    /// large (one entry per link with a rate, not every counter of every link).
    pub fn backlog(&self, now: u64) -> Value {
        let mut links = Vec::new();
        for s in 0..self.n {
            for d in 0..self.n {
                let l = &self.links[s * self.n + d];
                if l.stats.frames_in == 0 || l.rate_bps() == 0 {
                    continue;
                }
                let (ns, bytes) = l.backlog(now);
                links.push(json!({"src": self.table.ports[s].node, "dst": self.table.ports[d].node,
                                  "rate_bps": l.rate_bps(), "backlog_bytes": bytes,
                                  "backlog_s": ns as f64 / 1e9, "queue_drops": l.stats.queue_drops}));
            }
        }
        json!({"links": links})
    }

    pub fn stats(&self) -> Value {
        let ports: Vec<Value> = self
            .table
            .ports
            .iter()
            .zip(&self.ports)
            .map(|(p, s)| {
                json!({"dev": p.dev, "node": p.node, "rx_frames": s.rx_frames, "rx_bytes": s.rx_bytes,
                       "tx_frames": s.tx_frames, "tx_bytes": s.tx_bytes, "tx_errors": s.tx_errors,
                       "oversize": s.oversize})
            })
            .collect();
        let mut links = Vec::new();
        for s in 0..self.n {
            for d in 0..self.n {
                let l = &self.links[s * self.n + d];
                if l.stats.frames_in > 0 {
                    let mut v = serde_json::to_value(l.stats).unwrap_or(Value::Null);
                    v["src"] = json!(self.table.ports[s].node);
                    v["dst"] = json!(self.table.ports[d].node);
                    links.push(v);
                }
            }
        }
        json!({"ports": ports, "links": links, "scheduled": self.line.len(),
               "flooded": self.counters.flooded, "unknown_dst": self.counters.unknown_dst,
               "runts": self.counters.runts, "hairpin": self.counters.hairpin,
               "lateness": self.lateness.to_json()})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[derive(Default)]
    struct Wire {
        sent: Vec<(usize, Vec<u8>)>,
    }
    impl Tx for Wire {
        fn send(&mut self, port: usize, frame: &[u8]) -> bool {
            self.sent.push((port, frame.to_vec()));
            true
        }
    }

    fn mac(i: u8) -> [u8; 6] {
        [0x02, 0, 0, 0, 0, i]
    }

    fn ipv4(src: u8, dst: u8, len: usize, tag: u8) -> Vec<u8> {
        let mut f = vec![0u8; len];
        f[0..6].copy_from_slice(&mac(dst));
        f[6..12].copy_from_slice(&mac(src));
        f[12..14].copy_from_slice(&ETH_IPV4.to_be_bytes());
        f[14] = 0x45;
        f[26..30].copy_from_slice(&[10, 0, 0, src]);
        f[30..34].copy_from_slice(&[10, 0, 0, dst]);
        f[len - 1] = tag;
        f
    }

    fn arp_request(src: u8) -> Vec<u8> {
        let mut f = vec![0u8; 42];
        f[0..6].copy_from_slice(&[0xff; 6]);
        f[6..12].copy_from_slice(&mac(src));
        f[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        f
    }

    fn engine(links: &str) -> Engine {
        let t = Table::parse(&format!(
            r#"{{"version": 1, "seed": 3,
                "ports": [{{"dev": "s0", "node": "a", "ipv4": ["10.0.0.10"]}},
                          {{"dev": "s1", "node": "b", "ipv4": ["10.0.0.11"]}},
                          {{"dev": "s2", "node": "c", "ipv4": ["10.0.0.12"]}},
                          {{"dev": "ctlp", "node": "control", "ipv4": ["10.0.0.1"], "shaped": false}}],
                "default": {{"delay_s": 0.02}}, "links": [{links}]}}"#
        ))
        .unwrap();
        Engine::new(t, 2048).unwrap()
    }

    fn put(e: &mut Engine, w: &mut Wire, now: u64, port: usize, frame: Vec<u8>) {
        let mut buf = e.buffer();
        buf[..frame.len()].copy_from_slice(&frame);
        e.ingress(now, port, buf, frame.len(), w);
    }

    #[test]
    fn arp_broadcast_is_flooded_at_once() {
        let mut e = engine("");
        let mut w = Wire::default();
        put(&mut e, &mut w, 0, 0, arp_request(10));
        let ports: Vec<usize> = w.sent.iter().map(|(p, _)| *p).collect();
        assert_eq!(ports, vec![1, 2, 3]);
        assert_eq!(e.next_departure(), None);
    }

    #[test]
    fn ipv4_is_delayed_per_pair_and_delivered_to_the_right_port() {
        let mut e = engine(r#"{"src": "a", "dst": "c", "props": {"delay_s": 0.05}}"#);
        let mut w = Wire::default();
        put(&mut e, &mut w, 0, 0, ipv4(10, 11, 100, 1)); // a -> b: default 20 ms
        put(&mut e, &mut w, 0, 0, ipv4(10, 12, 100, 2)); // a -> c: 50 ms
        put(&mut e, &mut w, MS, 2, ipv4(12, 10, 100, 3)); // c -> a: default (links are directed)
        assert!(w.sent.is_empty());
        assert_eq!(e.next_departure(), Some(20 * MS));
        assert_eq!(e.egress(20 * MS - 1, &mut w), 0);
        assert_eq!(e.egress(21 * MS, &mut w), 2);
        assert_eq!(e.egress(49 * MS, &mut w), 0);
        assert_eq!(e.egress(50 * MS, &mut w), 1);
        let got: Vec<(usize, u8)> = w.sent.iter().map(|(p, f)| (*p, f[99])).collect();
        assert_eq!(got, vec![(1, 1), (0, 3), (2, 2)]);
    }

    #[test]
    fn backlog_lists_rate_limited_links_with_their_queue() {
        // a -> b at 8 Mbit/s: 1000-byte frames take 1 ms each; a -> c has no rate.
        let mut e = engine(r#"{"src": "a", "dst": "b", "props": {"rate_bps": 8000000}}"#);
        let mut w = Wire::default();
        for tag in 0..4 {
            put(&mut e, &mut w, 0, 0, ipv4(10, 11, 1000, tag));
        }
        put(&mut e, &mut w, 0, 0, ipv4(10, 12, 1000, 9));
        let b = e.backlog(MS);
        let links = b["links"].as_array().unwrap();
        assert_eq!(links.len(), 1, "{b}");
        assert_eq!(links[0]["src"], "a");
        assert_eq!(links[0]["dst"], "b");
        assert_eq!(links[0]["rate_bps"], 8000000);
        assert_eq!(links[0]["backlog_bytes"], 3000);
        assert_eq!(links[0]["backlog_s"], 0.003);
        assert_eq!(e.backlog(10 * MS)["links"][0]["backlog_bytes"], 0);
    }

    #[test]
    fn control_plane_is_never_shaped() {
        let mut e = engine("");
        let mut w = Wire::default();
        put(&mut e, &mut w, 0, 3, ipv4(1, 11, 100, 7));
        put(&mut e, &mut w, 0, 1, ipv4(11, 1, 100, 8));
        let got: Vec<(usize, u8)> = w.sent.iter().map(|(p, f)| (*p, f[99])).collect();
        assert_eq!(got, vec![(1, 7), (3, 8)]);
    }

    #[test]
    fn non_ip_unicast_follows_learned_macs_unshaped() {
        let mut e = engine("");
        let mut w = Wire::default();
        put(&mut e, &mut w, 0, 2, arp_request(12)); // learns mac(12) on port 2
        w.sent.clear();
        let mut reply = arp_request(10);
        reply[0..6].copy_from_slice(&mac(12));
        put(&mut e, &mut w, 0, 0, reply);
        assert_eq!(w.sent.len(), 1);
        assert_eq!(w.sent[0].0, 2);
    }

    #[test]
    fn unknown_unicast_is_flooded_and_hairpin_dropped() {
        let mut e = engine("");
        let mut w = Wire::default();
        put(&mut e, &mut w, 0, 0, ipv4(10, 99, 100, 1));
        assert_eq!(w.sent.len(), 3);
        w.sent.clear();
        put(&mut e, &mut w, 0, 0, ipv4(99, 10, 100, 1));
        assert!(w.sent.is_empty() && e.next_departure().is_none());
        assert_eq!(e.stats()["hairpin"], 1);
    }

    #[test]
    fn rate_limited_pair_spaces_frames() {
        let mut e = engine(r#"{"src": "a", "dst": "b", "props": {"rate_bps": 8000000}}"#);
        let mut w = Wire::default();
        for k in 0..3 {
            put(&mut e, &mut w, 0, 0, ipv4(10, 11, 1000, k));
        }
        let mut times = Vec::new();
        let mut t = 0;
        while let Some(next) = e.next_departure() {
            t = t.max(next);
            e.egress(t, &mut w);
            times.push(t);
        }
        assert_eq!(times, vec![MS, 2 * MS, 3 * MS]);
        let stats = e.stats();
        assert_eq!(stats["links"][0]["bytes_out"], 3000);
        assert_eq!(stats["ports"][1]["tx_frames"], 3);
    }

    #[test]
    fn set_links_with_wildcards_and_reload() {
        let mut e = engine("");
        let loss: LinkProps = serde_json::from_str(r#"{"loss": 1.0}"#).unwrap();
        // Partition node b: every link from and to it.
        assert_eq!(e.set_links("b", "*", &loss, true).unwrap(), 4);
        let mut w = Wire::default();
        put(&mut e, &mut w, 0, 0, ipv4(10, 11, 100, 1));
        put(&mut e, &mut w, 0, 0, ipv4(10, 12, 100, 2));
        assert_eq!(e.egress(u64::MAX, &mut w), 1);
        assert_eq!(w.sent[0].1[99], 2);
        assert_eq!(e.link_props("a", "b").unwrap().loss, 1.0);
        assert!(e.set_links("control", "a", &loss, false).is_err());
        assert!(e.set_links("zz", "a", &loss, false).is_err());
        // Reloading the table restores it; a table with other ports is refused.
        let t = e.table().clone();
        e.apply_table(t.clone()).unwrap();
        assert_eq!(e.link_props("a", "b").unwrap().loss, 0.0);
        let mut other = t;
        other.ports.pop();
        assert!(e.apply_table(other).is_err());
    }

    #[test]
    fn runts_are_dropped() {
        let mut e = engine("");
        let mut w = Wire::default();
        put(&mut e, &mut w, 0, 0, vec![1, 2, 3]);
        assert!(w.sent.is_empty());
        assert_eq!(e.stats()["runts"], 1);
    }
}
