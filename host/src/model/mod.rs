//! The LLaMA model: configuration, weights, forward pass, KV cache, tokenizer, sampling.
pub mod tokenizer;
