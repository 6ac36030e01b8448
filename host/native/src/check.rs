//! The weight-delivery check's passes over a whole [`Model`], split over threads: refilling the
//! sampler's copy from the host's values, and comparing it with them bit for bit while summing
//! the fingerprint's sums (one pass: each chunk is compared and summed while in cache).
//!
//! Every weight is cut into chunks of [`CHUNK`] stored values whatever the thread count; the
//! threads take chunks as they come, and a weight's sums are its chunks' added in chunk order
//! ([`crate::sums`] adds the same chunks the same way), so every result is the same bits on any
//! number of threads.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::bf16::{PANEL, from_bf16, holds_rows, pack_rows};
use crate::model::{Matrix, Model, Weight, WeightMut, Weights};
use crate::sums::{CHUNK, added, chunk_sums};

// A chunk of a bfloat16 matrix is whole stored rows of a panel.
const _: () = assert!(CHUNK % PANEL == 0);

impl Model {
    /// Overwrites every weight ([`Model::weights`]'s order) with `values` (row-major float32,
    /// rounded as [`Matrix::refill`] rounds them), keeping their memory, on `threads` threads.
    /// Panics on a count or length that disagrees with the model's.
    pub fn refill(&mut self, values: &[&[f32]], threads: usize) {
        let mut weights = self.weights_mut();
        assert_eq!(weights.len(), values.len(), "refilling {} weights from {} tensors", weights.len(), values.len());
        let mut chunks: Vec<Mutex<Box<dyn FnMut() + Send + '_>>> = Vec::new();
        for (weight, &data) in weights.iter_mut().zip(values) {
            match weight {
                WeightMut::Vector(to) => float32_chunks(to, data, &mut chunks),
                WeightMut::Matrix(m) => {
                    assert_eq!(data.len(), m.inputs * m.outputs, "a {} x {} matrix needs {} values", m.inputs, m.outputs, m.inputs * m.outputs);
                    let (inputs, outputs) = (m.inputs, m.outputs);
                    match &mut m.weights {
                        Weights::Float32(to) => float32_chunks(to, data, &mut chunks),
                        Weights::Bfloat16(packed) => {
                            for (c, to) in packed.chunks_mut(CHUNK).enumerate() {
                                chunks.push(Mutex::new(Box::new(move || pack_rows(inputs, outputs, data, c * CHUNK / PANEL, to))));
                            }
                        }
                    }
                }
            }
        }
        in_order(chunks.len(), threads, |c| (chunks[c].lock().expect("a refill chunk's lock"))());
    }

    /// Whether every weight holds `values` (as [`Model::refill`] stores them) bit for bit; if
    /// so, each weight's [`Matrix::sums`] (or [`crate::sums`] of a vector), from one pass over
    /// both on `threads` threads. The host's delivery uses [`Model::refill_holding`]; this
    /// separate read-only pass is what its tests and benchmark hold it to.
    pub fn holds_with_sums(&self, values: &[&[f32]], threads: usize) -> Option<Vec<(f64, f64)>> {
        let weights = self.weights();
        let lengths_agree = weights.len() == values.len()
            && weights.iter().zip(values).all(|(w, data)| data.len() == match w {
                Weight::Vector(held) => held.len(),
                Weight::Matrix(m) => m.inputs * m.outputs,
            });
        if !lengths_agree {
            return None;
        }
        let per_weight = by_chunks(&weights, threads, |w, c| chunk_check(&weights[w], values[w], c));
        sums_where_every_chunk_holds(per_weight)
    }

