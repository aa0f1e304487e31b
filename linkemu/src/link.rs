//! One direction of one node pair: loss, then a rate-limited drop-tail queue, then a delay
//! line with jitter (the order of netem under an htb class, with serialization modelled
//! exactly instead of a token bucket).
//!
//! Pure scheduling logic: `Link::admit(now, len)` takes the time (ns of CLOCK_MONOTONIC in
//! production, a fake clock in tests) and returns when the frame leaves, so it is tested
//! deterministically. Nothing here touches a socket.
//!
//! - rate: the link transmits one frame at a time at `rate_bps` (Ethernet frame bytes, as
//!   htb counts them on a veth); a frame arriving while the link is busy waits in the queue.
//!   The queue is drop-tail, bounded in bytes (`queue_bytes`, default 1000 full frames like
//!   htb's pfifo on a veth) or in time (`queue_s`). Its backlog is `busy_until - now` worth
//!   of data, so no per-frame queue structure is needed.
//! - delay/jitter: departure = end of transmission + delay + jitter sample. Without
//!   `reorder` a frame never leaves before the previous frame of the same link
//!   (departure = max(previous departure, sample)), so jitter cannot reorder a TCP flow.
//! - loss: Bernoulli (`loss`) or Gilbert-Elliott (`gilbert_elliott`, or `loss` with a mean
//!   burst length `loss_burst`, the simple Gilbert model netem calls `gemodel p r`).

use serde::{Deserialize, Serialize};

use crate::rng::Rng;

pub const NS_PER_S: f64 = 1e9;
/// Default queue: 1000 full-size frames, the pfifo limit htb uses on a veth (txqueuelen).
pub const DEFAULT_QUEUE_BYTES: u64 = 1000 * 1514;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum JitterDist {
    /// `jitter_s` is the standard deviation.
    #[default]
    Normal,
    /// Uniform in [-jitter_s, +jitter_s] (netem's default when no distribution is named).
    Uniform,
    /// Pareto (shape 3) with mean 0 and standard deviation `jitter_s`.
    Pareto,
    /// 1/4 normal + 3/4 Pareto, rescaled to standard deviation `jitter_s`.
    Paretonormal,
}

fn one() -> f64 {
    1.0
}

/// Gilbert-Elliott loss (netem `loss gemodel p r 1-h 1-k`): per frame, GOOD -> BAD with
/// probability `p`, BAD -> GOOD with `r`; a frame is lost with `loss_bad` in BAD and
/// `loss_good` in GOOD.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GilbertElliott {
    pub p: f64,
    pub r: f64,
    #[serde(default = "one")]
    pub loss_bad: f64,
    #[serde(default)]
    pub loss_good: f64,
}

/// Properties of one direction of a link, as they appear in the link table (JSON).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct LinkProps {
    pub rate_bps: Option<u64>,
    pub queue_bytes: Option<u64>,
    pub queue_s: Option<f64>,
    pub delay_s: f64,
    pub jitter_s: f64,
    pub jitter_dist: JitterDist,
    pub reorder: bool,
    pub loss: f64,
    pub loss_burst: Option<f64>,
    pub gilbert_elliott: Option<GilbertElliott>,
}

fn prob(name: &str, p: f64) -> Result<(), String> {
    if (0.0..=1.0).contains(&p) {
        Ok(())
    } else {
        Err(format!("{name} must be a probability in [0, 1], got {p}"))
    }
}

fn seconds(name: &str, s: f64) -> Result<(), String> {
    if s.is_finite() && (0.0..=3600.0).contains(&s) {
        Ok(())
    } else {
        Err(format!("{name} must be between 0 and 3600 seconds, got {s}"))
    }
}

