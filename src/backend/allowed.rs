//! Which tokens each output row may take: one bitset per row, as a grammar gives it. The
//! backend sets every other logit of the row to -inf before anything reads the row, so argmax,
//! top-k and draws see only allowed tokens and nothing of size rows x vocabulary leaves a GPU.

/// Bit `t % 32` of word `t / 32` of a row is set where token `t` is allowed (the layout of a
/// grammar engine's token sets, so they are copied in as they are).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Allowed {
    cols: usize,
    bits: Vec<u32>,
}

impl Allowed {
    /// No rows yet, over `cols` tokens.
    pub fn new(cols: usize) -> Self {
        Allowed { cols, bits: Vec::new() }
    }

    /// Words a row takes.
    pub fn words(&self) -> usize {
        self.cols.div_ceil(32)
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn rows(&self) -> usize {
        self.bits.len() / self.words().max(1)
    }

    /// `rows` rows over `cols` tokens of which only the last is masked, by `bits`: a causal
    /// batch whose last row alone picks the next token.
    pub fn last_of(cols: usize, rows: usize, bits: &[u32]) -> Self {
        let mut a = Allowed::new(cols);
        (1..rows).for_each(|_| a.push_all());
        a.push(bits);
        a
    }

    /// Add a row allowing the tokens set in `bits` (shorter: the rest disallowed; bits past
    /// `cols` are ignored).
    pub fn push(&mut self, bits: &[u32]) {
        let words = self.words();
        let start = self.bits.len();
        self.bits.extend(bits.iter().take(words));
        self.bits.resize(start + words, 0);
    }

    /// Add a row allowing every token.
    pub fn push_all(&mut self) {
        let words = self.words();
        self.bits.resize(self.bits.len() + words, u32::MAX);
    }

    /// Row `r`'s words.
    pub fn row(&self, r: usize) -> &[u32] {
        &self.bits[r * self.words()..(r + 1) * self.words()]
    }

    /// Every row's words, row after row.
    pub fn bits(&self) -> &[u32] {
        &self.bits
    }

    pub fn allows(&self, r: usize, token: u32) -> bool {
        (token as usize) < self.cols && self.row(r)[token as usize / 32] >> (token % 32) & 1 == 1
    }

    /// The same rows over the columns of a pruned head, column `c` being token `tokens[c]`.
    pub fn for_head(&self, tokens: &[u32]) -> Allowed {
        let mut head = Allowed::new(tokens.len());
        for r in 0..self.rows() {
            let mut row = vec![0u32; head.words()];
            for (c, &t) in tokens.iter().enumerate() {
                if self.allows(r, t) {
                    row[c / 32] |= 1 << (c % 32);
                }
            }
            head.push(&row);
        }
        head
    }

    /// Set every disallowed value of the row-major `rows x cols` logits to -inf (the CPU's op,
    /// and the reference the GPU kernel is tested against).
    pub fn apply(&self, logits: &mut [f32]) {
        for (r, row) in logits.chunks_exact_mut(self.cols.max(1)).enumerate().take(self.rows()) {
            for (t, l) in row.iter_mut().enumerate() {
                if !self.allows(r, t as u32) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_mask_their_own_tokens_and_follow_a_pruned_head() {
        let mut a = Allowed::new(40);
        a.push(&[0b1010, 1 << 3]); // tokens 1, 3 and 35
        a.push_all();
        assert_eq!((a.rows(), a.words()), (2, 2));
        assert!(a.allows(0, 35) && !a.allows(0, 34) && a.allows(1, 39) && !a.allows(1, 40));
        let mut logits: Vec<f32> = (0..80).map(|i| i as f32).collect();
        a.apply(&mut logits);
        let kept: Vec<usize> = (0..40).filter(|&t| logits[t].is_finite()).collect();
        assert_eq!(kept, vec![1, 3, 35]);
        assert!(logits[40..].iter().all(|l| l.is_finite()));
        let head = a.for_head(&[35, 2, 3]);
        assert_eq!((head.row(0)[0], head.row(1)[0]), (0b101, 0b111));
    }

    #[test]
    fn a_top_k_ranks_its_allowed_tokens_first() {
        let mut top = crate::backend::TopK::of(&[5.0, 4.0, 3.0, 2.0, 1.0, 0.0, 1.0, 2.0], 4, 3, 1.0, &[crate::backend::NO_SLOT; 2]);
        let mut a = Allowed::new(4);
        a.push(&[0b0110]); // tokens 1 and 2
        a.push(&[0b0001]); // token 0
        top.keep_allowed(&a);
        assert_eq!(top.row(0).0, &[1, 2, 0]);
        assert_eq!(top.row(0).1[..2], [4.0, 3.0]);
        assert_eq!(top.row(0).1[2], f32::NEG_INFINITY);
        assert_eq!(top.row(1).0[0], 0);
    }
}