    /// [`Model::refill`] and [`Model::holds_with_sums`] in one pass: each chunk is written from
    /// `values`, then read back, compared with them bit for bit and summed while it is in cache
    /// (`write` false, a lost refresh: only compared), so the weights are read from memory once
    /// instead of three times. The same sums, bit for bit, if every weight holds `values`.
    pub fn refill_holding(&mut self, values: &[&[f32]], threads: usize, write: bool) -> Option<Vec<(f64, f64)>> {
        let mut weights = self.weights_mut();
        if weights.len() != values.len() {
            return None;
        }
        let mut jobs: Vec<CheckJob<'_>> = Vec::new();
        let mut chunks_per_weight = Vec::with_capacity(values.len());
        for (weight, &data) in weights.iter_mut().zip(values) {
            let before = jobs.len();
            match weight {
                WeightMut::Vector(to) => float32_check_jobs(to, data, write, &mut jobs)?,
                WeightMut::Matrix(m) => {
                    let (inputs, outputs) = (m.inputs, m.outputs);
                    if data.len() != inputs * outputs {
                        return None;
                    }
                    match &mut m.weights {
                        Weights::Float32(to) => float32_check_jobs(to, data, write, &mut jobs)?,
                        Weights::Bfloat16(packed) => {
                            for (c, to) in packed.chunks_mut(CHUNK).enumerate() {
                                let first = c * CHUNK / PANEL;
                                jobs.push(Mutex::new(Box::new(move || {
                                    if write {
                                        pack_rows(inputs, outputs, data, first, to);
                                    }
                                    // Read back what memory holds, not what was just computed.
                                    let held = std::hint::black_box(&*to);
                                    (holds_rows(inputs, outputs, data, first, held), chunk_sums(held, |&v| f64::from(from_bf16(v))))
                                })));
                            }
                        }
                    }
                }
            }
            chunks_per_weight.push(jobs.len() - before);
        }
        let mut results = in_order(jobs.len(), threads, |j| (jobs[j].lock().expect("a check chunk's lock"))()).into_iter();
        let per_weight: Vec<Vec<(bool, (f64, f64))>> = chunks_per_weight.into_iter().map(|n| results.by_ref().take(n).collect()).collect();
        sums_where_every_chunk_holds(per_weight)
    }

    /// Each weight's sums as [`Model::holds_with_sums`] gives them, on `threads` threads.
    pub fn weight_sums(&self, threads: usize) -> Vec<(f64, f64)> {
        let weights = self.weights();
        let per_weight = by_chunks(&weights, threads, |w, c| stored_chunk_sums(&weights[w], c));
        per_weight.into_iter().map(|chunks| added(chunks.into_iter())).collect()
    }
}

/// Copies of `data` into `to` a chunk at a time, as refill jobs.
fn float32_chunks<'a>(to: &'a mut [f32], data: &'a [f32], jobs: &mut Vec<Mutex<Box<dyn FnMut() + Send + 'a>>>) {
    assert_eq!(to.len(), data.len(), "a weight of {} values refilled from {}", to.len(), data.len());
    for (to, from) in to.chunks_mut(CHUNK).zip(data.chunks(CHUNK)) {
        jobs.push(Mutex::new(Box::new(move || to.copy_from_slice(from))));
    }
}

/// Each weight's sums (its chunks' added in order) if every one of its chunks held its values;
/// `None` if any chunk of any weight did not.
fn sums_where_every_chunk_holds(per_weight: Vec<Vec<(bool, (f64, f64))>>) -> Option<Vec<(f64, f64)>> {
    per_weight.into_iter().map(|chunks| chunks.iter().all(|(same, _)| *same).then(|| added(chunks.into_iter().map(|(_, s)| s)))).collect()
}

/// One chunk of [`Model::refill_holding`]: whether it holds its values, and its sums.
type CheckJob<'a> = Mutex<Box<dyn FnMut() -> (bool, (f64, f64)) + Send + 'a>>;

/// [`Model::refill_holding`]'s jobs for a float32 weight: each chunk copied from `data` (if
/// `write`), read back, compared and summed. `None` where the lengths differ.
fn float32_check_jobs<'a>(to: &'a mut [f32], data: &'a [f32], write: bool, jobs: &mut Vec<CheckJob<'a>>) -> Option<()> {
    if to.len() != data.len() {
        return None;
    }
    for (to, from) in to.chunks_mut(CHUNK).zip(data.chunks(CHUNK)) {
        jobs.push(Mutex::new(Box::new(move || {
            if write {
                to.copy_from_slice(from);
            }
            let held = std::hint::black_box(&*to);
            (crate::same_bits(held, from), chunk_sums(held, |&v| f64::from(v)))
        })));
    }
    Some(())
}

/// How many values `weight` stores (a bfloat16 matrix's padded panels included).
fn stored(weight: &Weight) -> usize {
    match weight {
        Weight::Vector(held) => held.len(),
        Weight::Matrix(Matrix { weights: Weights::Float32(held), .. }) => held.len(),
        Weight::Matrix(Matrix { weights: Weights::Bfloat16(packed), .. }) => packed.len(),
    }
}

