//! bfloat16 weights and their matrix products: `y = x · W` with `W` stored in bfloat16 (half the
//! bytes of float32, which is what a memory-bound decode step pays for) and `x`, `y` and every
//! accumulation in float32.
//!
//! Layout: the `[inputs, outputs]` matrix in panels of [`PANEL`] output columns, each panel
//! `[inputs][PANEL]` contiguous (the last padded with zeros), so one panel streams from memory
//! in order and stays in cache while every row block reads it. Within a panel's row the 32
//! values are interleaved so that 32-bit lane `i` holds column `i` in its low half and column
//! `16 + i` in its high half: widening to float32 is then one shift (low halves) and one mask
//! (high halves) per 16 columns.
//!
//! Kernels, chosen at run time: AVX-512F, AVX2 with FMA, and a portable one. All compute each
//! output as `acc = fma(x[k], w[k], acc)` for `k` in order from 0 (then `y += acc` when
//! accumulating), so they agree to the bit, and a row's result depends neither on the other
//! rows in its block nor on how the threads split the columns.

use gemm::Parallelism;

/// Output columns per panel.
pub(crate) const PANEL: usize = 32;

/// Rows of `x` per register block of the SIMD kernels.
const ROW_BLOCK: usize = 8;

/// `value` rounded to the nearest bfloat16, ties to even (as PyTorch's conversion); NaN stays a
/// (quiet) NaN. Branch-free (a select), so the loops of a refill and a check vectorise.
#[inline]
pub fn to_bf16(value: f32) -> u16 {
    let bits = value.to_bits();
    let quiet_nan = ((bits >> 16) as u16) | 0x40;
    let rounding = 0x7FFF + ((bits >> 16) & 1);
    let rounded = (bits.wrapping_add(rounding) >> 16) as u16;
    if value.is_nan() { quiet_nan } else { rounded }
}

/// The float32 value of a bfloat16.
pub fn from_bf16(value: u16) -> f32 {
    f32::from_bits((value as u32) << 16)
}

/// Rounds a row-major `[inputs, outputs]` float32 matrix to bfloat16 in the panel layout.
pub(crate) fn pack(inputs: usize, outputs: usize, data: &[f32]) -> Vec<u16> {
    let mut packed = vec![0u16; outputs.div_ceil(PANEL) * inputs * PANEL];
    pack_into(inputs, outputs, data, &mut packed);
    packed
}

/// [`pack`] into `packed` (of [`pack`]'s length), keeping its memory: the padding columns
/// of the last panel are never written, so they stay the zeros [`pack`] wrote.
pub(crate) fn pack_into(inputs: usize, outputs: usize, data: &[f32], packed: &mut [u16]) {
    assert_eq!(packed.len(), outputs.div_ceil(PANEL) * inputs * PANEL, "a packed {inputs} x {outputs} matrix's length");
    pack_rows(inputs, outputs, data, 0, packed);
}

/// [`pack_into`] of the stored rows (`PANEL` values each, row `p * inputs + k` holding row `k`
/// of panel `p`) from `first` on, `packed` being theirs: a thread's share of a refill.
pub(crate) fn pack_rows(inputs: usize, outputs: usize, data: &[f32], first: usize, packed: &mut [u16]) {
    for (i, to) in packed.chunks_exact_mut(PANEL).enumerate() {
        let (from, columns) = stored_row(inputs, outputs, first + i);
        if columns == PANEL {
            // A whole panel row: columns j and 16 + j side by side (the interleaved layout).
            let (low, high) = data[from..from + PANEL].split_at(16);
            for (pair, (&l, &h)) in to.chunks_exact_mut(2).zip(low.iter().zip(high)) {
                (pair[0], pair[1]) = (to_bf16(l), to_bf16(h));
            }
        } else {
            (0..columns).for_each(|j| to[slot(j)] = to_bf16(data[from + j]));
        }
    }
}

