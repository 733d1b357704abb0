//! Portable kernels: the fallback on any CPU, and what the SIMD kernels are tested against. Integer
//! sums are exact, so these differ from the SIMD ones only in the order of float additions.

use super::*;

fn q32<F: Block32, T: ActInt>(w: &[u8], x: &[Act32<T>], rows: usize, out: &mut [f32]) {
    each_row(w, x, rows, out, q32_row::<F, T>)
}

fn q32_row<F: Block32, T: ActInt>(w: &[u8], x: &[Act32<T>], out: &mut [f32]) {
    let nb = w.len() / F::BYTES;
    let mut acc = [0.0f32; MAX_ROWS];
    for (b, blk) in w.chunks_exact(F::BYTES).enumerate() {
        let bits = F::dm_bits(blk);
        let d = half::f16::from_bits(bits as u16).to_f32();
        let m = F::min(d, half::f16::from_bits((bits >> 16) as u16).to_f32());
        let v: [i32; QK] = std::array::from_fn(|j| F::value(blk, j));
        for (i, acc) in acc[..out.len()].iter_mut().enumerate() {
            let a = &x[i * nb + b];
            let dot: i32 = v.iter().zip(&a.qs).map(|(&v, q)| v * q.get()).sum();
            *acc += d * a.d * dot as f32 + m * a.s;
        }
    }
    out.copy_from_slice(&acc[..out.len()]);
}

fn qk<F: BlockK, T: ActInt>(w: &[u8], x: &[ActK<T>], rows: usize, out: &mut [f32]) {
    each_row(w, x, rows, out, qk_row::<F, T>)
}

fn qk_row<F: BlockK, T: ActInt>(w: &[u8], x: &[ActK<T>], out: &mut [f32]) {
    let nb = w.len() / F::BYTES;
    let mut acc = [0.0f32; MAX_ROWS];
    for (b, blk) in w.chunks_exact(F::BYTES).enumerate() {
        let s = F::scales(blk);
        let d = half::f16::from_bits(s.dc_bits as u16).to_f32();
        let dc = half::f16::from_bits((s.dc_bits >> 16) as u16).to_f32();
        let v: [i32; QK_K] = std::array::from_fn(|j| F::value(blk, j));
        for (i, acc) in acc[..out.len()].iter_mut().enumerate() {
            let a = &x[i * nb + b];
            // 16-bit activations times scaled 6-bit values overflow i32 over a block.
            let (mut dot, mut corr) = (0i64, 0.0f32);
            for g in 0..QK_K / 16 {
                let vq = v[16 * g..16 * g + 16].iter().zip(&a.qs[16 * g..16 * g + 16]);
                dot += s.sc[g] as i64 * vq.map(|(&v, q)| v * q.get()).sum::<i32>() as i64;
                corr += s.c[g] as f32 * a.bsums[g];
            }
            *acc += a.d * (d * dot as f32 - dc * corr);
        }
    }
    out.copy_from_slice(&acc[..out.len()]);
}

fn float<F: Float>(w: &[u8], x: &[f32], rows: usize, out: &mut [f32]) {
    each_row(w, x, rows, out, float_row::<F>)
}

fn float_row<F: Float>(w: &[u8], x: &[f32], out: &mut [f32]) {
    let k = w.len() / F::BYTES;
    for (i, o) in out.iter_mut().enumerate() {
        let xi = &x[i * k..(i + 1) * k];
        // Eight partial sums let the compiler vectorize without reassociating floats itself.
        let mut acc = [0.0f32; 8];
        for (j, &xv) in xi.iter().enumerate() {
            acc[j % 8] += F::value(w, j) * xv;
        }
        *o = acc.iter().sum();
    }
}

pub(crate) const KERNELS: Kernels = kernels!(q32, qk, Order::Natural, |d| select!(float: d, float));