/// `work(weight, chunk)` for every chunk of every weight on `threads` threads; each weight's
/// results in chunk order.
fn by_chunks<R: Send>(weights: &[Weight], threads: usize, work: impl Fn(usize, usize) -> R + Sync) -> Vec<Vec<R>> {
    let units: Vec<(usize, usize)> = weights.iter().enumerate().flat_map(|(w, weight)| (0..stored(weight).div_ceil(CHUNK)).map(move |c| (w, c))).collect();
    let mut results = in_order(units.len(), threads, |u| work(units[u].0, units[u].1)).into_iter();
    weights.iter().map(|weight| results.by_ref().take(stored(weight).div_ceil(CHUNK)).collect()).collect()
}

/// Whether chunk `c` of `weight` holds `data`'s values, and its sums.
fn chunk_check(weight: &Weight, data: &[f32], c: usize) -> (bool, (f64, f64)) {
    let range = |len: usize| c * CHUNK..len.min((c + 1) * CHUNK);
    let float32 = |held: &[f32]| {
        let r = range(held.len());
        (crate::same_bits(&held[r.clone()], &data[r.clone()]), chunk_sums(&held[r], |&v| f64::from(v)))
    };
    match weight {
        Weight::Vector(held) => float32(held),
        Weight::Matrix(Matrix { weights: Weights::Float32(held), .. }) => float32(held),
        Weight::Matrix(Matrix { inputs, outputs, weights: Weights::Bfloat16(packed) }) => {
            let part = &packed[range(packed.len())];
            (holds_rows(*inputs, *outputs, data, c * CHUNK / PANEL, part), chunk_sums(part, |&v| f64::from(from_bf16(v))))
        }
    }
}

/// Chunk `c`'s sums of the values `weight` stores.
fn stored_chunk_sums(weight: &Weight, c: usize) -> (f64, f64) {
    let range = |len: usize| c * CHUNK..len.min((c + 1) * CHUNK);
    match weight {
        Weight::Vector(held) => chunk_sums(&held[range(held.len())], |&v| f64::from(v)),
        Weight::Matrix(Matrix { weights: Weights::Float32(held), .. }) => chunk_sums(&held[range(held.len())], |&v| f64::from(v)),
        Weight::Matrix(Matrix { weights: Weights::Bfloat16(packed), .. }) => chunk_sums(&packed[range(packed.len())], |&v| f64::from(from_bf16(v))),
    }
}

