//! Whole-model checks of weights in one pass at memory speed (this crate is always built
//! optimised): the fingerprint's sums and a bitwise comparison.

/// Values per chunk of [`sums`]: a weight is summed chunk by chunk and the chunks' sums are
/// added in order, so threads may sum its chunks (`check.rs`) with the same bits as one.
pub(crate) const CHUNK: usize = 1 << 16;

/// The sum and the sum of squares of `values` in float64 (each value widened, then squared):
/// per chunk of [`CHUNK`] values, eight interleaved partial sums (value `i` in sum `i % 8`)
/// added in order; then the chunks' sums added in order. One pass at memory speed, the same
/// bits for the same values whatever the thread count or machine. (libtorch's
/// `sum(Kind::Double)` of a float32 tensor casts it whole to float64 first: two of those per
/// tensor made the fingerprint cost more than folding the weights.)
pub fn sums<T: Copy + Into<f64>>(values: &[T]) -> (f64, f64) {
    sums_by(values, |&v| v.into())
}

/// [`sums`] of `values` widened to float64 by `widen` (bfloat16's bits, for one).
pub(crate) fn sums_by<T>(values: &[T], widen: impl Fn(&T) -> f64) -> (f64, f64) {
    added(values.chunks(CHUNK).map(|chunk| chunk_sums(chunk, &widen)))
}

/// One chunk's sums: eight interleaved partial sums added in order.
pub(crate) fn chunk_sums<T>(values: &[T], widen: impl Fn(&T) -> f64) -> (f64, f64) {
    let (mut sum, mut squares) = ([0f64; 8], [0f64; 8]);
    let chunks = values.chunks_exact(8);
    let rest = chunks.remainder();
    for chunk in chunks {
        for lane in 0..8 {
            let x = widen(&chunk[lane]);
            sum[lane] += x;
            squares[lane] += x * x;
        }
    }
    for (lane, value) in rest.iter().enumerate() {
        let x = widen(value);
        sum[lane] += x;
        squares[lane] += x * x;
    }
    (sum.iter().sum(), squares.iter().sum())
}

/// Chunks' sums added in order (the first as it is, so one chunk's sums are the weight's).
pub(crate) fn added(chunks: impl Iterator<Item = (f64, f64)>) -> (f64, f64) {
    chunks.reduce(|(sum, squares), (s, q)| (sum + s, squares + q)).unwrap_or((0.0, 0.0))
}

/// Whether `a` and `b` hold the same float32 values bit for bit (NaNs by their bits).
pub fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}
