//! A 0.3 or 0.4 environment's calls in the current contract's form. Their `environment-types`
//! are 0.5's field for field except `scores` (a score for every sample, no option), so bindgen
//! gives them Rust types of their own (`wit::v0_4::env_types`): converted here, each score
//! present.

use super::wit::{env_types as current, v0_4::env_types as old};

pub(super) fn split(split: current::Split) -> old::Split {
    match split {
        current::Split::Train => old::Split::Train,
        current::Split::Eval => old::Split::Eval,
    }
}

pub(super) fn prompt(prompt: old::Prompt) -> current::Prompt {
    let content = match prompt.content {
        old::PromptContent::Text(text) => current::PromptContent::Text(text),
        old::PromptContent::Messages(messages) => {
            current::PromptContent::Messages(messages.into_iter().map(|m| current::Message { role: m.role, content: m.content }).collect())
        }
    };
    current::Prompt { content, metadata: prompt.metadata }
}

pub(super) fn info(info: old::EnvironmentInfo) -> current::EnvironmentInfo {
    let role = |role: old::Role| match role {
        old::Role::Retain => current::Role::Retain,
        old::Role::Forget => current::Role::Forget,
    };
    let components = info.components.into_iter().map(|c| current::ComponentInfo { name: c.name, role: role(c.role), description: c.description }).collect();
    current::EnvironmentInfo { name: info.name, version: info.version, description: info.description, params: info.params, components, metrics: info.metrics }
}

/// Before 0.5 every sample has a score.
pub(super) fn scores(scores: old::Scores) -> current::Scores {
    let present = |column: Vec<f64>| column.into_iter().map(Some).collect();
    current::Scores { components: scores.components.into_iter().map(present).collect(), metrics: scores.metrics }
}