/// `work(unit)` for units `0..units` on `threads` threads, each taking the next unit not yet
/// taken; the results in unit order, whichever thread computed them.
pub(crate) fn in_order<R: Send>(units: usize, threads: usize, work: impl Fn(usize) -> R + Sync) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let run = || {
        let mut done = Vec::new();
        loop {
            let unit = next.fetch_add(1, Ordering::Relaxed);
            if unit >= units {
                return done;
            }
            done.push((unit, work(unit)));
        }
    };
    let mut all = match threads.clamp(1, units.max(1)) {
        1 => run(),
        tasks => {
            let parts = Mutex::new(Vec::new());
            rayon::scope(|scope| {
                for _ in 1..tasks {
                    scope.spawn(|_| {
                        let done = run();
                        parts.lock().expect("the check's results lock").extend(done);
                    });
                }
                let done = run();
                parts.lock().expect("the check's results lock").extend(done);
            });
            parts.into_inner().expect("the check's results lock")
        }
    };
    all.sort_by_key(|(unit, _)| *unit);
    assert!(all.iter().enumerate().all(|(i, (unit, _))| i == *unit), "every unit computed once");
    all.into_iter().map(|(_, result)| result).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Dims, Layer};

    /// A one-layer model whose embeddings and head (9000 x 8) span two chunks each, its weights
    /// `value(i)` for the `i`-th value of the model, in the layout of [`Model::weights`].
    fn model(bfloat16: bool, value: impl Fn(usize) -> f32) -> (Model, Vec<Vec<f32>>) {
        let dims = Dims { hidden: 8, heads: 2, kv_heads: 1, head_dim: 4, intermediate: 8, vocab: 9000, max_positions: 4, rms_norm_eps: 1e-6, eos: 0 };
        let shapes: [(usize, usize); 10] = [(9000, 8), (1, 8), (8, 9000), (1, 8), (8, 28), (8, 8), (1, 8), (8, 16), (8, 8), (1, 0)];
        let mut next = 0;
        let values: Vec<Vec<f32>> = shapes[..9].iter().map(|&(r, c)| (0..r * c).map(|_| { next += 1; value(next) }).collect()).collect();
        let matrix = |i: usize| {
            let (r, c) = shapes[i];
            if bfloat16 { Matrix::bfloat16(r, c, &values[i]) } else { Matrix::new(r, c, values[i].clone()) }
        };
        let layer = Layer { input_layernorm: values[3].clone(), qkv: matrix(4), o: matrix(5), post_attention_layernorm: values[6].clone(), gate_up: matrix(7), down: matrix(8), qkv_bias: None, qk_norm: None };
        let model = Model::new(dims, values[0].clone(), vec![layer], values[1].clone(), matrix(2), vec![0.0; 16], vec![0.0; 16]);
        (model, values)
    }

    fn slices(values: &[Vec<f32>]) -> Vec<&[f32]> {
        values.iter().map(Vec::as_slice).collect()
    }

    /// The threaded refill stores what one matrix at a time does, and the fused pass certifies it
    /// with each weight's serial sums ([`crate::sums`], [`Matrix::sums`]) bit for bit on 1, 2 and
    /// 3 threads; the sums are the float64 formula's (relative 1e-12); a value changed in the
    /// second chunk of the embeddings, or in a whole or the last (partial) panel of the head,
    /// is found on any thread count.
    #[test]
    fn refill_and_check_give_the_same_bits_on_any_thread_count() {
        for bfloat16 in [false, true] {
            let (old, _) = model(bfloat16, |i| (i % 7) as f32);
            let (built, values) = model(bfloat16, |i| 1.0 / (1.0 + i as f32) - 0.001);
            let serial: Vec<(f64, f64)> = built.weights().iter().map(|w| match w {
                Weight::Vector(v) => crate::sums(v),
                Weight::Matrix(m) => m.sums(),
            }).collect();
            for threads in [1, 2, 3] {
                let mut refilled = model(bfloat16, |i| (i % 7) as f32).0;
                refilled.refill(&slices(&values), threads);
                let sums = refilled.holds_with_sums(&slices(&values), threads).expect("a refilled model holds its values");
                let bits = |s: &[(f64, f64)]| s.iter().map(|(a, b)| (a.to_bits(), b.to_bits())).collect::<Vec<_>>();
                assert_eq!(bits(&sums), bits(&serial), "{threads} threads, bfloat16 {bfloat16}");
                assert_eq!(bits(&refilled.weight_sums(threads)), bits(&serial));
                assert!(old.holds_with_sums(&slices(&values), threads).is_none(), "the old weights do not hold the new values");
                // The fused pass: the same stored values and sums as the two passes; a lost
                // refresh (nothing written) and a changed value are found.
                let mut fused = model(bfloat16, |i| (i % 7) as f32).0;
                assert!(fused.refill_holding(&slices(&values), threads, false).is_none(), "a lost refresh, {threads} threads");
                let fused_sums = fused.refill_holding(&slices(&values), threads, true).expect("a refilled model holds its values");
                assert_eq!(bits(&fused_sums), bits(&serial), "fused, {threads} threads, bfloat16 {bfloat16}");
                assert!(fused.holds_with_sums(&slices(&values), threads).is_some(), "the fused pass stored the values");
                for (weight, at) in [(0, 70_000), (2, 100), (2, 8 * 9000 - 1)] {
                    let mut changed = values.clone();
                    changed[weight][at] += 0.5;
                    assert!(refilled.holds_with_sums(&slices(&changed), threads).is_none(), "weight {weight} value {at} changed, {threads} threads");
                    assert!(fused.refill_holding(&slices(&changed), threads, false).is_none(), "fused: weight {weight} value {at} changed, {threads} threads");
                }
            }
            for (w, (sum, squares)) in serial.iter().enumerate() {
                let read: Vec<f64> = values[w].iter().map(|&v| if bfloat16 && [2, 4, 5, 7, 8].contains(&w) { f64::from(crate::from_bf16(crate::to_bf16(v))) } else { f64::from(v) }).collect();
                let (s, q): (f64, f64) = (read.iter().sum(), read.iter().map(|v| v * v).sum());
                assert!((sum - s).abs() <= 1e-12 * s.abs().max(1.0) && (squares - q).abs() <= 1e-12 * q, "weight {w}: {sum} {squares} against {s} {q}");
            }
        }
    }

    /// A weight over one chunk is summed chunk by chunk: its sums are its chunks' added in order,
    /// not one long run of lanes (the definition the threads reproduce).
    #[test]
    fn a_long_weight_sums_its_chunks_in_order() {
        let values: Vec<f32> = (0..CHUNK * 2 + 5).map(|i| ((i * 7919) % 1000) as f32 * 1e-3 + 1e-7).collect();
        let (first, second, rest) = (&values[..CHUNK], &values[CHUNK..2 * CHUNK], &values[2 * CHUNK..]);
        let part = |v: &[f32]| chunk_sums(v, |&x| f64::from(x));
        let (a, b, c) = (part(first), part(second), part(rest));
        assert_eq!(crate::sums(&values), ((a.0 + b.0) + c.0, (a.1 + b.1) + c.1));
    }
}

