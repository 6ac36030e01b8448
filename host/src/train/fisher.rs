//! The sketched Fisher kernel of a step's sequences (`fisher_kernel_every`, `fisher_kernel_sketch`):
//! `K(i, j) = <g_i, g_j>`, `g_i` the gradient of sequence `i`'s total completion log-probability
//! over the model's tokens (an episode's observation tokens, `Generation::model_mask` 0, are
//! attended to but not summed: the environment wrote them) (at the run's temperature, under the policy that computed the step's gradient, before its
//! update) over the trainable parameters, estimated from sketches `S = G Pᵀ` (`[n, D]`) as
//! `K ≈ S Sᵀ`, so no `[n, n_params]` matrix of per-sequence gradients is ever held.
//!
//! The projection `P` is a CountSketch (Charikar, Chen and Farach-Colton 2002; the sparse
//! Johnson-Lindenstrauss transform with one non-zero per column): each parameter element `a`
//! goes to one bucket `h(a)` of `D` with a sign `s(a)`, both uniform and independent, so
//! `S[i, d] = Σ_{h(a) = d} s(a) g_i[a]`. `S Sᵀ` is unbiased for `G Gᵀ` with
//! `Var(K̂_ij) = (|g_i|² |g_j|² + K_ij² - 2 Σ_a g_i[a]² g_j[a]²) / D`, at most the dense Gaussian
//! projection's `(|g_i|² |g_j|² + K_ij²) / D`: the expected squared Frobenius error is at most
//! `(tr(K)² + |K|_F²) / D`, a relative error of at most `sqrt((r + 1) / D)` with `r` the kernel's
//! effective rank (at most `n`). Unlike a dense projection its cost does not grow with `D`.
//!
//! Cost of a measured step: one forward and one backward pass per sequence, each over that
//! sequence alone (about one training pass of the batch in all, less well batched), plus one
//! pass over the parameters' gradient per sequence for the sketch; the hash functions are
//! `n_params` draws per measured step (12 bytes per parameter held during the measurement).
//! The passes' gradients go into fresh tensors (`Tensor::run_backward`), never into the
//! parameters' `.grad`, and draw nothing from any random stream the run uses, so the step's own
//! gradient, update and every later step are unchanged (`tests/fisher_kernel.rs`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use tch::{Device, Kind, Tensor};

use super::metrics::key;
use super::policy::Policy;
use crate::engine;
use crate::model::generate::Generation;
use crate::model::linear::AdapterCtl;
use crate::rng::{self, SplitMix64};

/// The purpose of the sketch's hash functions: `rng::derive(seed, PURPOSE, step)`.
pub const PURPOSE: &str = "fisher-kernel";
/// Each parameter tensor's own stream: `rng::derive(step_seed, TENSOR_PURPOSE, tensor index)`,
/// so a tensor's hash functions do not depend on the other tensors' sizes.
const TENSOR_PURPOSE: &str = "fisher-kernel-tensor";

/// The hash functions of one CountSketch of a gradient given as tensors of fixed sizes.
pub struct CountSketch {
    dim: i64,
    /// Per tensor, each element's bucket in `0..dim` (`[numel]`, int64).
    buckets: Vec<Tensor>,
    /// Per tensor, each element's sign (`[numel]`, ±1 float32).
    signs: Vec<Tensor>,
}

impl CountSketch {
    /// A sketch into `dim` buckets for tensors of `numels` elements, drawn from `seed`: element
    /// `a` of tensor `k` takes `v = below(2 dim)` from tensor `k`'s SplitMix64 stream, bucket
    /// `v / 2` and sign `+1` for even `v` (both exactly uniform and independent).
    pub fn new(seed: u64, numels: &[i64], dim: usize, device: Device) -> Self {
        assert!(dim > 0, "a sketch has at least one dimension");
        let (mut buckets, mut signs) = (Vec::with_capacity(numels.len()), Vec::with_capacity(numels.len()));
        for (k, &numel) in numels.iter().enumerate() {
            let mut stream = SplitMix64::new(rng::derive(seed, TENSOR_PURPOSE, k as u64));
            let (mut bucket, mut sign) = (Vec::with_capacity(numel as usize), Vec::with_capacity(numel as usize));
            for _ in 0..numel {
                let v = stream.below(2 * dim);
                bucket.push((v / 2) as i64);
                sign.push(if v % 2 == 0 { 1.0f32 } else { -1.0 });
            }
            buckets.push(Tensor::from_slice(&bucket).to(device));
            signs.push(Tensor::from_slice(&sign).to(device));
        }
        Self { dim: dim as i64, buckets, signs }
    }

