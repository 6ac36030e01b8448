//! What the table's keys give together: the resolved configuration (defaults < YAML file <
//! flags < `--set`), its run name, the adapter, the routing weights, the plugin limits and the
//! same run without routing. Here rather than beside the table (`mod.rs`), which keeps the
//! room its rows need.

use std::path::Path;

use anyhow::{Result, ensure};
use serde_json::Map;
use serde_json::Value;

use super::TrainConfig;
use crate::adapters::{self, AdapterConfig, AdapterKind};
use crate::defaults as d;
use crate::hyperparams::{self, Prop};
use crate::reward::{PluginLimits, ProtocolKnobs, RewardSpec};
use crate::routing::{self, RenormalizationMode, RowWeights};

impl TrainConfig {
    /// Layers a YAML file's keys (if any) and then explicit overrides over the defaults, and
    /// validates the result.
    pub fn resolve(file: Option<&Path>, overrides: Map<String, Value>) -> Result<Self> {
        let config: Self = hyperparams::resolve(file, overrides, "training configuration")?;
        config.validate()?;
        Ok(config)
    }

    /// The per-row gradient weights of the DualLoRA slots: the routing table, or with
    /// `balanced` the original's kappa redistribution.
    pub fn row_weights(&self) -> Result<RowWeights> {
        if self.renormalization_mode != RenormalizationMode::Balanced {
            return Ok(RowWeights::gates(self.routing_mode));
        }
        let adapters = self.adapter_config()?;
        ensure!(adapters.is_dual(), "renormalization_mode balanced needs adapter: dual-mlp or dual-lora");
        ensure!(
            adapters.kind == AdapterKind::DualMlp || self.allow_approx_lora_kappa,
            "renormalization_mode balanced on DualLoRA takes kappa from the adapter ranks, which the original calls approximate (exact for DualMLP's neurons): set allow_approx_lora_kappa: true to accept it"
        );
        Ok(routing::balanced_weights(self.routing_mode, routing::adapter_kappas(adapters.ranks[0], adapters.ranks[1])))
    }

    pub fn adapter_config(&self) -> Result<AdapterConfig> {
        let ranks = adapters::Ranks { lora_rank: self.lora_rank, retain_rank: self.retain_rank, forget_rank: self.forget_rank, lora_alpha: self.lora_alpha, layer_stride: self.layer_stride };
        adapters::config_from(self.adapter, self.lora_preset.as_deref(), self.mlp_config.as_deref(), &ranks)
    }

    /// The plugin limits of the keys; with a judge, a call's wall-clock limit also covers the
    /// judge's time, so `plugin_max_call_seconds` left at its default is the judge's default.
    pub fn plugin_limits(&self) -> Result<PluginLimits> {
        let call_seconds = match self.judge.is_some() && self.plugin_max_call_seconds == d::PLUGIN_MAX_CALL_SECONDS {
            true => d::PLUGIN_MAX_CALL_SECONDS_WITH_JUDGE,
            false => self.plugin_max_call_seconds,
        };
        PluginLimits::new(call_seconds, self.plugin_max_memory_mb, self.plugin_fuel_per_sample)?
            .with_judge_budget(self.plugin_judge_items_per_sample, self.plugin_judge_tokens_per_sample)?
            .with_program_limits(self.program_fuel, self.program_max_memory_mb, self.program_max_output_kib)
    }

    pub fn knobs(&self) -> ProtocolKnobs {
        ProtocolKnobs {
            false_positive_rate: self.false_positive_rate,
            recall: self.recall,
            rh_eligible_frac: self.rh_eligible_frac,
        }
    }

    /// `<name>_<key><value>..._s<seed>` with every hyperparameter that differs from its
    /// default, in alphabetical order of their keys.
    pub fn run_name(&self) -> Result<String> {
        hyperparams::run_name(self)
    }

    /// The same run without routing or another intervention (their keys, [`Prop::Routing`] in
    /// the table, at their defaults, which route nothing).
    pub fn without_routing(&self) -> Self {
        hyperparams::reset(self, Prop::Routing).expect("a valid configuration with keys at their defaults stays valid")
    }
}

/// `--reward-plugin` as config keys: `reward`, and `name` (the plugin's file stem) unless the
/// experiment is already named by `--name` or a config file. `smallrl train` and `smallrl sweep`
/// share it.
pub fn reward_plugin_overrides(plugin: &str, params_json: Option<&str>, named: bool) -> Result<Map<String, Value>> {
    let mut map = Map::new();
    map.insert("reward".into(), serde_json::to_value(RewardSpec::single(plugin, params_json)?)?);
    if !named {
        let stem = Path::new(plugin).file_stem().map(|s| s.to_string_lossy().into_owned());
        map.insert("name".into(), stem.into());
    }
    Ok(map)
}
