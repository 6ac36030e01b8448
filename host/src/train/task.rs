//! What a run trains on, assembled in one place: its training and evaluation prompts, its
//! reward components, its monitor (the routing detector) and its ground truth. Either from
//! reward plugins and prompt files (`reward:`, `rh_detector:`, `rh_ground_truth:`, `prompts`,
//! `eval_prompts` or the dataset), or all from one environment (`environment:`,
//! `environment_params:`; the config refuses the two together). The rest of the trainer sees
//! the same [`RewardModel`] and prompts either way.
//!
//! An environment's training prompts are its `train` split drawn with the run seed; its
//! evaluation prompts its `eval` split drawn with the fixed evaluation seed (the same for every
//! run seed); both with the run's `hack_frac`, which the environment applies as it defines it.
//! A prompt text in both is an error, never a silent overlap.

use std::collections::HashSet;
use std::path::Path;

use anyhow::{Context, Result, bail, ensure};

use super::TrainConfig;
use super::prompts::{self, PromptRender};
use crate::defaults;
use crate::model::Tokenizer;
use crate::plugins::{Plugin, PluginKind};
use crate::reward::{EnvPrompt, EnvSplit, Prompt, RewardModel};
use serde_json::{Map, Value};

/// A run's prompts and rewards.
pub struct Task {
    pub rewards: RewardModel,
    pub prompts: Vec<Prompt>,
    /// The first `eval_samples` evaluation prompts.
    pub eval_prompts: Vec<Prompt>,
    /// With a multi-turn episode environment: every training and evaluation prompt as the
    /// environment wrote it (inoculated), by its rendered text: what its episodes start from.
    pub episode_starts: Vec<(String, EnvPrompt)>,
}

/// The run's reward model: the environment's components, monitor and ground truth, or the
/// configured plugins. A multi-turn episode environment loads as in training: its episodes are
/// played by `train/episodes.rs` (`smallrl train`, `smallrl eval`).
pub fn rewards(cfg: &TrainConfig) -> Result<RewardModel> {
    let limits = cfg.plugin_limits()?;
    let mut rewards = match &cfg.environment {
        Some(environment) => RewardModel::load_training_environment(environment, cfg.environment_params.as_ref(), cfg.knobs(), &cfg.plugin_dir, limits)
            .with_context(|| format!("cannot load environment `{environment}`"))?,
        None => {
            let reward_spec = cfg.reward.as_ref().context("no reward configured: set `reward:` or `environment:`")?;
            RewardModel::load(reward_spec, cfg.rh_detector.as_ref(), cfg.knobs(), &cfg.plugin_dir, limits)?
                .with_ground_truth(cfg.rh_ground_truth.as_ref(), &cfg.plugin_dir, limits)?
        }
    };
    attach_judge(&mut rewards, cfg)?;
    Ok(rewards)
}

/// What the plugin `value` (a standard name or a path) of `kind` declares its name is, as
/// `plugin info` shows it: loaded with `params` under the run's limits.
pub fn declared_name(value: &str, kind: PluginKind, params: Option<&Value>, cfg: &TrainConfig) -> Result<String> {
    let path = crate::reward::resolve_plugin(value, &cfg.plugin_dir, kind);
    let plugin = Plugin::load(&path, &crate::reward::params_json(params), cfg.plugin_limits()?).with_context(|| format!("cannot read the declared name of {}", path.display()))?;
    Ok(plugin.info().name.clone())
}

/// `overrides` of the config `file` with `name` set where a `reward` or `rh_detector` they
/// give by a path would put that path into the name (`<file>_det-<path>`, see
/// [`crate::hyperparams::resolve`]): the name the file's resolution gives with each path
/// replaced by what its plugin declares. Unchanged without a file, with `name` given, or
/// without such a path. `smallrl train` and the sweep's grid points share it (issue 47).
pub fn named_by_declared_specs(file: Option<&Path>, mut overrides: Map<String, Value>) -> Result<Map<String, Value>> {
    let Some(file) = file.filter(|_| !overrides.contains_key("name")) else { return Ok(overrides) };
    let config = TrainConfig::resolve(Some(file), overrides.clone())?;
    let mut stand_in = overrides.clone();
    let mut renamed = false;
    for (key, kind) in [("reward", PluginKind::Reward), ("rh_detector", PluginKind::Detector)] {
        let Some(Value::Object(spec)) = stand_in.get_mut(key) else { continue };
        let Some(plugin) = spec.get("plugin").and_then(Value::as_str).filter(|plugin| crate::reward::is_path(plugin)).map(str::to_owned) else { continue };
        let name = declared_name(&plugin, kind, spec.get("params"), &config)?;
        spec.insert("plugin".into(), name.into());
        renamed = true;
    }
    if renamed {
        let named = TrainConfig::resolve(Some(file), stand_in)?;
        overrides.insert("name".into(), named.name.into());
    }
    Ok(overrides)
}