/// Figures for `docs/src/performance.md` (ignored: a benchmark, not a test): the refill and
/// the check of SmolLM2-135M-shaped weights (random values), one matrix at a time as before
/// (`Matrix::refill`; `Matrix::holds` then `Matrix::sums`, two passes) and through this file
/// on 1 and 2 threads, alternated, with the process's CPU seconds beside the wall seconds.
/// `cargo test -p smallrl-native --lib check::bench -- --ignored --nocapture`
#[cfg(test)]
mod bench {
    use super::*;
    use crate::model::{Dims, Layer};
    use std::time::Instant;

    fn cpu_seconds() -> f64 {
        let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
        let fields: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
        (fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap()) / 100.0
    }

    fn timed(label: &str, work: impl FnOnce()) {
        let (wall, cpu) = (Instant::now(), cpu_seconds());
        work();
        println!("{label}: {:.3} s wall, {:.2} s CPU", wall.elapsed().as_secs_f64(), cpu_seconds() - cpu);
    }

    #[test]
    #[ignore]
    fn bench() {
        let (hidden, vocab, inter, layers, qkv) = (576, 49152, 1536, 30, 1728);
        let mut state = 1u64;
        let mut random = |n: usize| -> Vec<f32> { (0..n).map(|_| { state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); ((state >> 40) as f32 / (1u64 << 24) as f32) - 0.5 }).collect() };
        let shapes: Vec<(usize, usize)> = [(vocab, hidden), (1, hidden), (hidden, vocab)].into_iter().chain((0..layers).flat_map(|_| [(1, hidden), (hidden, qkv), (hidden, hidden), (1, hidden), (hidden, 2 * inter), (inter, hidden)])).collect();
        let values: Vec<Vec<f32>> = shapes.iter().map(|&(r, c)| random(r * c)).collect();
        for bfloat16 in [true, false] {
            let matrix = |i: usize| if bfloat16 { Matrix::bfloat16(shapes[i].0, shapes[i].1, &values[i]) } else { Matrix::new(shapes[i].0, shapes[i].1, values[i].clone()) };
            let layer = |l: usize| { let b = 3 + 6 * l; Layer { input_layernorm: values[b].clone(), qkv: matrix(b + 1), o: matrix(b + 2), post_attention_layernorm: values[b + 3].clone(), gate_up: matrix(b + 4), down: matrix(b + 5), qkv_bias: None, qk_norm: None } };
            let dims = Dims { hidden, heads: 9, kv_heads: 3, head_dim: 64, intermediate: inter, vocab, max_positions: 4, rms_norm_eps: 1e-5, eos: 0 };
            let mut model = Model::new(dims, values[0].clone(), (0..layers).map(layer).collect(), values[1].clone(), matrix(2), vec![0.0; 256], vec![0.0; 256]);
            let slices: Vec<&[f32]> = values.iter().map(Vec::as_slice).collect();
            for round in 0..2 {
                println!("bfloat16 {bfloat16}, round {round}");
                timed("  refill, a matrix at a time", || for (w, v) in model.weights_mut().into_iter().zip(&slices) { match w { WeightMut::Vector(to) => to.copy_from_slice(v), WeightMut::Matrix(m) => m.refill(v) } });
                for threads in [1, 2] {
                    timed(&format!("  refill, {threads} threads"), || model.refill(&slices, threads));
                }
                timed("  holds then sums, a matrix at a time", || {
                    let ok = model.weights().iter().zip(&slices).all(|(w, v)| match w { Weight::Vector(h) => crate::same_bits(h, v), Weight::Matrix(m) => m.holds(v) });
                    let sums: Vec<(f64, f64)> = model.weights().iter().map(|w| match w { Weight::Vector(h) => crate::sums(h), Weight::Matrix(m) => m.sums() }).collect();
                    assert!(ok && sums.len() == slices.len());
                });
                for threads in [1, 2] {
                    timed(&format!("  holds with sums, {threads} threads"), || assert!(model.holds_with_sums(&slices, threads).is_some()));
                }
                for threads in [1, 2] {
                    timed(&format!("  refill holding (one pass), {threads} threads"), || assert!(model.refill_holding(&slices, threads, true).is_some()));
                }
            }
        }
    }
}
