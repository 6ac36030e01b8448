//! The fold's transposes on threads: a folded matrix (`[inputs, outputs]` row-major, what the
//! decoders read) written from the `[rows, inputs]` weights it is made of, each value once.
//!
//! The host's fold (`smallrl::model::folded`) made each of them with a few libtorch copies,
//! each a parallel region of its own: a few hundred per refresh, each waiting for every thread,
//! so on a busy machine a descheduled thread stalled every one (seconds where the work is a
//! tenth of one). Here every matrix of the model is cut into tiles of [`TILE`] rows, and the
//! threads take tiles as they come (`check.rs`'s `in_order`): one wait in all.

use std::sync::Mutex;

use crate::check::in_order;

/// Rows of a folded matrix per unit of work: one 64-byte line of each source row it reads.
const TILE: usize = 16;

/// Columns of a folded matrix taken from the rows of one `[rows, inputs]` row-major weight:
/// column `c` of the block is row `rows[c].0` of `source`, times `scale` (float32, rounded
/// as `x * scale`) where given, then negated where `rows[c].1` is set.
pub struct Columns<'a> {
    pub source: &'a [f32],
    pub rows: Vec<(u32, bool)>,
    pub scale: Option<f32>,
}

/// A folded matrix to write: `to` holds `inputs` rows of as many columns as its blocks have
/// rows, the blocks side by side in order.
pub struct Folded<'a> {
    pub to: &'a mut [f32],
    pub inputs: usize,
    pub blocks: Vec<Columns<'a>>,
}

/// Writes every matrix of `matrices` on `threads` threads. Panics where a block's source is
/// shorter than its rows need or the blocks' columns do not fill `to`.
pub fn fold_transposed(matrices: Vec<Folded<'_>>, threads: usize) {
    let mut tiles: Vec<Mutex<Box<dyn FnMut() + Send + '_>>> = Vec::new();
    for Folded { to, inputs, blocks } in matrices {
        let outputs: usize = blocks.iter().map(|b| b.rows.len()).sum();
        assert_eq!(to.len(), inputs * outputs, "a folded matrix of {inputs} x {outputs} in {} values", to.len());
        for block in &blocks {
            let highest = block.rows.iter().map(|&(r, _)| r as usize + 1).max().unwrap_or(0);
            assert!(block.source.len() >= highest * inputs, "a block reads row {highest} of a weight of {} values", block.source.len());
        }
        let blocks = std::sync::Arc::new(blocks);
        if outputs == 0 {
            continue;
        }
        for (t, tile) in to.chunks_mut(TILE * outputs).enumerate() {
            let blocks = blocks.clone();
            tiles.push(Mutex::new(Box::new(move || fill_tile(tile, t * TILE, inputs, outputs, &blocks))));
        }
    }
    in_order(tiles.len(), threads, |t| (tiles[t].lock().expect("a fold tile's lock"))());
}

/// Rows `first..` of a folded matrix (`tile`, whole rows of `outputs` columns) from `blocks`,
/// [`TILE`] columns at a time: gathered from their source rows into a square on the stack, then
/// written out as one run of columns per row (each source line read once, each written line
/// filled whole).
fn fill_tile(tile: &mut [f32], first: usize, inputs: usize, outputs: usize, blocks: &[Columns]) {
    let rows = tile.len() / outputs;
    let mut square = [[0f32; TILE]; TILE];
    let mut column = 0;
    for block in blocks {
        for group in block.rows.chunks(TILE) {
            for (k, &(row, negate)) in group.iter().enumerate() {
                let from = &block.source[row as usize * inputs + first..][..rows];
                for (i, &x) in from.iter().enumerate() {
                    let scaled = match block.scale {
                        Some(s) => x * s,
                        None => x,
                    };
                    square[i][k] = if negate { -scaled } else { scaled };
                }
            }
            for (i, values) in square[..rows].iter().enumerate() {
                tile[i * outputs + column..][..group.len()].copy_from_slice(&values[..group.len()]);
            }
            column += group.len();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two blocks (one scaled with negated rows, one plain) over 37 inputs (two whole tiles and
    /// a partial one) give each value as written out by hand, on 1, 2 and 3 threads.
    #[test]
    fn a_folded_matrix_holds_its_blocks_transposed() {
        let inputs = 37;
        let a: Vec<f32> = (0..3 * inputs).map(|i| i as f32 * 0.1 + 0.3).collect();
        let b: Vec<f32> = (0..2 * inputs).map(|i| 1.0 / (1.0 + i as f32)).collect();
        let (rows_a, rows_b) = (vec![(2, true), (0, false), (1, true)], vec![(1, false), (0, false)]);
        let expected: Vec<f32> = (0..inputs)
            .flat_map(|i| {
                let a_part: Vec<f32> = rows_a.iter().map(|&(r, neg): &(u32, bool)| { let v = a[r as usize * inputs + i] * 0.7f32; if neg { -v } else { v } }).collect();
                let b_part: Vec<f32> = rows_b.iter().map(|&(r, _): &(u32, bool)| b[r as usize * inputs + i]).collect();
                a_part.into_iter().chain(b_part)
            })
            .collect();
        for threads in [1, 2, 3] {
            let mut to = vec![f32::NAN; inputs * 5];
            let blocks = vec![Columns { source: &a, rows: rows_a.clone(), scale: Some(0.7) }, Columns { source: &b, rows: rows_b.clone(), scale: None }];
            fold_transposed(vec![Folded { to: &mut to, inputs, blocks }], threads);
            assert!(crate::same_bits(&to, &expected), "{threads} threads");
        }
    }
}