    /// The sketch (`[dim]`, float64) of one gradient, one tensor per parameter in the order the
    /// sketch was built for (an undefined tensor: a zero gradient). On CUDA `index_add` sums with
    /// atomics, so the last bits may vary between runs; on the CPU it repeats exactly.
    pub fn project(&self, gradient: &[Tensor]) -> Tensor {
        assert_eq!(gradient.len(), self.buckets.len(), "one gradient tensor per sketched parameter");
        let device = self.buckets.first().map_or(Device::Cpu, Tensor::device);
        let mut out = Tensor::zeros([self.dim], (Kind::Double, device));
        for ((g, bucket), sign) in gradient.iter().zip(&self.buckets).zip(&self.signs) {
            if g.defined() {
                assert_eq!(g.numel() as i64, bucket.size()[0], "a gradient has its parameter's size");
                let signed = (g.detach().reshape([-1]).to_kind(Kind::Float) * sign).to_kind(Kind::Double);
                out = out.index_add(0, bucket, &signed);
            }
        }
        out
    }
}

/// The sketches `[n, D]` (float64) of each sequence of `generation`: the gradient of its total
/// log-probability over its model tokens with respect to `params`
/// ([`engine::sequence_gradient_sketches`]: one forward and one backward pass per sequence,
/// alone, into fresh tensors) projected by `sketch`.
pub fn sketch_sequences(model: &crate::model::Llama, generation: &Generation, temperature: f64, ctl: &[AdapterCtl], params: &[Tensor], sketch: &CountSketch) -> Tensor {
    engine::sequence_gradient_sketches(model, generation.into(), &generation.model_tokens(), temperature, ctl, params, &|gradient| sketch.project(gradient))
}

/// The kernel estimate `S Sᵀ` (`[n, n]`, float64) from a CountSketch's rows.
pub fn kernel(sketches: &Tensor) -> Tensor {
    let s = sketches.to_kind(Kind::Double);
    s.matmul(&s.tr())
}

/// The summary metrics of a kernel (see [`key::FISHER_TRACE`] and the keys beside it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FisherSummary {
    pub trace: f64,
    /// The three largest eigenvalues, largest first (NaN past the kernel's size).
    pub top_eigenvalues: [f64; 3],
    /// Mean of `K_ij / sqrt(K_ii K_jj)` over the pairs `i < j` whose diagonals are positive
    /// (NaN without such a pair).
    pub mean_offdiag_correlation: f64,
    /// The participation ratio `(Σλ)² / Σλ² = tr(K)² / |K|_F²` (NaN for a zero kernel).
    pub effective_rank: f64,
}

impl FisherSummary {
    /// The summary of a symmetric kernel `[n, n]`, in float64 (eigenvalues by `linalg_eigh`).
    pub fn of(kernel: &Tensor) -> Self {
        let k = kernel.to_kind(Kind::Double).to_device(Device::Cpu);
        let n = k.size()[0];
        assert_eq!(k.size(), [n, n], "a kernel is square");
        let (eigenvalues, _) = k.linalg_eigh("L");
        let ascending = Vec::<f64>::try_from(&eigenvalues).expect("float64 eigenvalues");
        let mut top_eigenvalues = [f64::NAN; 3];
        for (slot, value) in top_eigenvalues.iter_mut().zip(ascending.iter().rev()) {
            *slot = *value;
        }
        let values = Vec::<f64>::try_from(&k.reshape([-1])).expect("a float64 kernel");
        let at = |i: i64, j: i64| values[(i * n + j) as usize];
        let trace: f64 = (0..n).map(|i| at(i, i)).sum();
        let frobenius_squared: f64 = values.iter().map(|v| v * v).sum();
        let mut correlations = Vec::new();
        for i in 0..n {
            for j in i + 1..n {
                if at(i, i) > 0.0 && at(j, j) > 0.0 {
                    correlations.push(at(i, j) / (at(i, i) * at(j, j)).sqrt());
                }
            }
        }
        let mean_offdiag_correlation = if correlations.is_empty() { f64::NAN } else { crate::stats::mean(&correlations) };
        let effective_rank = if frobenius_squared > 0.0 { trace * trace / frobenius_squared } else { f64::NAN };
        Self { trace, top_eigenvalues, mean_offdiag_correlation, effective_rank }
    }

