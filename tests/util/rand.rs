//! Seeded random test inputs, on the library's own generator.

use saguaro::sampling::Rng;

pub struct TestRng(Rng);

impl TestRng {
    pub fn new(seed: u64) -> Self {
        TestRng(Rng::new(seed))
    }
    pub fn next(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        2.0 * self.0.uniform() - 1.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uniform()).collect()
    }
    /// Uniform in 0..n.
    pub fn below(&mut self, n: u32) -> u32 {
        (self.next() % n as u64) as u32
    }
    /// Heavy-tailed like real activations: mostly small, some up to 20x larger.
    pub fn activation(&mut self) -> f32 {
        let v = self.uniform();
        if self.next().is_multiple_of(64) {
            20.0 * v
        } else {
            v
        }
    }
}
