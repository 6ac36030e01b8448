//! Whole-model checks of weights in one pass at memory speed (this crate is always built
//! optimised): the fingerprint's sums and a bitwise comparison.

/// The sum and the sum of squares of `values` in float64 (each value widened, then squared),
/// over eight interleaved partial sums (value `i` in sum `i % 8`) added in order: one pass at
/// memory speed, the same bits for the same values whatever the thread count or machine.
/// (libtorch's `sum(Kind::Double)` of a float32 tensor casts it whole to float64 first: two
/// of those per tensor made the fingerprint cost more than folding the weights.)
pub fn sums<T: Copy + Into<f64>>(values: &[T]) -> (f64, f64) {
    let (mut sum, mut squares) = ([0f64; 8], [0f64; 8]);
    let chunks = values.chunks_exact(8);
    let rest = chunks.remainder();
    for chunk in chunks {
        for lane in 0..8 {
            let x: f64 = chunk[lane].into();
            sum[lane] += x;
            squares[lane] += x * x;
        }
    }
    for (lane, &value) in rest.iter().enumerate() {
        let x: f64 = value.into();
        sum[lane] += x;
        squares[lane] += x * x;
    }
    (sum.iter().sum(), squares.iter().sum())
}

/// Whether `a` and `b` hold the same float32 values bit for bit (NaNs by their bits).
pub fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Matrix;

    /// The sums are those of the float64 formula (values exact in float64, so any order gives
    /// the same), and a refilled matrix is the one built from the new values, bfloat16 panels
    /// included (padding columns stay zero).
    #[test]
    fn sums_and_refilled_matrices_match_their_references() {
        let values: Vec<f32> = (0..21).map(|i| i as f32 * 0.5 - 3.0).collect();
        let exact: (f64, f64) = (values.iter().map(|&v| v as f64).sum(), values.iter().map(|&v| (v as f64) * (v as f64)).sum());
        assert_eq!(sums(&values), exact);
        let (inputs, outputs) = (3, 37);
        let old: Vec<f32> = (0..inputs * outputs).map(|i| i as f32).collect();
        let new: Vec<f32> = (0..inputs * outputs).map(|i| 1.0 / (1.0 + i as f32)).collect();
        let mut float32 = Matrix::new(inputs, outputs, old.clone());
        float32.refill(&new);
        assert!(same_bits(float32.float32().unwrap(), &new));
        let mut bfloat16 = Matrix::bfloat16(inputs, outputs, &old);
        bfloat16.refill(&new);
        let (crate::model::Weights::Bfloat16(refilled), crate::model::Weights::Bfloat16(built)) = (&bfloat16.weights, &Matrix::bfloat16(inputs, outputs, &new).weights) else { panic!("bfloat16 matrices") };
        assert_eq!(refilled, built);
        assert!(!same_bits(&new, &old));
    }
}
