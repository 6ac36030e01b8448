//! Conversions between the host's plugin types and the WIT contract's (`wit.rs`).

use std::cell::OnceCell;

use super::wit::{legacy, types as wit};
use super::{ParamInfo, PluginInfo, PluginKind, Sample};

/// Samples in the contract's form, converted once and passed to every plugin of a batch
/// (the 0.1 form too, on the first call of a plugin built against it).
pub struct Batch {
    current: Vec<wit::Sample>,
    legacy: OnceCell<Vec<legacy::types::Sample>>,
    /// SHA-256 of every field of every sample: seeds a WASI plugin's random stream.
    digest: OnceCell<[u8; 32]>,
}

impl Batch {
    pub fn new(samples: &[Sample]) -> Self {
        Self { current: to_wit_samples(samples), legacy: OnceCell::new(), digest: OnceCell::new() }
    }

    /// SHA-256 of the batch (each field length-prefixed), computed on first use: the same
    /// samples give the same digest in any run.
    pub(super) fn digest(&self) -> [u8; 32] {
        *self.digest.get_or_init(|| {
            use sha2::Digest;
            let mut hasher = sha2::Sha256::new();
            let mut field = |bytes: &[u8]| {
                hasher.update((bytes.len() as u64).to_le_bytes());
                hasher.update(bytes);
            };
            for sample in &self.current {
                field(sample.prompt.as_bytes());
                field(sample.completion.as_bytes());
                field(sample.completion_tokens_joined.as_bytes());
                let ends: Vec<u8> = sample.completion_token_ends.iter().flat_map(|end| end.to_le_bytes()).collect();
                field(&ends);
                let ids: Vec<u8> = sample.completion_ids.iter().flat_map(|id| id.to_le_bytes()).collect();
                field(&ids);
                field(&[u8::from(sample.ended_with_eos)]);
                field(&[u8::from(sample.metadata.is_some())]);
                field(sample.metadata.as_deref().unwrap_or_default().as_bytes());
            }
            hasher.finalize().into()
        })
    }

    pub fn len(&self) -> usize {
        self.current.len()
    }

    pub(super) fn current(&self) -> &[wit::Sample] {
        &self.current
    }

    /// The samples as 0.1 plugins take them: the same fields, without `metadata`.
    pub(super) fn legacy(&self) -> &[legacy::types::Sample] {
        self.legacy.get_or_init(|| {
            let to_legacy = |sample: &wit::Sample| legacy::types::Sample {
                prompt: sample.prompt.clone(),
                completion: sample.completion.clone(),
                completion_tokens_joined: sample.completion_tokens_joined.clone(),
                completion_token_ends: sample.completion_token_ends.clone(),
                completion_ids: sample.completion_ids.clone(),
                ended_with_eos: sample.ended_with_eos,
            };
            self.current.iter().map(to_legacy).collect()
        })
    }
}

fn to_wit_samples(samples: &[Sample]) -> Vec<wit::Sample> {
    let to_wit = |sample: &Sample| {
        let (completion_tokens_joined, completion_token_ends) = join_tokens(&sample.completion_tokens);
        wit::Sample {
            prompt: sample.prompt.clone(),
            completion: sample.completion.clone(),
            completion_tokens_joined,
            completion_token_ends,
            completion_ids: sample.completion_ids.clone(),
            ended_with_eos: sample.ended_with_eos,
            metadata: sample.metadata.as_ref().map(|metadata| metadata.json.clone()),
        }
    };
    samples.iter().map(to_wit).collect()
}

/// The tokens as one string plus end offsets: the WIT contract's form (one string per sample
/// crosses into the guest instead of one per token).
fn join_tokens(tokens: &[String]) -> (String, Vec<u32>) {
    let mut joined = String::with_capacity(tokens.iter().map(String::len).sum());
    let ends = tokens
        .iter()
        .map(|token| {
            joined.push_str(token);
            joined.len() as u32
        })
        .collect();
    (joined, ends)
}

/// `info()`'s answer with the kind it claims, from either contract version (the two define
/// the same record twice).
macro_rules! info_conversion {
    ($name:ident, $($types:ident)::+) => {
        pub(super) fn $name(info: $($types)::+::PluginInfo) -> (PluginInfo, PluginKind) {
            use $($types)::+ as t;
            let claimed = match info.kind {
                t::PluginKind::Reward => PluginKind::Reward,
                t::PluginKind::Detector => PluginKind::Detector,
            };
            let to_param = |param: t::ParamInfo| ParamInfo {
                name: param.name,
                type_name: param.type_name,
                default_json: param.default_json,
                description: param.description,
            };
            let info = PluginInfo {
                name: info.name,
                version: info.version,
                kind: claimed,
                description: info.description,
                params: info.params.into_iter().map(to_param).collect(),
            };
            (info, claimed)
        }
    };
}
info_conversion!(from_wit_info, wit);
info_conversion!(from_legacy_info, legacy::types);
