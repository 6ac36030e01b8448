use super::*;

fn smollm2() -> ModelShape {
    // SmolLM2-135M-Instruct's config.json.
    ModelShape { layers: 30, hidden: 576, intermediate: 1536, heads: 9, q_size: 576, kv_size: 192, vocab: 49152, tied: true }
}

fn shape(rows: u64) -> StepShape {
    StepShape {
        rows,
        rollout_rows: rows,
        tokens: 100,
        dtype_bytes: 4,
        matmul_bytes: 4,
        trainable: 1000,
        adapter_per_token: 0,
        adapter_casts: 0,
        reference_copy: false,
        decoders: 1,
        decoder_bytes: 134_515_008 * 4,
        extra_gradients: false,
        samples_ahead: false,
        head_chunk_rows: 256,
    }
}

#[test]
fn the_parameter_count_is_the_published_one() {
    // HuggingFace's model card and `sum(p.numel() for p in model.parameters())`: 134,515,008.
    assert_eq!(smollm2().params(), 134_515_008);
    // An untied head adds vocab * hidden.
    assert_eq!(ModelShape { tied: false, ..smollm2() }.params(), 134_515_008 + 49152 * 576);
}

/// A decoder's folded weights of SmolLM2, counted by hand from its config.json: the
/// parameters, the tied head's own transposed copy (49152 x 576), and per layer the rotated q
/// (576 x 576) and k (192 x 576) rows; on the CPU the native sampler's copy comes beside the
/// libtorch one; on the CPU the native sampler's copy instead of libtorch weights (bfloat16:
/// every matrix in 2 bytes, the embeddings in 4); the transient fold in the model's dtype.
#[test]
fn a_decoder_counts_its_folded_copies() {
    let folded = 134_515_008 + 49152 * 576 + 30 * (576 * 576 + 192 * 576);
    assert_eq!(smollm2().folded_params(), folded);
    assert_eq!(smollm2().decoder_bytes(4, None), folded * 4, "a libtorch decoder alone (CUDA)");
    assert_eq!(smollm2().decoder_bytes(2, None), folded * 2, "a bfloat16 libtorch decoder");
    assert_eq!(smollm2().decoder_bytes(4, Some(4)), folded * 4, "float32: the native copy alone");
    assert_eq!(smollm2().decoder_bytes(2, Some(2)), (folded - 49152 * 576) * 2 + 49152 * 576 * 4, "bfloat16 sampler");
    assert_eq!(smollm2().fold_bytes(4), folded * 4);
}

/// The fold a delivery starts from is counted once, in the sampling phase, where it is larger
/// than the rollout's KV caches and logits (before the caches exist; with sampling ahead
/// beside training).
#[test]
fn the_transient_fold_is_counted_once_in_the_sampling_phase() {
    let model = smollm2();
    let fold = model.fold_bytes(4);
    let one_row = estimate(&model, &StepShape { decoders: 3, ..shape(1) });
    assert_eq!(one_row.sampling, fold, "one row's caches (5.0 MB) are smaller than the fold");
    assert_eq!(one_row.copies, 3 * 134_515_008 * 4, "the decoders' copies without the fold");
    let caches = |rows: u64| rows * 100 * 30 * 2 * 192 * 4 + rows * 49152 * 4 * 2;
    let many = estimate(&model, &StepShape { rollout_rows: 1024, ..shape(1) });
    assert!(caches(1024) > fold);
    assert_eq!(many.sampling, caches(1024));
}

#[test]
fn the_estimate_counts_weights_copies_and_optimizer_state() {
    let model = smollm2();
    let plain = estimate(&model, &shape(8));
    assert_eq!(plain.weights, 134_515_008 * 4);
    assert_eq!(plain.copies, 134_515_008 * 4, "one float32 decoder copy");
    assert_eq!(plain.optimizer, 1000 * 4 * 3, "a gradient and two moments");
    let full = estimate(&model, &StepShape { reference_copy: true, decoders: 3, extra_gradients: true, dtype_bytes: 2, matmul_bytes: 2, ..shape(8) });
    assert_eq!(full.weights, 134_515_008 * 2);
    assert_eq!(full.matmul_copies, 0, "bfloat16 weights: the products take them as they are");
    assert_eq!(full.copies, 134_515_008 * 2 + 3 * 134_515_008 * 4);
    assert_eq!(full.optimizer, 1000 * 4 * 4);
    // Activations grow with rows linearly and with tokens faster than linearly (attention).
    let longer = estimate(&model, &StepShape { tokens: 200, ..shape(8) });
    assert!(longer.per_row > 2 * plain.per_row, "{} vs {}", longer.per_row, plain.per_row);
    assert_eq!(plain.training(16) - plain.training(8), 8 * plain.per_row);
}

fn made(per_row: u64) -> Estimate {
    Estimate { weights: 100, copies: 0, optimizer: 0, sampling: 50, scoring: 40, head_chunk: 10, matmul_copies: 0, per_row }
}

