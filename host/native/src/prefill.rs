//! The prefill of a call: every row's held and pending tokens run through the model in one
//! block, then the next-token logits of each row's last token. In GRPO a call's rows come in
//! groups with the same prompt, so rows that start from an empty state with the same tokens
//! share one prefill: the first such row (the source) runs them, the others take a copy of its
//! KV cache slots and of its logits, then each draws from its own uniforms as before.
//!
//! The prefill itself is `stream.rs`'s `prefill`; this file is its plan.
//!
//! Why this is exact: every step of `stream.rs`'s `forward` and `head` computes a row from
//! that row's own inputs and cache only (embeddings, norms, RoPE, attention and the gate are
//! per-row loops; the matrix products per row as `Model::independent_rows` states), so a row's
//! cache and logits are the same bits whether its tokens ran in the full block or a smaller
//! one, as long as the smaller block keeps the products' row-independent path: it is padded
//! (its last token repeated, rewriting the same cache slot with the same values) to
//! `independent_rows`, and nothing is shared where the full block itself is below that.

/// Whether rows with the same tokens and an empty state share one prefill.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Prefill {
    /// Each distinct fresh prompt once (what every caller uses).
    Shared,
    /// Every row its own: the reference the shared prefill is tested against.
    #[cfg_attr(not(test), allow(dead_code))]
    PerRow,
}

/// For each row, the row whose prefill it takes: the first row with the same tokens among
/// those that start fresh (`fresh[row]` is `Some(tokens)` when the row's state is empty: no
/// cached position, no held token), itself otherwise. Nothing is shared with
/// [`Prefill::PerRow`], when the products are never row-independent (`independent_rows`
/// `None`), or when the full block's tokens or rows are fewer than `independent_rows` (its
/// products then take a path whose bits a smaller block would not reproduce).
pub(crate) fn sources(fresh: &[Option<&[u32]>], block_tokens: usize, independent_rows: Option<usize>, mode: Prefill) -> Vec<usize> {
    let identity: Vec<usize> = (0..fresh.len()).collect();
    let exact = independent_rows.is_some_and(|least| block_tokens >= least && fresh.len() >= least);
    if mode == Prefill::PerRow || !exact {
        return identity;
    }
    let mut first_with: std::collections::HashMap<&[u32], usize> = std::collections::HashMap::new();
    fresh.iter().enumerate().map(|(row, tokens)| tokens.map_or(row, |tokens| *first_with.entry(tokens).or_insert(row))).collect()
}

/// Repeats `items`' last entry until it holds at least `least`.
pub(crate) fn pad<T: Copy>(items: &mut Vec<T>, least: usize) {
    if let Some(&last) = items.last() {
        items.resize(items.len().max(least), last);
    }
}

#[cfg(test)]
#[path = "prefill_tests.rs"]
mod tests;
