//! The control socket: a Unix stream socket taking one JSON request per line and answering
//! one JSON line, so link properties change while the run goes on (faults).
//!
//! Requests (`op`):
//! - `{"op": "ping"}`
//! - `{"op": "set", "src": "guard0", "dst": "*", "props": {...}, "symmetric": true}`: replace
//!   the properties of src -> dst (and back); "*" is every shaped node
//! - `{"op": "get", "src": "a", "dst": "b"}`: the properties in force
//! - `{"op": "reload"}`: reread the table file (as SIGHUP does)
//! - `{"op": "stats"}`: per-port and per-link counters
//! - `{"op": "backlog"}`: each rate-limited link's queue now (bytes, seconds at its rate)
//!
//! Answers: `{"ok": true, ...}` or `{"ok": false, "error": "..."}`.

use serde::Deserialize;
use serde_json::{json, Value};

use crate::engine::Engine;
use crate::link::LinkProps;
use crate::table::Table;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    op: String,
    #[serde(default)]
    src: Option<String>,
    #[serde(default)]
    dst: Option<String>,
    #[serde(default)]
    props: Option<LinkProps>,
    #[serde(default)]
    symmetric: bool,
}

fn pair(r: &Request) -> Result<(&str, &str), String> {
    match (&r.src, &r.dst) {
        (Some(s), Some(d)) => Ok((s, d)),
        _ => Err(format!("'{}' needs src and dst", r.op)),
    }
}

/// Answer one request line at `now` (ns, the engine's clock). `table_path` is what `reload` rereads.
pub fn handle(engine: &mut Engine, table_path: &str, line: &str, now: u64) -> Value {
    let result = (|| -> Result<Value, String> {
        let req: Request = serde_json::from_str(line).map_err(|e| format!("bad request: {e}"))?;
        match req.op.as_str() {
            "ping" => Ok(json!({"version": env!("CARGO_PKG_VERSION"), "ports": engine.table().ports.len()})),
            "set" => {
                let (src, dst) = pair(&req)?;
                let props = req.props.as_ref().ok_or("'set' needs props")?;
                let changed = engine.set_links(src, dst, props, req.symmetric)?;
                Ok(json!({"changed": changed}))
            }
            "get" => {
                let (src, dst) = pair(&req)?;
                Ok(json!({"props": engine.link_props(src, dst)?}))
            }
            "reload" => {
                engine.apply_table(Table::load(table_path)?)?;
                Ok(json!({}))
            }
            "stats" => Ok(json!({"stats": engine.stats()})),
            "backlog" => Ok(json!({"backlog": engine.backlog(now)})),
            other => Err(format!("unknown op '{other}' (ping, set, get, reload, stats, backlog)")),
        }
    })();
    match result {
        Ok(mut v) => {
            v["ok"] = json!(true);
            v
        }
        Err(e) => json!({"ok": false, "error": e}),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A two-port engine (also main.rs's tests').
    pub(crate) fn engine() -> Engine {
        let t = Table::parse(
            r#"{"version": 1, "ports": [{"dev": "s0", "node": "a", "ipv4": ["10.0.0.10"]},
                                        {"dev": "s1", "node": "b", "ipv4": ["10.0.0.11"]}]}"#,
        )
        .unwrap();
        Engine::new(t, 2048).unwrap()
    }

    #[test]
    fn set_then_get() {
        let mut e = engine();
        let r = handle(&mut e, "/nonexistent", r#"{"op": "set", "src": "a", "dst": "b", "props": {"delay_s": 0.05}, "symmetric": true}"#, 0);
        assert_eq!(r, json!({"ok": true, "changed": 2}));
        let r = handle(&mut e, "/nonexistent", r#"{"op": "get", "src": "b", "dst": "a"}"#, 0);
        assert_eq!(r["props"]["delay_s"], 0.05);
    }

    #[test]
    fn backlog_answers_with_the_links() {
        let mut e = engine();
        let r = handle(&mut e, "/nonexistent", r#"{"op": "backlog"}"#, 0);
        assert_eq!(r, json!({"ok": true, "backlog": {"links": []}}));
    }

    #[test]
    fn errors_are_answers() {
        let mut e = engine();
        for (req, want) in [
            ("nonsense", "bad request"),
            (r#"{"op": "dance"}"#, "unknown op"),
            (r#"{"op": "set", "src": "a"}"#, "needs src and dst"),
            (r#"{"op": "set", "src": "a", "dst": "b", "props": {"loss": 2}}"#, "probability"),
            (r#"{"op": "reload"}"#, "/nonexistent"),
        ] {
            let r = handle(&mut e, "/nonexistent", req, 0);
            assert_eq!(r["ok"], false);
            assert!(r["error"].as_str().unwrap().contains(want), "{r}");
        }
    }
}