#[test]
fn the_plan_is_the_fewest_micro_batches_that_fit() {
    let step = StepShape { rows: 12, ..shape(12) };
    // Usable 0.8 * 125 = 100 beyond the weights: training 10 + 10 r <= 100 needs r <= 9, so 12
    // rows split in 2 (6 rows); 3 would fit too but is not the fewest.
    assert_eq!(plan(&made(10), &step, 125, 12), Ok(Plan { micro_batches: 2, rows: 6, peak: 100 + 70 }));
    // Everything fits: one pass.
    assert_eq!(plan(&made(1), &step, 125, 12).unwrap().micro_batches, 1);
    // r <= 4 with rows 12: 12 and 6 rows do not fit, 4 rows (3 micro-batches) do.
    assert_eq!(plan(&made(20), &step, 125, 12).unwrap(), Plan { micro_batches: 3, rows: 4, peak: 190 });
    // A prime count of rows can only be split into single rows.
    let prime = StepShape { rows: 13, ..shape(13) };
    assert_eq!(plan(&made(20), &prime, 125, 13).unwrap(), Plan { micro_batches: 13, rows: 1, peak: 150 });
}

#[test]
fn when_one_row_does_not_fit_the_plan_says_what_one_row_needs() {
    let step = StepShape { rows: 12, ..shape(12) };
    // Sampling alone (50) is over the 0.8 * 40 = 32 usable.
    assert_eq!(plan(&made(1), &step, 40, 12), Err(NoFit { rows: 1, needed: 150, available: 132 }));
    // With micro-batches bounded to 1 the whole step is the smallest.
    assert_eq!(plan(&made(10), &step, 125, 1), Err(NoFit { rows: 12, needed: 100 + 130, available: 200 }));
}

#[test]
fn sampling_ahead_overlaps_sampling_and_training() {
    let e = made(10);
    assert_eq!(e.peak(2, false), 100 + 50);
    assert_eq!(e.peak(2, true), 100 + 50 + 40);
}

#[test]
fn status_fields_are_read_in_bytes() {
    let status = "Name:\tsmallrl\nVmHWM:\t  123456 kB\nVmRSS:\t  100 kB\n";
    assert_eq!(kb_field(status, "VmHWM"), Some(123_456 * 1024));
    assert_eq!(kb_field(status, "VmRSS"), Some(100 * 1024));
    assert_eq!(kb_field(status, "Vm"), None);
    assert!(peak_resident().unwrap() > 0 && available_ram().unwrap() > 0);
}

/// `train_dtype: bfloat16` (float32 weights): the products' saved values at 2 bytes, the two
/// norms' inputs per layer still at 4 and their outputs replaced by the five products' own
/// bfloat16 copies, and a bfloat16 copy of the weights for the products; the backward's
/// temporaries, the resident parts, sampling and scoring as in float32.
#[test]
fn bfloat16_products_keep_their_values_in_two_bytes_and_add_a_copy_of_the_weights() {
    let model = smollm2();
    let float32 = estimate(&model, &shape(8));
    let mixed = estimate(&model, &StepShape { matmul_bytes: 2, ..shape(8) });
    assert_eq!(mixed.matmul_copies, 134_515_008 * 2);
    assert_eq!((mixed.weights, mixed.copies, mixed.optimizer, mixed.sampling, mixed.scoring), (float32.weights, float32.copies, float32.optimizer, float32.sampling, float32.scoring));
    let (t, h, layers, heads) = (100u64, 576u64, 30u64, 9u64);
    // Per layer and token 4 s bytes saved in float32, 2 (s - 4 h) + 4 (2 h) + 2 (5 h) in
    // bfloat16; the attention's scores halved; the temporaries (0.5 of float32's saved values)
    // the same in both.
    let halved = t * layers * (model.saved_per_token() * 2 - 10 * h) + layers * 2 * heads * t * t * 2;
    let saved_float32 = float32.per_row as f64 / ACTIVATION_FACTOR;
    assert!((float32.per_row as f64 - mixed.per_row as f64 - halved as f64).abs() <= 2.0, "{} vs {}", float32.per_row, mixed.per_row);
    assert!((mixed.per_row as f64 - (saved_float32 - halved as f64) - saved_float32 * (ACTIVATION_FACTOR - 1.0)).abs() <= 2.0);
    assert!(mixed.training(8) < float32.training(8));
}

/// An adapter branch's casts of its input (a LoRA on q, k, v, gate and up: 5 h per token of a
/// layer) are kept at 2 bytes under autocast, and are nothing in float32, where the branch
/// shares the base product's input.
#[test]
fn adapter_casts_count_under_autocast_only() {
    let model = smollm2();
    let (t, h, layers) = (100u64, 576u64, 30u64);
    let casts = StepShape { adapter_casts: 5 * h, ..shape(8) };
    assert_eq!(estimate(&model, &casts).per_row, estimate(&model, &shape(8)).per_row);
    let mixed = |s: StepShape| estimate(&model, &StepShape { matmul_bytes: 2, ..s }).per_row;
    // The float64 sum's rounding to whole bytes moves each by under one.
    assert!((mixed(casts) - mixed(shape(8))).abs_diff(t * layers * 5 * h * 2) <= 1);
}
