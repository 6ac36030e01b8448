//! The typed exports of each world and contract version the host runs, and their
//! instantiation (`instance.rs` picks the world).

use wasmtime::Store;
use wasmtime::component::InstancePre;

use super::PluginKind;
use super::store::StoreState;
use super::wit::{Contract, Detector, DetectorPre, Environment, EnvironmentPre, EpisodeEnvironment, Reward, RewardPre, legacy, v0_2, v0_3, v0_4, v0_5};

/// The typed exports of the world and contract version a component implements.
pub(crate) enum Exports {
    Reward(Reward),
    Detector(Detector),
    /// An environment (contract 0.6): prompts, rewards, monitor and ground truth in one.
    Environment(Environment),
    /// A multi-turn environment (issue 48): an environment's `env` plus `episodes`.
    EpisodeEnvironment(EpisodeEnvironment),
    /// Built against the frozen 0.5 contract: the same calls, episodes without tools or calls.
    V05Reward(v0_5::Reward),
    V05Detector(v0_5::Detector),
    V05Environment(v0_5::Environment),
    V05EpisodeEnvironment(v0_5::EpisodeEnvironment),
    /// Built against the frozen 0.4 contract: the same calls and samples, a score for every
    /// sample.
    V04Reward(v0_4::Reward),
    V04Detector(v0_4::Detector),
    V04Environment(v0_4::Environment),
    /// Built against the frozen 0.3 contract: the same calls and samples (the bindings share
    /// the types), no `programs` import.
    V03Reward(v0_3::Reward),
    V03Detector(v0_3::Detector),
    V03Environment(v0_3::Environment),
    /// Built against the frozen 0.2 contract: the same samples (the bindings share the types).
    V02Reward(v0_2::Reward),
    V02Detector(v0_2::Detector),
    /// Built against the frozen 0.1 contract: called with samples without metadata.
    LegacyReward(legacy::Reward),
    LegacyDetector(legacy::Detector),
}

impl Exports {
    /// The world's kind.
    pub(super) fn kind(&self) -> PluginKind {
        match self {
            Exports::Reward(_) | Exports::V05Reward(_) | Exports::V04Reward(_) | Exports::V03Reward(_) | Exports::V02Reward(_) | Exports::LegacyReward(_) => PluginKind::Reward,
            Exports::Detector(_) | Exports::V05Detector(_) | Exports::V04Detector(_) | Exports::V03Detector(_) | Exports::V02Detector(_) | Exports::LegacyDetector(_) => {
                PluginKind::Detector
            }
            Exports::Environment(_)
            | Exports::EpisodeEnvironment(_)
            | Exports::V05Environment(_)
            | Exports::V05EpisodeEnvironment(_)
            | Exports::V04Environment(_)
            | Exports::V03Environment(_) => PluginKind::Environment,
        }
    }
}

pub(super) fn instantiate_exports(pre: &InstancePre<StoreState>, store: &mut Store<StoreState>, kind: PluginKind, contract: Contract) -> wasmtime::Result<Exports> {
    let mut store = store;
    match (kind, contract) {
        (PluginKind::Reward, Contract::Current) => RewardPre::new(pre.clone()).and_then(|pre| pre.instantiate(&mut store)).map(Exports::Reward),
        (PluginKind::Detector, Contract::Current) => DetectorPre::new(pre.clone()).and_then(|pre| pre.instantiate(&mut store)).map(Exports::Detector),
        (PluginKind::Environment, Contract::Current) => {
            EnvironmentPre::new(pre.clone()).and_then(|pre| pre.instantiate(&mut store)).map(Exports::Environment)
        }
        (PluginKind::Reward, Contract::V0_5) => v0_5::RewardPre::new(pre.clone()).and_then(|pre| pre.instantiate(&mut store)).map(Exports::V05Reward),
        (PluginKind::Detector, Contract::V0_5) => {
            v0_5::DetectorPre::new(pre.clone()).and_then(|pre| pre.instantiate(&mut store)).map(Exports::V05Detector)
        }
        (PluginKind::Environment, Contract::V0_5) => {
            v0_5::EnvironmentPre::new(pre.clone()).and_then(|pre| pre.instantiate(&mut store)).map(Exports::V05Environment)
        }
        (PluginKind::Reward, Contract::V0_4) => v0_4::RewardPre::new(pre.clone()).and_then(|pre| pre.instantiate(&mut store)).map(Exports::V04Reward),
        (PluginKind::Detector, Contract::V0_4) => {
            v0_4::DetectorPre::new(pre.clone()).and_then(|pre| pre.instantiate(&mut store)).map(Exports::V04Detector)
        }
        (PluginKind::Environment, Contract::V0_4) => {
            v0_4::EnvironmentPre::new(pre.clone()).and_then(|pre| pre.instantiate(&mut store)).map(Exports::V04Environment)
        }
        (PluginKind::Reward, Contract::V0_3) => v0_3::RewardPre::new(pre.clone()).and_then(|pre| pre.instantiate(&mut store)).map(Exports::V03Reward),
        (PluginKind::Detector, Contract::V0_3) => {
            v0_3::DetectorPre::new(pre.clone()).and_then(|pre| pre.instantiate(&mut store)).map(Exports::V03Detector)
        }
        (PluginKind::Environment, Contract::V0_3) => {
            v0_3::EnvironmentPre::new(pre.clone()).and_then(|pre| pre.instantiate(&mut store)).map(Exports::V03Environment)
        }
        (PluginKind::Environment, _) => Err(wasmtime::format_err!("contract {} has no environment world", contract.version())),
        (PluginKind::Reward, Contract::V0_2) => v0_2::RewardPre::new(pre.clone()).and_then(|pre| pre.instantiate(&mut store)).map(Exports::V02Reward),
        (PluginKind::Detector, Contract::V0_2) => {
            v0_2::DetectorPre::new(pre.clone()).and_then(|pre| pre.instantiate(&mut store)).map(Exports::V02Detector)
        }
        (PluginKind::Reward, Contract::Legacy) => {
            legacy::RewardPre::new(pre.clone()).and_then(|pre| pre.instantiate(&mut store)).map(Exports::LegacyReward)
        }
        (PluginKind::Detector, Contract::Legacy) => {
            legacy::DetectorPre::new(pre.clone()).and_then(|pre| pre.instantiate(&mut store)).map(Exports::LegacyDetector)
        }
    }
}