/// The row-major `[inputs, outputs]` values that `packed` ([`pack`]'s layout) holds, widened
/// to float32 (exactly): the matrix a libtorch pass reads from the same bfloat16 weights.
pub(crate) fn unpack(inputs: usize, outputs: usize, packed: &[u16]) -> Vec<f32> {
    assert_eq!(packed.len(), outputs.div_ceil(PANEL) * inputs * PANEL, "a packed {inputs} x {outputs} matrix's length");
    let mut data = vec![0f32; inputs * outputs];
    for (stored, row) in packed.chunks_exact(PANEL).enumerate() {
        let (from, columns) = stored_row(inputs, outputs, stored);
        (0..columns).for_each(|j| data[from + j] = from_bf16(row[slot(j)]));
    }
    data
}

/// Whether `packed` holds `data` as [`pack_into`] writes it, bit for bit (padding not read).
pub(crate) fn holds(inputs: usize, outputs: usize, data: &[f32], packed: &[u16]) -> bool {
    assert_eq!(packed.len(), outputs.div_ceil(PANEL) * inputs * PANEL, "a packed {inputs} x {outputs} matrix's length");
    holds_rows(inputs, outputs, data, 0, packed)
}

/// [`holds`] for the stored rows from `first` on that `packed` is (see [`pack_rows`]): every
/// difference is or-ed together (no early exit, so the loop vectorises).
pub(crate) fn holds_rows(inputs: usize, outputs: usize, data: &[f32], first: usize, packed: &[u16]) -> bool {
    let mut differ = 0u16;
    for (i, held) in packed.chunks_exact(PANEL).enumerate() {
        let (from, columns) = stored_row(inputs, outputs, first + i);
        if columns == PANEL {
            let (low, high) = data[from..from + PANEL].split_at(16);
            for (pair, (&l, &h)) in held.chunks_exact(2).zip(low.iter().zip(high)) {
                differ |= (pair[0] ^ to_bf16(l)) | (pair[1] ^ to_bf16(h));
            }
        } else {
            (0..columns).for_each(|j| differ |= held[slot(j)] ^ to_bf16(data[from + j]));
        }
    }
    differ == 0
}

/// Where stored row `stored` (row `k` of panel `p`, `stored = p * inputs + k`) starts in the
/// row-major data, and how many of its columns are real (the last panel's may be fewer).
fn stored_row(inputs: usize, outputs: usize, stored: usize) -> (usize, usize) {
    let (p, k) = (stored / inputs, stored % inputs);
    assert!(p * PANEL < outputs, "stored row {stored} of a {inputs} x {outputs} matrix");
    (k * outputs + p * PANEL, PANEL.min(outputs - p * PANEL))
}

/// Where column `j` of a panel's row is stored (see the module's documentation).
fn slot(j: usize) -> usize {
    if j < 16 { 2 * j } else { 2 * (j - 16) + 1 }
}

/// `out[m, outputs] = x[m, inputs] · W` (or `+=` with `accumulate`) for `W` packed by [`pack`].
pub(crate) fn apply(packed: &[u16], inputs: usize, outputs: usize, x: &[f32], out: &mut [f32], accumulate: bool, parallelism: Parallelism) {
    let m = x.len() / inputs;
    let panels = outputs.div_ceil(PANEL);
    let tasks = match parallelism {
        Parallelism::None => 1,
        Parallelism::Rayon(0) => rayon::current_num_threads(),
        Parallelism::Rayon(n) => n,
    }
    .clamp(1, panels);
    let out_ptr = SharedOut(out.as_mut_ptr());
    let job = |task: usize| {
        let (first, last) = (task * panels / tasks, (task + 1) * panels / tasks);
        for p in first..last {
            let panel = &packed[p * inputs * PANEL..][..inputs * PANEL];
            let columns = PANEL.min(outputs - p * PANEL);
            // SAFETY: each task writes only the columns of its own panels, so no two tasks
            // write the same element; `out` holds m x outputs floats (checked by the caller).
            unsafe { panel_product(panel, inputs, x, m, out_ptr.at(p * PANEL), outputs, columns, accumulate) };
        }
    };
    match tasks {
        1 => job(0),
        _ => rayon::scope(|scope| {
            for task in 1..tasks {
                scope.spawn(move |_| job(task));
            }
            job(0);
        }),
    }
}

/// `out`'s pointer, shared by the tasks that write disjoint columns of it.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);

// SAFETY: the tasks write disjoint elements (see `apply`).
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

impl SharedOut {
    fn at(self, offset: usize) -> *mut f32 {
        // SAFETY (of the callers' use): offset is a column index below `outputs`.
        self.0.wrapping_add(offset)
    }
}