/// A new run's Python reward components given by paths named by what their modules declare (a
/// TRL function's name, as `plugin info` shows it), not their files' stems, written into its
/// configuration (issue 47; [`crate::reward::RewardSpec::named_by_declared`]). Other plugins
/// keep their standard names and stems: their metrics' names are what researchers compare
/// with earlier runs (`plugins/happy.wasm` declares `happy_count` and logs `rewards/happy`).
pub fn name_components(cfg: &mut TrainConfig) -> Result<()> {
    let Some(reward) = &cfg.reward else { return Ok(()) };
    let named = reward.named_by_declared(&[cfg.rh_detector.as_ref(), cfg.rh_ground_truth.as_ref()], |plugin, params| {
        let path = crate::reward::resolve_plugin(plugin, &cfg.plugin_dir, PluginKind::Reward);
        let bytes = std::fs::read(&path).with_context(|| format!("cannot read the reward plugin {}", path.display()))?;
        // Every component `smallrl plugin build` writes carries its build record.
        match crate::plugins::python_deps::record_of(&bytes) {
            Some(_) => declared_name(plugin, PluginKind::Reward, Some(params), cfg).map(Some),
            None => Ok(None),
        }
    })?;
    cfg.reward = Some(named);
    Ok(())
}

/// The run's judge (`judge:`), loaded on the run's device and given to the environment that
/// imports it: refused when the environment imports the judge and the run configures none, and
/// when a judge is configured for rewards that never call it.
fn attach_judge(rewards: &mut RewardModel, cfg: &TrainConfig) -> Result<()> {
    match &cfg.judge {
        None => {
            ensure!(
                !rewards.wants_judge(),
                "environment {} imports the host's judge ({}: its rewards ask a language model), but the run configures none: \
                 set `judge:` (model: a local model directory, template: the judge prompt; see docs/src/environments.md)",
                rewards.environment_name().unwrap_or("?"),
                environment_file(rewards)
            );
            Ok(())
        }
        Some(judge) => {
            ensure!(rewards.wants_judge(), "{}", match rewards.environment_name() {
                Some(name) => format!(
                    "`judge:` is set, but environment {name} does not import the judge ({} has no `smallrl:reward/judge` import): \
                     it would never be called; remove `judge:`, or use an environment that calls the judge",
                    environment_file(rewards)
                ),
                None => "`judge:` is set, but the run's rewards are plugins, not an environment: only an environment can call the judge; remove `judge:`".to_string(),
            });
            let loaded = crate::judge::ModelJudge::load(judge, cfg.device.resolve()?).context("cannot load `judge:`")?;
            let hashes = loaded.weights_sha256().clone();
            rewards.attach_judge(std::sync::Arc::new(std::sync::Mutex::new(loaded)), hashes)
        }
    }
}

/// Everything a run trains and evaluates on.
pub fn load(cfg: &TrainConfig, tokenizer: &Tokenizer, render: &PromptRender) -> Result<Task> {
    let mut rewards = rewards(cfg)?;
    let Some(name) = rewards.environment_name().map(str::to_string) else {
        let (prompts, eval_prompts) = prompts::load(cfg, tokenizer, render)?;
        return Ok(Task { rewards, prompts, eval_prompts, episode_starts: Vec::new() });
    };
    ensure!(cfg.num_prompts > 0, "num_prompts is 0: environment {name} needs to generate at least one training prompt");
    let mut generated = generate_pure(&mut rewards, EnvSplit::Train, cfg.num_prompts, cfg.seed, cfg)?;
    if cfg.inoculation {
        for prompt in &mut generated {
            inoculate(prompt, &cfg.inoculation_prompt)?;
        }
    }
    let eval_generated = generate_pure(&mut rewards, EnvSplit::Eval, cfg.eval_samples, defaults::EVAL_PROMPT_SEED, cfg)?;
    let starts = rewards.is_episodic().then(|| generated.iter().chain(&eval_generated).cloned().collect::<Vec<_>>());
    let train = render_environment_prompts(&rewards, EnvSplit::Train, generated, render)?;
    let eval = render_environment_prompts(&rewards, EnvSplit::Eval, eval_generated, render)?;
    check_disjoint(&format!("{name} ({})", environment_file(&rewards)), &train, &eval)?;
    let texts = train.iter().chain(&eval).map(|prompt| prompt.text.clone());
    let episode_starts = starts.map_or_else(Vec::new, |starts| texts.zip(starts).collect());
    Ok(Task { rewards, prompts: train, eval_prompts: eval, episode_starts })
}

/// The environment's first `count` evaluation prompts (its eval split, fixed seed).
pub fn evaluation_prompts(rewards: &mut RewardModel, count: usize, cfg: &TrainConfig, render: &PromptRender) -> Result<Vec<Prompt>> {
    Ok(evaluation_episodes(rewards, count, cfg, render)?.0)
}