impl LinkProps {
    pub fn validate(&self) -> Result<(), String> {
        if self.rate_bps == Some(0) {
            return Err("rate_bps must be positive (omit it for no limit)".into());
        }
        if self.queue_bytes.is_some() && self.queue_s.is_some() {
            return Err("set queue_bytes or queue_s, not both".into());
        }
        if self.queue_bytes == Some(0) {
            return Err("queue_bytes must be positive".into());
        }
        if let Some(q) = self.queue_s {
            seconds("queue_s", q)?;
            if q == 0.0 {
                return Err("queue_s must be positive".into());
            }
        }
        seconds("delay_s", self.delay_s)?;
        seconds("jitter_s", self.jitter_s)?;
        prob("loss", self.loss)?;
        if let Some(b) = self.loss_burst {
            if !(b.is_finite() && b >= 1.0) {
                return Err(format!("loss_burst is a mean burst length in frames (>= 1), got {b}"));
            }
            if self.loss >= 1.0 {
                return Err("loss_burst needs loss below 100%".into());
            }
        }
        if let Some(ge) = &self.gilbert_elliott {
            if self.loss != 0.0 || self.loss_burst.is_some() {
                return Err("gilbert_elliott replaces loss/loss_burst: set one or the other".into());
            }
            prob("gilbert_elliott.p", ge.p)?;
            prob("gilbert_elliott.r", ge.r)?;
            prob("gilbert_elliott.loss_bad", ge.loss_bad)?;
            prob("gilbert_elliott.loss_good", ge.loss_good)?;
        }
        Ok(())
    }

