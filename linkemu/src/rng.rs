//! A small seeded PRNG (xoshiro256**, seeded through splitmix64) and the samplers the links
//! need. Deterministic for a given seed, so tests and runs are reproducible.

pub struct Rng {
    s: [u64; 4],
    spare_normal: Option<f64>,
}

fn splitmix64(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        let s = [splitmix64(&mut x), splitmix64(&mut x), splitmix64(&mut x), splitmix64(&mut x)];
        Rng { s, spare_normal: None }
    }

    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (p >= 1.0 || self.uniform() < p)
    }

    /// Standard normal (Box-Muller; the second value is kept for the next call).
    pub fn normal(&mut self) -> f64 {
        if let Some(z) = self.spare_normal.take() {
            return z;
        }
        let u1 = 1.0 - self.uniform(); // (0, 1]: ln is finite
        let u2 = self.uniform();
        let r = (-2.0 * u1.ln()).sqrt();
        let theta = 2.0 * std::f64::consts::PI * u2;
        self.spare_normal = Some(r * theta.sin());
        r * theta.cos()
    }

    /// Pareto with shape 3 (scale 1), shifted and scaled to mean 0 and standard deviation 1:
    /// bounded below (-0.577), heavy right tail.
    pub fn pareto_std(&mut self) -> f64 {
        const ALPHA: f64 = 3.0;
        const MEAN: f64 = 1.5; // alpha / (alpha - 1)
        const STD: f64 = 0.866_025_403_784_438_6; // sqrt(alpha / ((alpha - 1)^2 (alpha - 2)))
        let u = 1.0 - self.uniform();
        (u.powf(-1.0 / ALPHA) - MEAN) / STD
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moments(xs: &[f64]) -> (f64, f64) {
        let n = xs.len() as f64;
        let mean = xs.iter().sum::<f64>() / n;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
        (mean, var.sqrt())
    }

    #[test]
    fn same_seed_same_stream() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert_ne!(Rng::new(7).next_u64(), Rng::new(8).next_u64());
    }

    #[test]
    fn samplers_have_the_documented_moments() {
        let mut r = Rng::new(1);
        let u: Vec<f64> = (0..200_000).map(|_| r.uniform()).collect();
        assert!(u.iter().all(|x| (0.0..1.0).contains(x)));
        let (m, _) = moments(&u);
        assert!((m - 0.5).abs() < 0.005, "{m}");
        let n: Vec<f64> = (0..200_000).map(|_| r.normal()).collect();
        let (m, s) = moments(&n);
        assert!(m.abs() < 0.01 && (s - 1.0).abs() < 0.01, "{m} {s}");
        let p: Vec<f64> = (0..400_000).map(|_| r.pareto_std()).collect();
        let (m, s) = moments(&p);
        // A shape-3 Pareto has an infinite fourth moment: the sample std converges slowly.
        assert!(m.abs() < 0.02 && (s - 1.0).abs() < 0.1, "{m} {s}");
        assert!(p.iter().all(|x| *x >= -0.5774));
    }
}