    /// The metrics line's values (NaN is written as null).
    pub fn fields(&self) -> Vec<(&'static str, f64)> {
        let mut out = vec![(key::FISHER_TRACE, self.trace)];
        out.extend(key::FISHER_TOP_EIGENVALUES.iter().copied().zip(self.top_eigenvalues));
        out.push((key::FISHER_MEAN_OFFDIAG_CORRELATION, self.mean_offdiag_correlation));
        out.push((key::FISHER_EFFECTIVE_RANK, self.effective_rank));
        out
    }
}

/// The folder of a run directory that holds the kernels.
pub const DIR: &str = "fisher";

/// `<run_dir>/fisher/step_<step, 6 digits>.json`, the kernel of (1-based) step `step`.
pub fn matrix_path(run_dir: &Path, step: usize) -> PathBuf {
    run_dir.join(DIR).join(format!("step_{step:06}.json"))
}

/// Writes a step's kernel atomically: `{"step", "sequences", "sketch_dim", "projection",
/// "seed", "kernel": [[...], ...]}`, the kernel's float64 values in full precision.
pub fn write_matrix(run_dir: &Path, step: usize, kernel: &Tensor, sketch_dim: usize, seed: u64) -> Result<()> {
    let k = kernel.to_kind(Kind::Double).to_device(Device::Cpu);
    let n = k.size()[0];
    let rows: Vec<Vec<f64>> = (0..n).map(|i| Vec::<f64>::try_from(&k.get(i)).expect("a float64 row")).collect();
    let value = serde_json::json!({
        "step": step,
        "sequences": n,
        "sketch_dim": sketch_dim,
        "projection": "count_sketch",
        "seed": seed,
        "kernel": rows,
    });
    let path = matrix_path(run_dir, step);
    let dir = path.parent().expect("a matrix file has a folder");
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    crate::fsutil::write_atomic(&path, serde_json::to_string(&value)?.as_bytes())
}

/// When and how wide the kernel is measured (`fisher_kernel_every`, `fisher_kernel_sketch`),
/// with the run's seed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FisherSchedule {
    pub every: usize,
    pub sketch: usize,
    pub seed: u64,
}

impl FisherSchedule {
    /// With `every` N > 0 and (1-based) step `step + 1` a multiple of N: the sketched Fisher
    /// kernel of the step's sequences under the `policy` as it is (before the step's update),
    /// written to `<run_dir>/fisher/step_<N>.json`; returns its summary and the seconds it took
    /// as the metrics line's values (none on the other steps).
    pub(super) fn measure(&self, policy: &Policy, run_dir: &Path, step: usize, generation: &Generation, ctl: &[AdapterCtl]) -> Result<Vec<(&'static str, f64)>> {
        if self.every == 0 || (step + 1) % self.every != 0 {
            return Ok(Vec::new());
        }
        let started = std::time::Instant::now();
        let params: Vec<Tensor> = policy.trained_tensors();
        let numels: Vec<i64> = params.iter().map(|t| t.numel() as i64).collect();
        let seed = rng::derive(self.seed, PURPOSE, step as u64);
        let device = params.first().map_or(Device::Cpu, Tensor::device);
        let sketch = CountSketch::new(seed, &numels, self.sketch, device);
        let kernel = kernel(&policy.sketch_sequences(generation, ctl, &params, &|gradient| sketch.project(gradient)));
        write_matrix(run_dir, step + 1, &kernel, self.sketch, seed)?;
        let mut fields = FisherSummary::of(&kernel).fields();
        fields.push((key::TIMING_FISHER, started.elapsed().as_secs_f64()));
        Ok(fields)
    }
}