/// One panel's `columns` outputs for every row of `x`, through the best kernel this CPU has.
///
/// SAFETY: `out` points at column 0 of the panel in row 0 of an `m x stride` row-major buffer.
#[allow(clippy::too_many_arguments)]
unsafe fn panel_product(panel: &[u16], inputs: usize, x: &[f32], m: usize, out: *mut f32, stride: usize, columns: usize, accumulate: bool) {
    let kernel = kernel();
    let mut row = 0;
    while row < m {
        let rows = ROW_BLOCK.min(m - row);
        let mut acc = [[0f32; PANEL]; ROW_BLOCK];
        let block = &x[row * inputs..(row + rows) * inputs];
        match kernel {
            // SAFETY: the CPU has the features these kernels are compiled for (checked).
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx512 => unsafe { x86::block_avx512(panel, inputs, block, &mut acc[..rows]) },
            #[cfg(target_arch = "x86_64")]
            Kernel::Avx2 => unsafe { x86::block_avx2(panel, inputs, block, &mut acc[..rows]) },
            Kernel::Portable => block_portable(panel, inputs, block, &mut acc[..rows]),
        }
        for (r, acc) in acc[..rows].iter().enumerate() {
            // SAFETY: row `row + r` < m and column `j` < columns <= the panel's width in `out`.
            let y = unsafe { std::slice::from_raw_parts_mut(out.add((row + r) * stride), columns) };
            for (y, a) in y.iter_mut().zip(acc) {
                *y = if accumulate { *y + a } else { *a };
            }
        }
        row += rows;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kernel {
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    Portable,
}

/// The kernel for this CPU (detected once).
pub(crate) fn kernel() -> Kernel {
    static CHOSEN: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") {
                return Kernel::Avx512;
            }
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                return Kernel::Avx2;
            }
        }
        Kernel::Portable
    })
}