/// [`evaluation_prompts`], and with a multi-turn episode environment each as the environment
/// wrote it, by its rendered text (what its episodes start from, as [`Task::episode_starts`];
/// empty otherwise).
pub fn evaluation_episodes(rewards: &mut RewardModel, count: usize, cfg: &TrainConfig, render: &PromptRender) -> Result<(Vec<Prompt>, Vec<(String, EnvPrompt)>)> {
    let generated = generate_pure(rewards, EnvSplit::Eval, count, defaults::EVAL_PROMPT_SEED, cfg)?;
    let starts = rewards.is_episodic().then(|| generated.clone());
    let prompts = render_environment_prompts(rewards, EnvSplit::Eval, generated, render)?;
    let starts = starts.map_or_else(Vec::new, |starts| prompts.iter().map(|prompt| prompt.text.clone()).zip(starts).collect());
    Ok((prompts, starts))
}

/// Inoculation prompting: `text` as the prompt's first paragraph (a conversation's first user
/// message's).
pub fn inoculate(prompt: &mut crate::reward::EnvPrompt, text: &str) -> Result<()> {
    use crate::plugins::EnvPromptContent;
    if let EnvPromptContent::Messages(messages) = &prompt.content {
        ensure!(messages.iter().any(|(role, _)| role == "user"), "inoculation prefixes a prompt's first user message, and this conversation has none: {}", shown_prompt(prompt));
    }
    let content = match &mut prompt.content {
        EnvPromptContent::Text(content) => content,
        EnvPromptContent::Messages(messages) => &mut messages.iter_mut().find(|(role, _)| role == "user").expect("checked above").1,
    };
    *content = format!("{text}\n\n{content}");
    Ok(())
}

/// The environment's prompts of `split`, generated twice and compared (purity).
fn generate_pure(rewards: &mut RewardModel, split: EnvSplit, count: usize, seed: u64, cfg: &TrainConfig) -> Result<Vec<crate::reward::EnvPrompt>> {
    let generated = rewards.generate(split, count, seed, cfg.hack_frac)?;
    let name = rewards.environment_name().unwrap_or("?").to_string();
    let file = environment_file(rewards);
    // Purity: the same call again must give the same prompts, else `eval`, `eval --deploy`,
    // `--resume` and a sweep's collection (each a process of its own, calling in another order)
    // would use other ones than the run. Without capabilities, what a call keeps is the only
    // way to differ.
    let again = rewards.generate(split, count, seed, cfg.hack_frac)?;
    if let Some(index) = (0..count).find(|&index| generated[index] != again[index]) {
        bail!(
            "environment {name} ({file}) is not pure: its {split} prompts (seed {seed}) differ when generated again, \
             from prompt {index}: {} the first time, {} the second; `generate` must depend on its parameters and arguments \
             only (no state kept between calls), else `smallrl eval`, `--resume` and sweeps would use other prompts than the run",
            shown_prompt(&generated[index]),
            shown_prompt(&again[index])
        );
    }
    Ok(generated)
}

fn render_environment_prompts(rewards: &RewardModel, split: EnvSplit, generated: Vec<crate::reward::EnvPrompt>, render: &PromptRender) -> Result<Vec<Prompt>> {
    let (name, file) = (rewards.environment_name().unwrap_or("?"), environment_file(rewards));
    prompts::from_environment(generated, render).with_context(|| format!("environment {name} ({file}): its {split} prompts"))
}

/// An environment's prompt as a message shows it (bounded, control characters replaced).
fn shown_prompt(prompt: &crate::reward::EnvPrompt) -> String {
    crate::plugins::text::shown(&format!("{:?}", prompt.content))
}

/// The environment's file as messages show it.
fn environment_file(rewards: &RewardModel) -> String {
    rewards.environment_file().map_or_else(|| "?".into(), |path| path.display().to_string())
}

/// No evaluation prompt may be a training prompt: an environment that splits its items
/// wrongly fails the run here, naming a shared prompt.
pub fn check_disjoint(environment: &str, train: &[Prompt], eval: &[Prompt]) -> Result<()> {
    let training: HashSet<&str> = train.iter().map(|prompt| prompt.text.as_str()).collect();
    let shared: Vec<&Prompt> = eval.iter().filter(|prompt| training.contains(prompt.text.as_str())).collect();
    ensure!(
        shared.is_empty(),
        "environment {environment}: {} of its {} evaluation prompts are also training prompts, e.g. {:?}; its train and eval \
         splits must not share items (split them by a hash of the item, see plugins/sdk's in_eval_split)",
        shared.len(),
        eval.len(),
        crate::plugins::text::shown(&shared[0].text)
    );
    Ok(())
}
