//! Latency summaries, printed the way the published numbers are: avg, min … max, p75, p99.

use serde::Serialize;
use std::time::Duration;

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub n: usize,
    pub avg_ms: f64,
    pub min_ms: f64,
    pub p50_ms: f64,
    pub p75_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Summary {
    pub fn of(samples: &[Duration]) -> Summary {
        let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
        ms.sort_by(|a, b| a.total_cmp(b));
        let n = ms.len();
        let pct = |p: f64| -> f64 {
            if n == 0 {
                return 0.0;
            }
            ms[(((n as f64) * p).ceil() as usize).clamp(1, n) - 1]
        };
        Summary {
            n,
            avg_ms: if n == 0 {
                0.0
            } else {
                ms.iter().sum::<f64>() / n as f64
            },
            min_ms: ms.first().copied().unwrap_or(0.0),
            p50_ms: pct(0.50),
            p75_ms: pct(0.75),
            p99_ms: pct(0.99),
            max_ms: ms.last().copied().unwrap_or(0.0),
        }
    }

    /// `12.34 ms (1.20 … 40.00), p75 13.00, p99 38.00`
    pub fn cells(&self) -> [String; 4] {
        [
            format!("{:.2}", self.avg_ms),
            format!("{:.2} … {:.2}", self.min_ms, self.max_ms),
            format!("{:.2}", self.p75_ms),
            format!("{:.2}", self.p99_ms),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let s: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let sum = Summary::of(&s);
        assert_eq!(sum.n, 100);
        assert!((sum.avg_ms - 50.5).abs() < 1e-9);
        assert!((sum.p75_ms - 75.0).abs() < 1e-9);
        assert!((sum.p99_ms - 99.0).abs() < 1e-9);
        assert!((sum.max_ms - 100.0).abs() < 1e-9);
        assert_eq!(Summary::of(&[]).n, 0);
    }
}