    /// No property set: frames are forwarded at once, without touching the delay line.
    pub fn is_passthrough(&self) -> bool {
        self.rate_bps.is_none()
            && self.delay_s == 0.0
            && self.jitter_s == 0.0
            && self.loss == 0.0
            && self.gilbert_elliott.is_none()
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Loss {
    None,
    Random(f64),
    Gilbert { ge: GilbertElliott, bad: bool },
}

impl Loss {
    fn from_props(p: &LinkProps) -> Loss {
        if let Some(ge) = p.gilbert_elliott {
            return Loss::Gilbert { ge, bad: false };
        }
        match p.loss_burst {
            _ if p.loss == 0.0 => Loss::None,
            Some(burst) if burst > 1.0 => {
                // Simple Gilbert: every frame in BAD is lost, bursts last 1/r frames on
                // average and the stationary share of BAD is p / (p + r) = loss.
                let r = 1.0 / burst;
                let p_gb = p.loss * r / (1.0 - p.loss);
                Loss::Gilbert { ge: GilbertElliott { p: p_gb.min(1.0), r, loss_bad: 1.0, loss_good: 0.0 }, bad: false }
            }
            _ => Loss::Random(p.loss),
        }
    }

    fn same_model(&self, other: &Loss) -> bool {
        match (self, other) {
            (Loss::Gilbert { ge: a, .. }, Loss::Gilbert { ge: b, .. }) => a == b,
            _ => self == other,
        }
    }

    fn lose(&mut self, rng: &mut Rng) -> bool {
        match self {
            Loss::None => false,
            Loss::Random(p) => rng.chance(*p),
            Loss::Gilbert { ge, bad } => {
                let lost = rng.chance(if *bad { ge.loss_bad } else { ge.loss_good });
                *bad = if *bad { !rng.chance(ge.r) } else { rng.chance(ge.p) };
                lost
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum QueueLimit {
    Bytes(u64),
    Time(u64),
}

#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct LinkStats {
    pub frames_in: u64,
    pub bytes_in: u64,
    pub lost: u64,
    pub queue_drops: u64,
    pub frames_out: u64,
    pub bytes_out: u64,
    pub max_backlog_bytes: u64,
}

/// What becomes of an admitted frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Lost,
    QueueFull,
    /// Leaves at this time (ns).
    Depart(u64),
}

pub struct Link {
    props: LinkProps,
    rate_bps: u64,
    queue: QueueLimit,
    delay_ns: u64,
    jitter_ns: f64,
    loss: Loss,
    busy_until: u64,
    last_departure: u64,
    rng: Rng,
    pub stats: LinkStats,
}

fn to_ns(s: f64) -> u64 {
    (s * NS_PER_S).round() as u64
}

impl Link {
    pub fn new(props: LinkProps, seed: u64) -> Result<Link, String> {
        let mut link = Link {
            props: LinkProps::default(),
            rate_bps: 0,
            queue: QueueLimit::Bytes(DEFAULT_QUEUE_BYTES),
            delay_ns: 0,
            jitter_ns: 0.0,
            loss: Loss::None,
            busy_until: 0,
            last_departure: 0,
            rng: Rng::new(seed),
            stats: LinkStats::default(),
        };
        link.set_props(props)?;
        Ok(link)
    }

    pub fn props(&self) -> &LinkProps {
        &self.props
    }

    /// The link's rate in bits per second (0: no rate, so no queue).
    pub fn rate_bps(&self) -> u64 {
        self.rate_bps
    }

    /// What waits to be sent at `now`: (nanoseconds of transmission left, the bytes that is
    /// at the link's rate), the frame being sent included. The link's delay is not queueing
    /// and is not counted. (0, 0) for a link without a rate.
    pub fn backlog(&self, now: u64) -> (u64, u64) {
        if self.rate_bps == 0 {
            return (0, 0);
        }
        let ns = self.busy_until.saturating_sub(now);
        (ns, (ns as u128 * self.rate_bps as u128 / 8_000_000_000u128) as u64)
    }

    /// Change the properties; frames already scheduled keep their departure times, the
    /// transmission in progress and the no-reordering bound carry over.
    pub fn set_props(&mut self, props: LinkProps) -> Result<(), String> {
        props.validate()?;
        let loss = Loss::from_props(&props);
        if !self.loss.same_model(&loss) {
            self.loss = loss;
        }
        self.rate_bps = props.rate_bps.unwrap_or(0);
        self.queue = match (props.queue_bytes, props.queue_s) {
            (_, Some(s)) => QueueLimit::Time(to_ns(s)),
            (Some(b), None) => QueueLimit::Bytes(b),
            (None, None) => QueueLimit::Bytes(DEFAULT_QUEUE_BYTES),
        };
        self.delay_ns = to_ns(props.delay_s);
        self.jitter_ns = props.jitter_s * NS_PER_S;
        self.props = props;
        Ok(())
    }

    /// True when a frame can bypass the delay line: no properties and nothing in flight
    /// (so a change to "unshaped" at runtime cannot reorder frames still scheduled).
    pub fn passthrough(&self, now: u64) -> bool {
        self.props.is_passthrough() && self.last_departure <= now
    }

    fn transmit_ns(&self, len: usize) -> u64 {
        // ceil(len * 8 s / rate)
        let num = len as u128 * 8 * 1_000_000_000u128;
        num.div_ceil(self.rate_bps as u128) as u64
    }

    fn jitter_sample(&mut self) -> f64 {
        let z = match self.props.jitter_dist {
            JitterDist::Normal => self.rng.normal(),
            JitterDist::Uniform => 2.0 * self.rng.uniform() - 1.0,
            JitterDist::Pareto => self.rng.pareto_std(),
            JitterDist::Paretonormal => {
                // Var(0.25 N + 0.75 P) = 0.0625 + 0.5625
                (0.25 * self.rng.normal() + 0.75 * self.rng.pareto_std()) / 0.625f64.sqrt()
            }
        };
        z * self.jitter_ns
    }

    /// A frame of `len` bytes arrives at `now`: lost, dropped at the tail of a full queue,
    /// or scheduled to leave at the returned time.
    pub fn admit(&mut self, now: u64, len: usize) -> Verdict {
        self.stats.frames_in += 1;
        self.stats.bytes_in += len as u64;
        if self.loss.lose(&mut self.rng) {
            self.stats.lost += 1;
            return Verdict::Lost;
        }
        let mut sent = now;
        if self.rate_bps > 0 {
            let start = self.busy_until.max(now);
            let backlog_ns = start - now;
            let tx = self.transmit_ns(len);
            let backlog_bytes = (backlog_ns as u128 * self.rate_bps as u128 / 8_000_000_000u128) as u64;
            let full = backlog_ns > 0
                && match self.queue {
                    QueueLimit::Bytes(limit) => backlog_bytes + len as u64 > limit,
                    QueueLimit::Time(limit) => backlog_ns + tx > limit,
                };
            if full {
                self.stats.queue_drops += 1;
                return Verdict::QueueFull;
            }
            self.stats.max_backlog_bytes = self.stats.max_backlog_bytes.max(backlog_bytes + len as u64);
            self.busy_until = start + tx;
            sent = self.busy_until;
        }
        let mut departure = sent + self.delay_ns;
        if self.jitter_ns > 0.0 {
            let j = self.jitter_sample().round() as i64;
            departure = (departure as i64 + j).max(sent as i64) as u64;
        }
        if !self.props.reorder {
            departure = departure.max(self.last_departure);
        }
        self.last_departure = self.last_departure.max(departure);
        self.stats.frames_out += 1;
        self.stats.bytes_out += len as u64;
        Verdict::Depart(departure)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn link(json: &str) -> Link {
        Link::new(serde_json::from_str(json).unwrap(), 42).unwrap()
    }

    fn depart(v: Verdict) -> u64 {
        match v {
            Verdict::Depart(t) => t,
            other => panic!("expected a departure, got {other:?}"),
        }
    }

    #[test]
    fn pure_delay_is_exact() {
        let mut l = link(r#"{"delay_s": 0.02}"#);
        assert!(!l.passthrough(0));
        for t in [0, 5 * MS, 5 * MS, 100 * MS] {
            assert_eq!(depart(l.admit(t, 1514)), t + 20 * MS);
        }
    }

    #[test]
    fn empty_props_are_passthrough_until_in_flight_frames_left() {
        let mut l = link("{}");
        assert!(l.passthrough(0));
        l.set_props(serde_json::from_str(r#"{"delay_s": 0.01}"#).unwrap()).unwrap();
        assert_eq!(depart(l.admit(0, 100)), 10 * MS);
        l.set_props(LinkProps::default()).unwrap();
        assert!(!l.passthrough(5 * MS), "a frame is still in flight");
        assert!(l.passthrough(10 * MS));
    }

    #[test]
    fn rate_serializes_back_to_back_frames() {
        // 1514 bytes at 10 Mbit/s = 1211.2 us each.
        let mut l = link(r#"{"rate_bps": 10000000}"#);
        let per = (1514u64 * 8 * 1_000_000_000).div_ceil(10_000_000);
        assert_eq!(per, 1_211_200);
        let deps: Vec<u64> = (0..5).map(|_| depart(l.admit(0, 1514))).collect();
        assert_eq!(deps, (1..=5).map(|k| k * per).collect::<Vec<_>>());
        // Idle link: a frame arriving later starts at once.
        assert_eq!(depart(l.admit(100 * MS, 1514)), 100 * MS + per);
    }

    #[test]
    fn long_run_rate_is_exact() {
        let mut l = link(r#"{"rate_bps": 1000000, "queue_bytes": 100000000}"#);
        let mut last = 0;
        for _ in 0..1000 {
            last = depart(l.admit(0, 1250));
        }
        // 1000 x 1250 bytes = 10 Mbit at 1 Mbit/s = 10 s.
        assert_eq!(last, 10_000 * MS);
    }

    #[test]
    fn rate_then_delay() {
        let mut l = link(r#"{"rate_bps": 8000000, "delay_s": 0.005}"#);
        // 1000 bytes at 8 Mbit/s = 1 ms.
        assert_eq!(depart(l.admit(0, 1000)), MS + 5 * MS);
        assert_eq!(depart(l.admit(0, 1000)), 2 * MS + 5 * MS);
    }

    #[test]
    fn drop_tail_in_bytes() {
        // 8 Mbit/s: 1000 bytes = 1 ms. Queue 3000 bytes: the frame in service plus two.
        let mut l = link(r#"{"rate_bps": 8000000, "queue_bytes": 3000}"#);
        let v: Vec<Verdict> = (0..5).map(|_| l.admit(0, 1000)).collect();
        assert_eq!(v[..3], [Verdict::Depart(MS), Verdict::Depart(2 * MS), Verdict::Depart(3 * MS)]);
        assert_eq!(v[3..], [Verdict::QueueFull, Verdict::QueueFull]);
        assert_eq!(l.stats.queue_drops, 2);
        // After 1.5 ms, 1500 bytes are left: one more 1000-byte frame fits, a second does not.
        assert_eq!(l.admit(1_500_000, 1000), Verdict::Depart(4 * MS));
        assert_eq!(l.admit(1_500_000, 1000), Verdict::QueueFull);
    }

    #[test]
    fn backlog_is_the_transmission_time_left() {
        // 8 Mbit/s: 1000 bytes = 1 ms; the delay is not backlog.
        let mut l = link(r#"{"rate_bps": 8000000, "delay_s": 0.05}"#);
        assert_eq!(l.backlog(0), (0, 0));
        for _ in 0..3 {
            l.admit(0, 1000);
        }
        assert_eq!(l.backlog(0), (3 * MS, 3000));
        assert_eq!(l.backlog(1_500_000), (1_500_000, 1500));
        assert_eq!(l.backlog(10 * MS), (0, 0));
        let mut free = link(r#"{"delay_s": 0.05}"#);
        free.admit(0, 1000);
        assert_eq!(free.backlog(0), (0, 0));
    }

    #[test]
    fn drop_tail_in_time() {
        let mut l = link(r#"{"rate_bps": 8000000, "queue_s": 0.0025}"#);
        let v: Vec<Verdict> = (0..4).map(|_| l.admit(0, 1000)).collect();
        assert_eq!(v, [Verdict::Depart(MS), Verdict::Depart(2 * MS), Verdict::QueueFull, Verdict::QueueFull]);
    }

    #[test]
    fn oversized_frame_enters_an_empty_queue() {
        let mut l = link(r#"{"rate_bps": 8000000, "queue_bytes": 100}"#);
        assert_eq!(l.admit(0, 1000), Verdict::Depart(MS));
        assert_eq!(l.admit(0, 10), Verdict::QueueFull);
    }

    #[test]
    fn jitter_never_reorders_by_default() {
        let mut l = link(r#"{"delay_s": 0.02, "jitter_s": 0.01}"#);
        let mut prev = 0;
        let mut early = 0;
        for k in 0..10_000u64 {
            let now = k * 100_000; // a frame every 0.1 ms, far closer than the jitter
            let d = depart(l.admit(now, 100));
            assert!(d >= prev, "frame {k} would overtake");
            assert!(d >= now);
            if d < now + 20 * MS {
                early += 1;
            }
            prev = d;
        }
        // Without reordering the max() pushes most frames later than the mean delay.
        assert!(early < 1000, "{early}");
    }

    #[test]
    fn jitter_with_reorder_matches_the_distribution() {
        let mut l = link(r#"{"delay_s": 0.02, "jitter_s": 0.005, "reorder": true}"#);
        let ds: Vec<f64> = (0..50_000).map(|_| depart(l.admit(0, 100)) as f64 / 1e6).collect();
        let mean = ds.iter().sum::<f64>() / ds.len() as f64;
        let sd = (ds.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / ds.len() as f64).sqrt();
        assert!((mean - 20.0).abs() < 0.1, "{mean}");
        assert!((sd - 5.0).abs() < 0.1, "{sd}");
        assert!(ds.windows(2).any(|w| w[1] < w[0]), "reorder allows overtaking");
    }

    #[test]
    fn widely_spaced_frames_see_the_plain_jitter_distribution() {
        // Spacing much larger than the jitter: the no-reordering bound never binds.
        for (dist, lo, hi) in [("uniform", 15.0, 25.0), ("normal", 0.0, 100.0), ("pareto", 20.0 - 2.887, 1000.0)] {
            let mut l = link(&format!(r#"{{"delay_s": 0.02, "jitter_s": 0.005, "jitter_dist": "{dist}"}}"#));
            let ds: Vec<f64> = (0..20_000u64)
                .map(|k| (depart(l.admit(k * 1000 * MS, 100)) - k * 1000 * MS) as f64 / 1e6)
                .collect();
            let mean = ds.iter().sum::<f64>() / ds.len() as f64;
            assert!((mean - 20.0).abs() < 0.15, "{dist}: mean {mean}");
            assert!(ds.iter().all(|d| (lo..=hi).contains(d)), "{dist}: out of range");
        }
    }

    #[test]
    fn jitter_never_departs_before_transmission_ends() {
        let mut l = link(r#"{"delay_s": 0.001, "jitter_s": 0.01, "reorder": true}"#);
        for k in 0..1000 {
            assert!(depart(l.admit(k * MS, 100)) >= k * MS);
        }
    }

    #[test]
    fn random_loss_rate() {
        let mut l = link(r#"{"loss": 0.01}"#);
        let lost = (0..200_000).filter(|_| l.admit(0, 100) == Verdict::Lost).count();
        // 2000 expected; sd ~ 44.5
        assert!((1800..2200).contains(&lost), "{lost}");
        assert_eq!(l.stats.lost as usize, lost);
    }

    fn bursts(l: &mut Link, n: usize) -> (f64, f64) {
        let mut lost = 0;
        let mut runs = 0;
        let mut prev = false;
        for _ in 0..n {
            let x = l.admit(0, 100) == Verdict::Lost;
            if x {
                lost += 1;
                if !prev {
                    runs += 1;
                }
            }
            prev = x;
        }
        (lost as f64 / n as f64, lost as f64 / runs as f64)
    }

    #[test]
    fn gilbert_loss_from_rate_and_burst() {
        let mut l = link(r#"{"loss": 0.02, "loss_burst": 4}"#);
        let (rate, burst) = bursts(&mut l, 1_000_000);
        assert!((rate - 0.02).abs() < 0.002, "{rate}");
        assert!((burst - 4.0).abs() < 0.3, "{burst}");
    }

    #[test]
    fn explicit_gilbert_elliott() {
        // p=0.01, r=0.25, loss_bad=0.5: pi_bad = 0.01/0.26, loss = pi_bad * 0.5 = 1.92%.
        let mut l = link(r#"{"gilbert_elliott": {"p": 0.01, "r": 0.25, "loss_bad": 0.5}}"#);
        let (rate, _) = bursts(&mut l, 1_000_000);
        assert!((rate - 0.01 / 0.26 * 0.5).abs() < 0.002, "{rate}");
    }

    #[test]
    fn burst_one_is_random_loss() {
        let l = link(r#"{"loss": 0.1, "loss_burst": 1}"#);
        assert_eq!(l.loss, Loss::Random(0.1));
    }

    #[test]
    fn invalid_props_are_refused() {
        for bad in [
            r#"{"rate_bps": 0}"#,
            r#"{"loss": 1.5}"#,
            r#"{"delay_s": -1}"#,
            r#"{"queue_bytes": 10, "queue_s": 0.1}"#,
            r#"{"loss_burst": 0.5, "loss": 0.1}"#,
            r#"{"loss": 0.1, "gilbert_elliott": {"p": 0.1, "r": 0.1}}"#,
        ] {
            let p: LinkProps = serde_json::from_str(bad).unwrap();
            assert!(Link::new(p, 1).is_err(), "{bad} accepted");
        }
        assert!(serde_json::from_str::<LinkProps>(r#"{"dealy_s": 1}"#).is_err(), "unknown keys are errors");
    }

    #[test]
    fn runtime_change_applies_to_new_frames_only() {
        let mut l = link(r#"{"delay_s": 0.05}"#);
        assert_eq!(depart(l.admit(0, 100)), 50 * MS);
        l.set_props(serde_json::from_str(r#"{"delay_s": 0.01}"#).unwrap()).unwrap();
        // Without reordering the new, shorter delay cannot overtake the frame in flight.
        assert_eq!(depart(l.admit(MS, 100)), 50 * MS);
        assert_eq!(depart(l.admit(60 * MS, 100)), 70 * MS);
        l.set_props(serde_json::from_str(r#"{"loss": 1.0}"#).unwrap()).unwrap();
        assert_eq!(l.admit(80 * MS, 100), Verdict::Lost);
    }
}
