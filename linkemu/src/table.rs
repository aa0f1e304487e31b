//! The link table (JSON), written by torbed for one run:
//!
//! ```json
//! {"version": 1, "seed": 1,
//!  "ports": [{"dev": "s0", "node": "auth0", "ipv4": ["10.77.0.10"]},
//!            {"dev": "ctlp", "node": "control", "ipv4": ["10.77.0.1"], "shaped": false}],
//!  "default": {"delay_s": 0.02},
//!  "links": [{"src": "guard0", "dst": "middle0", "props": {"rate_bps": 4000000, "delay_s": 0.02}}],
//!  "control_socket": "/tmp/torbed-x/linkemu.sock", "stats_file": "runs/.../linkemu.stats.json"}
//! ```
//!
//! `ports` are the switch-side veth ends, one per node, with the node's IPv4 addresses.
//! Every ordered pair of shaped nodes gets `default` unless `links` names it (directed:
//! src -> dst). Frames to or from an unshaped port (the control plane) are never shaped.

use std::collections::HashSet;
use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::link::LinkProps;

fn yes() -> bool {
    true
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortSpec {
    pub dev: String,
    pub node: String,
    #[serde(default)]
    pub ipv4: Vec<Ipv4Addr>,
    #[serde(default = "yes")]
    pub shaped: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkEntry {
    pub src: String,
    pub dst: String,
    pub props: LinkProps,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Table {
    pub version: u32,
    #[serde(default)]
    pub seed: u64,
    pub ports: Vec<PortSpec>,
    #[serde(default)]
    pub default: LinkProps,
    #[serde(default)]
    pub links: Vec<LinkEntry>,
    #[serde(default)]
    pub control_socket: Option<String>,
    #[serde(default)]
    pub stats_file: Option<String>,
    /// Busy-poll this long before each departure instead of sleeping (wake-up latency of an
    /// idle CPU, notably a virtual one, is often hundreds of microseconds).
    #[serde(default)]
    pub spin_us: u64,
    /// SCHED_FIFO priority (1-99) for the forwarding thread, 0 for the normal scheduler.
    /// On a busy machine a normal-priority forwarder wakes milliseconds late; as a real-time
    /// task it preempts the tor processes it serves. Best effort: refused without
    /// CAP_SYS_NICE (rootless), which is logged.
    #[serde(default)]
    pub realtime_priority: u32,
}

impl Table {
    pub fn parse(text: &str) -> Result<Table, String> {
        let t: Table = serde_json::from_str(text).map_err(|e| e.to_string())?;
        t.validate()?;
        Ok(t)
    }

    pub fn load(path: &str) -> Result<Table, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        Table::parse(&text).map_err(|e| format!("{path}: {e}"))
    }

    pub fn port_of_node(&self, node: &str) -> Option<usize> {
        self.ports.iter().position(|p| p.node == node)
    }

    fn validate(&self) -> Result<(), String> {
        if self.version != 1 {
            return Err(format!("version {} is not supported (this linkemu reads version 1)", self.version));
        }
        if self.realtime_priority > 99 {
            return Err(format!("realtime_priority {} is not in 0-99", self.realtime_priority));
        }
        if self.spin_us > 10_000 {
            return Err(format!("spin_us {} is more than 10 ms", self.spin_us));
        }
        if self.ports.is_empty() {
            return Err("ports: at least one port is needed".into());
        }
        let (mut devs, mut nodes, mut ips) = (HashSet::new(), HashSet::new(), HashSet::new());
        for (i, p) in self.ports.iter().enumerate() {
            if p.dev.is_empty() || p.dev.len() > 15 {
                return Err(format!("ports[{i}].dev: '{}' is not an interface name", p.dev));
            }
            if !devs.insert(&p.dev) {
                return Err(format!("ports[{i}].dev: '{}' appears twice", p.dev));
            }
            if p.node.is_empty() || p.node == "*" || !nodes.insert(&p.node) {
                return Err(format!("ports[{i}].node: '{}' is empty, '*' or appears twice", p.node));
            }
            for ip in &p.ipv4 {
                if !ips.insert(*ip) {
                    return Err(format!("ports[{i}].ipv4: {ip} belongs to two ports"));
                }
            }
        }
        self.default.validate().map_err(|e| format!("default: {e}"))?;
        for (i, l) in self.links.iter().enumerate() {
            for (field, node) in [("src", &l.src), ("dst", &l.dst)] {
                match self.port_of_node(node) {
                    None => return Err(format!("links[{i}].{field}: no port has node '{node}'")),
                    Some(p) if !self.ports[p].shaped => {
                        return Err(format!("links[{i}].{field}: port of '{node}' is unshaped"))
                    }
                    _ => {}
                }
            }
            if l.src == l.dst {
                return Err(format!("links[{i}]: src and dst are both '{}'", l.src));
            }
            l.props.validate().map_err(|e| format!("links[{i}].props: {e}"))?;
        }
        Ok(())
    }

    /// Properties of the directed pair (src port, dst port) as the table says.
    pub fn props_for(&self, src: usize, dst: usize) -> LinkProps {
        let (a, b) = (&self.ports[src], &self.ports[dst]);
        if src == dst || !a.shaped || !b.shaped {
            return LinkProps::default();
        }
        // The last entry naming the pair wins (like a later line in a config file).
        self.links
            .iter()
            .rev()
            .find(|l| l.src == a.node && l.dst == b.node)
            .map(|l| l.props.clone())
            .unwrap_or_else(|| self.default.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = r#"{"version": 1,
        "ports": [{"dev": "s0", "node": "a", "ipv4": ["10.0.0.10"]},
                  {"dev": "s1", "node": "b", "ipv4": ["10.0.0.11"]},
                  {"dev": "ctlp", "node": "control", "ipv4": ["10.0.0.1"], "shaped": false}],
        "default": {"delay_s": 0.02},
        "links": [{"src": "a", "dst": "b", "props": {"rate_bps": 1000000}}]}"#;

    #[test]
    fn pairs_get_default_or_override() {
        let t = Table::parse(T).unwrap();
        assert_eq!(t.props_for(0, 1).rate_bps, Some(1_000_000));
        assert_eq!(t.props_for(0, 1).delay_s, 0.0, "an override replaces the default entirely");
        assert_eq!(t.props_for(1, 0).delay_s, 0.02, "links are directed");
        assert!(t.props_for(0, 2).is_passthrough(), "control plane unshaped");
        assert!(t.props_for(2, 1).is_passthrough());
    }

    #[test]
    fn bad_tables_say_what_is_wrong() {
        let cases = [
            (T.replace(r#""version": 1"#, r#""version": 2"#), "version 2"),
            (T.replace(r#""dst": "b""#, r#""dst": "z""#), "links[0].dst: no port has node 'z'"),
            (T.replace(r#""dst": "b""#, r#""dst": "control""#), "unshaped"),
            (T.replace("10.0.0.11", "10.0.0.10"), "belongs to two ports"),
            (T.replace(r#""dev": "s1""#, r#""dev": "s0""#), "appears twice"),
            (T.replace("rate_bps", "rate"), "unknown field"),
            (T.replace(r#""delay_s": 0.02"#, r#""delay_s": -1"#), "default: delay_s"),
        ];
        for (text, want) in cases {
            let err = Table::parse(&text).unwrap_err();
            assert!(err.contains(want), "{err} does not mention {want}");
        }
    }
}