/// The portable kernel: the same fused multiply-adds in the same order as the SIMD ones.
pub(crate) fn block_portable(panel: &[u16], inputs: usize, x: &[f32], acc: &mut [[f32; PANEL]]) {
    for (r, acc) in acc.iter_mut().enumerate() {
        let x = &x[r * inputs..(r + 1) * inputs];
        for (k, &xk) in x.iter().enumerate() {
            let w = &panel[k * PANEL..(k + 1) * PANEL];
            for (j, a) in acc.iter_mut().enumerate() {
                *a = xk.mul_add(from_bf16(w[slot(j)]), *a);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    use super::PANEL;

    /// AVX-512F: 16 columns per register, two registers per row.
    #[target_feature(enable = "avx512f")]
    pub(crate) fn block_avx512(panel: &[u16], inputs: usize, x: &[f32], acc: &mut [[f32; PANEL]]) {
        macro_rules! rows {
            ($($n:literal),*) => {
                match acc.len() {
                    $($n => rows_avx512::<$n>(panel, inputs, x, acc),)*
                    _ => unreachable!("a row block holds 1 to 8 rows"),
                }
            };
        }
        rows!(1, 2, 3, 4, 5, 6, 7, 8)
    }

    #[target_feature(enable = "avx512f")]
    fn rows_avx512<const R: usize>(panel: &[u16], inputs: usize, x: &[f32], acc: &mut [[f32; PANEL]]) {
        assert!(panel.len() >= inputs * PANEL && x.len() >= R * inputs && acc.len() == R);
        let mut lo = [_mm512_setzero_ps(); R];
        let mut hi = [_mm512_setzero_ps(); R];
        let high_half = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
        for k in 0..inputs {
            // SAFETY: 32 u16 at k * PANEL lie in the panel (asserted above).
            let raw = unsafe { _mm512_loadu_si512(panel.as_ptr().add(k * PANEL).cast()) };
            let w_lo = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(raw));
            let w_hi = _mm512_castsi512_ps(_mm512_and_si512(raw, high_half));
            for r in 0..R {
                // SAFETY: r * inputs + k < R * inputs <= x.len() (asserted above).
                let xk = _mm512_set1_ps(unsafe { *x.get_unchecked(r * inputs + k) });
                lo[r] = _mm512_fmadd_ps(xk, w_lo, lo[r]);
                hi[r] = _mm512_fmadd_ps(xk, w_hi, hi[r]);
            }
        }
        for r in 0..R {
            // SAFETY: each row of acc holds 32 floats.
            unsafe {
                _mm512_storeu_ps(acc[r].as_mut_ptr(), lo[r]);
                _mm512_storeu_ps(acc[r].as_mut_ptr().add(16), hi[r]);
            }
        }
    }

    /// AVX2 with FMA: 8 columns per register, four registers per row, four rows at a time.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn block_avx2(panel: &[u16], inputs: usize, x: &[f32], acc: &mut [[f32; PANEL]]) {
        for (block, x) in acc.chunks_mut(4).zip(x.chunks(4 * inputs)) {
            match block.len() {
                4 => rows_avx2::<4>(panel, inputs, x, block),
                3 => rows_avx2::<3>(panel, inputs, x, block),
                2 => rows_avx2::<2>(panel, inputs, x, block),
                _ => rows_avx2::<1>(panel, inputs, x, block),
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    fn rows_avx2<const R: usize>(panel: &[u16], inputs: usize, x: &[f32], acc: &mut [[f32; PANEL]]) {
        assert!(panel.len() >= inputs * PANEL && x.len() >= R * inputs && acc.len() == R);
        // Registers per row: columns 0-7, 8-15, 16-23, 24-31.
        let mut sums = [[_mm256_setzero_ps(); 4]; R];
        let high_half = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
        for k in 0..inputs {
            // SAFETY: 32 u16 at k * PANEL lie in the panel (asserted above).
            let (a, b) = unsafe {
                let at = panel.as_ptr().add(k * PANEL);
                (_mm256_loadu_si256(at.cast()), _mm256_loadu_si256(at.add(16).cast()))
            };
            let w = [
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(a)),
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(b)),
                _mm256_castsi256_ps(_mm256_and_si256(a, high_half)),
                _mm256_castsi256_ps(_mm256_and_si256(b, high_half)),
            ];
            for r in 0..R {
                // SAFETY: r * inputs + k < R * inputs <= x.len() (asserted above).
                let xk = _mm256_set1_ps(unsafe { *x.get_unchecked(r * inputs + k) });
                for (s, w) in sums[r].iter_mut().zip(w) {
                    *s = _mm256_fmadd_ps(xk, w, *s);
                }
            }
        }
        for r in 0..R {
            for (i, s) in sums[r].iter().enumerate() {
                // SAFETY: each row of acc holds 32 floats; i * 8 + 8 <= 32.
                unsafe { _mm256_storeu_ps(acc[r].as_mut_ptr().add(i * 8), *s) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_to_nearest_even_as_pytorch() {
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to the even mantissa (1).
        assert_eq!(from_bf16(to_bf16(1.0 + 2f32.powi(-8))), 1.0);
        // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to 1 + 2^-6 (even).
        assert_eq!(from_bf16(to_bf16(1.0 + 3.0 * 2f32.powi(-8))), 1.0 + 2f32.powi(-6));
        // Just above a tie rounds up.
        assert_eq!(from_bf16(to_bf16(1.0 + 2f32.powi(-8) + 2f32.powi(-20))), 1.0 + 2f32.powi(-7));
        assert_eq!(from_bf16(to_bf16(-2.5)), -2.5);
        assert!(from_bf16(to_bf16(f32::NAN)).is_nan());
        assert_eq!(from_bf16(to_bf16(f32::INFINITY)), f32::INFINITY);
        // The largest finite float32 rounds to infinity, as PyTorch's conversion.
        assert_eq!(from_bf16(to_bf16(f32::MAX)), f32::INFINITY);
        // Every bfloat16 survives the round trip.
        for bits in (0..=u16::MAX).filter(|b| !from_bf16(*b).is_nan()) {
            assert_eq!(to_bf16(from_bf16(bits)), bits);
        }
    }

    /// Unpacking gives back each value rounded to bfloat16, in its row-major place, for a whole
    /// and a partial last panel (40 columns) and a single column.
    #[test]
    fn unpack_gives_the_rounded_matrix_back() {
        for (inputs, outputs) in [(3, 40), (5, 32), (2, 1)] {
            let data: Vec<f32> = (0..inputs * outputs).map(|i| value(i) * 3.7).collect();
            let rounded: Vec<u32> = data.iter().map(|&v| from_bf16(to_bf16(v)).to_bits()).collect();
            let back: Vec<u32> = unpack(inputs, outputs, &pack(inputs, outputs, &data)).iter().map(|v| v.to_bits()).collect();
            assert_eq!(back, rounded, "{inputs} x {outputs}");
        }
    }

    /// A deterministic pseudo-random value in [-1, 1).
    fn value(i: usize) -> f32 {
        let h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
        h as f32 / (1u64 << 23) as f32 - 1.0
    }

    #[test]
    fn every_kernel_matches_float64_products_of_the_rounded_weights_and_each_other() {
        // Shapes with a partial last panel and a partial last row block.
        let (inputs, outputs) = (37, 75);
        let w: Vec<f32> = (0..inputs * outputs).map(value).collect();
        let packed = pack(inputs, outputs, &w);
        for m in [1, 3, 8, 13] {
            let x: Vec<f32> = (0..m * inputs).map(|i| value(i + 1_000_000)).collect();
            let start: Vec<f32> = (0..m * outputs).map(|i| value(i + 2_000_000)).collect();
            let mut reference = vec![0f64; m * outputs];
            for r in 0..m {
                for c in 0..outputs {
                    let dot: f64 = (0..inputs).map(|k| x[r * inputs + k] as f64 * from_bf16(to_bf16(w[k * outputs + c])) as f64).sum();
                    reference[r * outputs + c] = start[r * outputs + c] as f64 + dot;
                }
            }
            let mut results = Vec::new();
            for parallelism in [Parallelism::None, Parallelism::Rayon(2), Parallelism::Rayon(3)] {
                let mut out = start.clone();
                apply(&packed, inputs, outputs, &x, &mut out, true, parallelism);
                let worst = out.iter().zip(&reference).map(|(o, r)| (*o as f64 - r).abs()).fold(0.0, f64::max);
                // float32 accumulation of 37 terms of magnitude <= 1: well within 1e-5.
                assert!(worst < 1e-5, "m {m}, {parallelism:?}: off float64 by {worst}");
                results.push(out);
            }
            // The portable kernel on its own gives the same bits as the chosen one.
            let mut portable = start.clone();
            for r in 0..m {
                for p in 0..outputs.div_ceil(PANEL) {
                    let mut acc = [[0f32; PANEL]; 1];
                    block_portable(&packed[p * inputs * PANEL..][..inputs * PANEL], inputs, &x[r * inputs..(r + 1) * inputs], &mut acc);
                    for j in 0..PANEL.min(outputs - p * PANEL) {
                        portable[r * outputs + p * PANEL + j] += acc[0][j];
                    }
                }
            }
            // The AVX2 kernel is checked only where the processor has it; say which ran, so a log
            // from a machine without it does not read as a check of both.
            #[cfg(target_arch = "x86_64")]
            let avx2 = std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma");
            #[cfg(not(target_arch = "x86_64"))]
            let avx2 = false;
            println!("m {m}: chosen kernel {:?}; portable checked; AVX2 kernel {}", kernel(), if avx2 { "checked" } else { "NOT checked (this processor lacks AVX2+FMA)" });
            #[cfg(target_arch = "x86_64")]
            if avx2 {
                for r in 0..m {
                    for p in 0..outputs.div_ceil(PANEL) {
                        let mut acc = [[0f32; PANEL]; 1];
                        // SAFETY: the CPU has AVX2 and FMA (checked).
                        unsafe { x86::block_avx2(&packed[p * inputs * PANEL..][..inputs * PANEL], inputs, &x[r * inputs..(r + 1) * inputs], &mut acc) };
                        let expected = &portable[r * outputs + p * PANEL..][..PANEL.min(outputs - p * PANEL)];
                        let start = &start[r * outputs + p * PANEL..];
                        for (j, e) in expected.iter().enumerate() {
                            assert_eq!((start[j] + acc[0][j]).to_bits(), e.to_bits(), "AVX2 and portable kernels differ");
                        }
                    }
                }
            }
            for out in &results {
                assert!(out.iter().zip(&portable).all(|(a, b)| a.to_bits() == b.to_bits()), "m {m}: {:?} and the portable kernel differ", kernel());
            }
        }
    }
}
