//! Conversions between the host's plugin types and the WIT contract's (`wit.rs`).

use super::wit::types as wit;
use super::{ParamInfo, PluginInfo, PluginKind, Sample};

/// Samples in the contract's form, converted once and passed to every plugin of a batch.
pub struct Batch(pub(super) Vec<wit::Sample>);

impl Batch {
    pub fn new(samples: &[Sample]) -> Self {
        Self(to_wit_samples(samples))
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

pub(super) fn from_wit_kind(kind: wit::PluginKind) -> PluginKind {
    match kind {
        wit::PluginKind::Reward => PluginKind::Reward,
        wit::PluginKind::Detector => PluginKind::Detector,
    }
}

pub(super) fn from_wit_info(info: wit::PluginInfo, kind: PluginKind) -> PluginInfo {
    let to_param = |param: wit::ParamInfo| ParamInfo {
        name: param.name,
        type_name: param.type_name,
        default_json: param.default_json,
        description: param.description,
    };
    PluginInfo {
        name: info.name,
        version: info.version,
        kind,
        description: info.description,
        params: info.params.into_iter().map(to_param).collect(),
    }
}
