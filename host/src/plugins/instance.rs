//! One loaded plugin: its compiled component, its store (memory, limits, log) and the typed
//! exports of the world it implements. Every call is bounded in time and memory, and every
//! failure becomes an error naming the plugin, the call and the cause.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail, ensure};
use wasmtime::component::{Component, InstancePre};
use wasmtime::Store;

pub use super::convert::Batch;
use super::component::compile;
use super::convert::{from_legacy_info, from_wit_info};
use super::runtime::{EPOCH_TICK, runtime};
use super::failure::{describe_failure, describe_incompatible, describe_memory_at_start};
use super::store::StoreState;
use super::text::shown;
use super::validate::check_info;
use super::wasi::{CallSeed, Sandbox};
pub(super) use super::exports::Exports;
use super::exports::instantiate_exports;
use super::wit::{Contract, EpisodeEnvironmentPre, contract_of, exported_versions, v0_5};
use super::{EnvironmentInfo, PluginInfo, PluginKind, PluginLimits, Sample};

/// A live instance; dropped after a trap (a trapped instance cannot be entered again).
struct Live {
    store: Store<StoreState>,
    exports: Exports,
}

/// A loaded, configured reward or detector plugin.
pub struct Plugin {
    path: PathBuf,
    /// SHA-256 of the component file as loaded (hex), so a run can tell when it changed.
    sha256: String,
    pre: InstancePre<StoreState>,
    contract: Contract,
    info: PluginInfo,
    /// An environment's components and metrics (None for rewards and detectors).
    pub(super) environment: Option<EnvironmentInfo>,
    /// The parameters `configure` receives: the user's, with `hf-dataset` names replaced by the
    /// datasets' rows (`datasets.rs`).
    params_json: String,
    /// The parameters as the user gave them, for messages.
    given_params: String,
    /// SHA-256 of each dataset read for an `hf-dataset` parameter (`datasets.rs`).
    dataset_sha256: std::collections::BTreeMap<String, String>,
    limits: PluginLimits,
    live: Option<Live>,
    /// Why the last instance was dropped, until `reinstantiate` is called.
    failure: Option<String>,
    /// The fuel the last call that returned used (what `plugin bench` reports).
    last_call_fuel: u64,
    /// Whether it implements the episode-environment world (issue 48; `episodes.rs`).
    pub(super) episodic: bool,
    /// Whether the component imports the judge interface (contract 0.3 environments).
    imports_judge: bool,
    /// The program runner, when the component imports `programs` (loaded with the plugin, so a
    /// missing runner fails the load).
    program_runner: Option<&'static super::programs::Runner>,
    /// Whether the component imports WASI (a language runtime): its stores get the
    /// deterministic sandbox of `wasi.rs`, everything else none.
    imports_wasi: bool,
    sources: Option<super::python_sources::SourcesDir>,
    /// The judge its `judge` import calls (attached by the run; None: the import errs).
    judge: Option<super::judge::SharedJudge>,
}

/// The parameters of a plugin given none: the WIT's "`{}` = all defaults", passed to
/// `configure` by every command and run.
pub const NO_PARAMS: &str = "{}";

/// Refuses parameters that are not a JSON object, naming the plugin: `configure` receives a
/// JSON object by contract (`wit/smallrl-reward.wit`).
fn check_params_object(path: &Path, params_json: &str) -> Result<()> {
    match serde_json::from_str::<serde_json::Value>(params_json) {
        Ok(serde_json::Value::Object(_)) => Ok(()),
        _ => anyhow::bail!(
            "plugin {}: its parameters {} are not a JSON object: give them as one, e.g. --params '{{\"name\": value}}' (`{NO_PARAMS}` for the defaults)",
            path.display(),
            shown(params_json)
        ),
    }
}

impl Plugin {
    /// Loads a component, finds which contract version (its export names) and world (type
    /// check plus a trial instantiation) it implements, reads its `info` and configures it with
    /// `params_json`, a JSON object ([`NO_PARAMS`] = defaults, as the WIT promises `configure`:
    /// anything else is refused here, since a component written from the WIT alone may not
    /// accept it).
    pub fn load(path: &Path, params_json: &str, limits: PluginLimits) -> Result<Self> {
        let mut plugin = Self::unconfigured(path, params_json, limits)?;
        check_params_object(path, params_json)?;
        let expanded = super::datasets::expand(&plugin.info, params_json, &plugin.label())?;
        (plugin.params_json, plugin.dataset_sha256) = (expanded.params_json, expanded.dataset_sha256);
        plugin.configure()?;
        Ok(plugin)
    }

    /// [`Plugin::load`] up to its `info` (what `plugin build` checks: a Python module loads
    /// and declares its plugin), not configured.
    pub fn unconfigured(path: &Path, params_json: &str, limits: PluginLimits) -> Result<Self> {
        let runtime = runtime()?;
        let (component, sha256, sources) = compile(runtime, path)?;
        let imports_wasi = super::wasi::imports_wasi(&component, &runtime.engine);
        let limits = if imports_wasi { limits.for_language_runtime() } else { limits };
        let incompatible = |error| describe_incompatible(path, &component, &runtime.engine, error);
        let pre = runtime.linker_for(imports_wasi).instantiate_pre(&component).map_err(incompatible)?;
        let contract = contract_of_component(&component, &runtime.engine).ok_or_else(|| incompatible(wasmtime::format_err!("it exports no smallrl:reward interface")))?;
        let store_kind = StoreKind { limits, wasi_sha256: imports_wasi.then(|| sha256.clone()), sources: sources.clone() };
        let live = instantiate_any_world(&pre, &store_kind, contract).map_err(|failure| match failure.memory_wanted {
            Some(bytes) => describe_memory_at_start(path, bytes, limits),
            None => describe_incompatible(path, &component, &runtime.engine, failure.error),
        })?;
        let program_runner = match super::programs::imports_programs(&component, &runtime.engine) {
            true => Some(super::programs::runner().with_context(|| format!("plugin {} runs programs (it imports the program runner)", path.display()))?),
            false => None,
        };
        let info = PluginInfo { name: String::new(), version: String::new(), kind: live.kind(), description: String::new(), params: Vec::new() };
        let episodic = matches!(live.exports, Exports::EpisodeEnvironment(_) | Exports::V05EpisodeEnvironment(_));
        let mut plugin = Self {
            path: path.to_owned(),
            sha256,
            pre,
            contract,
            info,
            environment: None,
            params_json: params_json.to_owned(),
            given_params: params_json.to_owned(),
            dataset_sha256: Default::default(),
            limits,
            live: Some(live),
            failure: None,
            episodic,
            last_call_fuel: 0,
            imports_judge: super::judge::imports_judge(&component, &runtime.engine),
            program_runner,
            imports_wasi,
            sources,
            judge: None,
        };
        plugin.info = plugin.read_info()?;
        Ok(plugin)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What the plugin says about itself, checked against the contract's rules at load
    /// (names, version, parameter types and defaults). Descriptions are the plugin's own text:
    /// show them through [`super::text::shown`].
    pub fn info(&self) -> &PluginInfo {
        &self.info
    }

    /// SHA-256 of the component file as it was loaded, in hex.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// SHA-256 of each dataset the host read for its `hf-dataset` parameters, keyed
    /// `hf-dataset <owner/name[:config]>` (empty without one).
    pub fn dataset_sha256(&self) -> &std::collections::BTreeMap<String, String> {
        &self.dataset_sha256
    }

    pub fn kind(&self) -> PluginKind {
        self.info.kind
    }

    /// The contract version the plugin was built against, e.g. "0.6.0" (a 0.1 plugin never
    /// sees the samples' metadata).
    pub fn contract_version(&self) -> &'static str {
        self.contract.version()
    }

    /// Whether the component imports the host's judge (`smallrl:reward/judge`).
    pub fn imports_judge(&self) -> bool {
        self.imports_judge
    }

    /// The program runner's file and SHA-256 when the component imports `programs` (a run
    /// records them with the plugins' hashes).
    pub fn program_runner(&self) -> Option<(&Path, &str)> {
        self.program_runner.map(|runner| (runner.path(), runner.sha256()))
    }

    /// Whether the component imports WASI and so runs in the deterministic WASI sandbox.
    pub fn imports_wasi(&self) -> bool {
        self.imports_wasi
    }

    /// Attaches the judge its `judge` import calls from now on.
    pub fn set_judge(&mut self, judge: super::judge::SharedJudge) {
        self.judge = Some(judge);
    }

    /// The fuel (about one unit per WebAssembly instruction) the last successful call used.
    pub fn last_call_fuel(&self) -> u64 {
        self.last_call_fuel
    }

    /// Whether the last call trapped; the plugin refuses calls until [`Plugin::reinstantiate`].
    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    /// Scores a batch: exactly one finite score per sample, or an error (a sample the plugin
    /// gives no score included: see [`Plugin::score_optional`]).
    pub fn score(&mut self, samples: &[Sample]) -> Result<Vec<f64>> {
        self.score_batch(&Batch::new(samples))
    }

    /// Scores a batch: exactly one score per sample, finite or None (no score, contract 0.5;
    /// older plugins score every sample), or an error.
    pub fn score_optional(&mut self, samples: &[Sample]) -> Result<Vec<Option<f64>>> {
        self.score_batch_optional(&Batch::new(samples))
    }

    /// Flags a batch: exactly one flag per sample, or an error.
    pub fn detect(&mut self, samples: &[Sample]) -> Result<Vec<bool>> {
        self.detect_batch(&Batch::new(samples))
    }

    /// [`Plugin::score`] of a batch converted once for several plugins.
    pub fn score_batch(&mut self, batch: &Batch) -> Result<Vec<f64>> {
        let scores = self.score_batch_optional(batch)?;
        every_score(&self.label(), "score", scores)
    }

    /// [`Plugin::score_optional`] of a batch converted once for several plugins.
    pub fn score_batch_optional(&mut self, batch: &Batch) -> Result<Vec<Option<f64>>> {
        // Before 0.5 every sample has a score.
        let all_present = |scores: Result<Vec<f64>, String>| Some(scores.map(|scores| scores.into_iter().map(Some).collect()));
        let scores = self.call_batch("score", batch, |store, exports| match exports {
            Exports::Reward(reward) => reward.smallrl_reward_scorer().call_score(store, batch.current()).map(Some),
            Exports::V05Reward(reward) => reward.smallrl_reward_scorer().call_score(store, batch.current()).map(Some),
            Exports::V04Reward(reward) => reward.smallrl_reward_scorer().call_score(store, batch.current()).map(all_present),
            Exports::V03Reward(reward) => reward.smallrl_reward_scorer().call_score(store, batch.current()).map(all_present),
            Exports::V02Reward(reward) => reward.smallrl_reward_scorer().call_score(store, batch.current()).map(all_present),
            Exports::LegacyReward(reward) => reward.smallrl_reward_scorer().call_score(store, batch.legacy()).map(all_present),
            _ => Ok(None),
        })?;
        let mut present = scores.iter().enumerate().filter_map(|(index, score)| score.map(|score| (index, score)));
        if let Some((index, score)) = present.find(|(_, score)| !score.is_finite()) {
            bail!("{}: score returned {score} for sample {index}; scores must be finite numbers", self.label());
        }
        Ok(scores)
    }

    /// [`Plugin::detect`] of a batch converted once for several plugins.
    pub fn detect_batch(&mut self, batch: &Batch) -> Result<Vec<bool>> {
        self.call_batch("detect", batch, |store, exports| match exports {
            Exports::Detector(detector) => detector.smallrl_reward_flagger().call_detect(store, batch.current()).map(Some),
            Exports::V05Detector(detector) => detector.smallrl_reward_flagger().call_detect(store, batch.current()).map(Some),
            Exports::V04Detector(detector) => detector.smallrl_reward_flagger().call_detect(store, batch.current()).map(Some),
            Exports::V03Detector(detector) => detector.smallrl_reward_flagger().call_detect(store, batch.current()).map(Some),
            Exports::V02Detector(detector) => detector.smallrl_reward_flagger().call_detect(store, batch.current()).map(Some),
            Exports::LegacyDetector(detector) => detector.smallrl_reward_flagger().call_detect(store, batch.legacy()).map(Some),
            _ => Ok(None),
        })
    }

    /// Replaces a trapped instance with a fresh one (configured with the same parameters).
    /// Never called implicitly: the caller decides, and should log, that it recovers.
    pub fn reinstantiate(&mut self) -> Result<()> {
        let live = instantiate_world(&self.pre, &self.store_kind(), self.kind(), self.contract)
            .map_err(|failure| anyhow::Error::from(failure.error))
            .with_context(|| format!("{}: cannot re-instantiate", self.label()))?;
        self.live = Some(live);
        self.failure = None;
        self.configure()
    }

    /// A second instance of this plugin: the component compiled at load (its bytes as then: the
    /// same SHA-256), configured with the same parameters and given the same judge, in a store
    /// of its own (a run's sampler thread plays its episodes ahead on one, `train/episodes.rs`).
    pub fn another_instance(&self) -> Result<Self> {
        let label = self.label();
        let live = match REFUSE_ANOTHER_INSTANCE.replace(false) {
            true => Err(anyhow!("its instantiation was refused (a test hook)")),
            false => instantiate_world(&self.pre, &self.store_kind(), self.kind(), self.contract).map_err(|failure| anyhow::Error::from(failure.error)),
        };
        let live = live.with_context(|| format!("{label}: cannot start a second instance"))?;
        let mut plugin = Self {
            path: self.path.clone(),
            sha256: self.sha256.clone(),
            pre: self.pre.clone(),
            contract: self.contract,
            info: self.info.clone(),
            environment: self.environment.clone(),
            params_json: self.params_json.clone(),
            given_params: self.given_params.clone(),
            dataset_sha256: self.dataset_sha256.clone(),
            limits: self.limits,
            live: Some(live),
            failure: None,
            last_call_fuel: 0,
            episodic: self.episodic,
            imports_judge: self.imports_judge,
            program_runner: self.program_runner,
            imports_wasi: self.imports_wasi,
            sources: self.sources.clone(),
            judge: self.judge.clone(),
        };
        plugin.configure().with_context(|| format!("{label}: cannot start a second instance"))?;
        Ok(plugin)
    }

    /// "plugin happy_count (reward, plugins/happy.wasm)": how errors name this plugin.
    pub fn label(&self) -> String {
        match self.info.name.is_empty() {
            true => format!("plugin {}", self.path.display()),
            false => format!("plugin {} ({}, {})", self.info.name, self.info.kind, self.path.display()),
        }
    }

    fn read_info(&mut self) -> Result<PluginInfo> {
        if self.kind() == PluginKind::Environment {
            return self.read_environment_info();
        }
        let (info, claimed) = self.call("info", 1, Vec::new, |store, exports| match exports {
            Exports::Reward(reward) => reward.smallrl_reward_plugin().call_info(store).map(from_wit_info),
            Exports::Detector(detector) => detector.smallrl_reward_plugin().call_info(store).map(from_wit_info),
            Exports::V05Reward(reward) => reward.smallrl_reward_plugin().call_info(store).map(from_wit_info),
            Exports::V05Detector(detector) => detector.smallrl_reward_plugin().call_info(store).map(from_wit_info),
            Exports::V04Reward(reward) => reward.smallrl_reward_plugin().call_info(store).map(from_wit_info),
            Exports::V04Detector(detector) => detector.smallrl_reward_plugin().call_info(store).map(from_wit_info),
            Exports::V03Reward(reward) => reward.smallrl_reward_plugin().call_info(store).map(from_wit_info),
            Exports::V03Detector(detector) => detector.smallrl_reward_plugin().call_info(store).map(from_wit_info),
            Exports::V02Reward(reward) => reward.smallrl_reward_plugin().call_info(store).map(from_wit_info),
            Exports::V02Detector(detector) => detector.smallrl_reward_plugin().call_info(store).map(from_wit_info),
            Exports::LegacyReward(reward) => reward.smallrl_reward_plugin().call_info(store).map(from_legacy_info),
            Exports::LegacyDetector(detector) => detector.smallrl_reward_plugin().call_info(store).map(from_legacy_info),
            _ => unreachable!("environments are read above"),
        })?;
        let kind = self.kind();
        ensure!(claimed == kind, "{}: info() says it is a {claimed} but it implements the {kind} world", self.label());
        check_info(&info).map_err(|rule| {
            anyhow!("{}: its info() breaks the plugin contract (wit/smallrl-reward.wit): {rule}", self.label())
        })?;
        Ok(info)
    }

    fn configure(&mut self) -> Result<()> {
        let params_json = self.params_json.clone();
        // A dataset's rows are parsed in the sandbox: the fuel of one sample per KiB of them.
        let budget_samples = 1 + params_json.len() / 1024;
        let outcome = self.call("configure", budget_samples, || params_json.as_bytes().to_vec(), |store, exports| match exports {
            Exports::Reward(reward) => reward.smallrl_reward_plugin().call_configure(store, &params_json),
            Exports::Detector(detector) => detector.smallrl_reward_plugin().call_configure(store, &params_json),
            Exports::V02Reward(reward) => reward.smallrl_reward_plugin().call_configure(store, &params_json),
            Exports::V02Detector(detector) => detector.smallrl_reward_plugin().call_configure(store, &params_json),
            Exports::Environment(environment) => environment.smallrl_reward_env().call_configure(store, &params_json),
            Exports::EpisodeEnvironment(environment) => environment.smallrl_reward_env().call_configure(store, &params_json),
            Exports::V05Reward(reward) => reward.smallrl_reward_plugin().call_configure(store, &params_json),
            Exports::V05Detector(detector) => detector.smallrl_reward_plugin().call_configure(store, &params_json),
            Exports::V05Environment(environment) => environment.smallrl_reward_env().call_configure(store, &params_json),
            Exports::V05EpisodeEnvironment(environment) => environment.smallrl_reward_env().call_configure(store, &params_json),
            Exports::V04Reward(reward) => reward.smallrl_reward_plugin().call_configure(store, &params_json),
            Exports::V04Detector(detector) => detector.smallrl_reward_plugin().call_configure(store, &params_json),
            Exports::V04Environment(environment) => environment.smallrl_reward_env().call_configure(store, &params_json),
            Exports::V03Reward(reward) => reward.smallrl_reward_plugin().call_configure(store, &params_json),
            Exports::V03Detector(detector) => detector.smallrl_reward_plugin().call_configure(store, &params_json),
            Exports::V03Environment(environment) => environment.smallrl_reward_env().call_configure(store, &params_json),
            Exports::LegacyReward(reward) => reward.smallrl_reward_plugin().call_configure(store, &params_json),
            Exports::LegacyDetector(detector) => detector.smallrl_reward_plugin().call_configure(store, &params_json),
        })?;
        outcome.map_err(|message| {
            anyhow!(
                "{}: rejected its parameters {}: {} (`smallrl plugin info {}` lists them)",
                self.label(),
                self.given_params,
                shown(&message),
                self.path.display()
            )
        })
    }

    /// How this plugin's stores are made: its limits, and the WASI sandbox if it imports WASI.
    fn store_kind(&self) -> StoreKind {
        StoreKind { limits: self.limits, wasi_sha256: self.imports_wasi.then(|| self.sha256.clone()), sources: self.sources.clone() }
    }

    /// Runs one export under the fuel of `samples` samples and the call-time limit; a trap
    /// drops the instance and says why. `arguments` are the call's inputs as bytes: with WASI
    /// they seed the call's random stream (read only then).
    pub(super) fn call<R>(
        &mut self,
        call: &str,
        samples: usize,
        arguments: impl FnOnce() -> Vec<u8>,
        run: impl FnOnce(&mut Store<StoreState>, &Exports) -> wasmtime::Result<R>,
    ) -> Result<R> {
        let label = self.label();
        let Some(live) = self.live.as_mut() else {
            let failure = self.failure.as_deref().unwrap_or("unknown failure");
            bail!("{label}: cannot {call}: an earlier call failed ({failure}); the plugin must be re-instantiated explicitly");
        };
        let seed = match self.imports_wasi {
            true => CallSeed::new(&self.sha256, call, &arguments()),
            false => CallSeed::default(),
        };
        set_budget(&mut live.store, self.limits, samples, seed).map_err(anyhow::Error::from).with_context(|| format!("{label}: cannot set its fuel"))?;
        live.store.data_mut().set_judge(self.judge.clone());
        match run(&mut live.store, &live.exports) {
            Ok(value) => {
                self.last_call_fuel = live.store.data().fuel_budget().saturating_sub(live.store.get_fuel().unwrap_or(0));
                Ok(value)
            }
            Err(error) => {
                let cause = describe_failure(error, live.store.data(), self.limits);
                self.live = None;
                self.failure = Some(cause.clone());
                bail!("{label}: {call} failed: {cause}")
            }
        }
    }

    /// Runs a batch export and checks the answer: the world has the call (`run` returns None
    /// otherwise), the guest returned no error string, and one value per sample.
    pub(super) fn call_batch<T>(
        &mut self,
        call: &str,
        batch: &Batch,
        run: impl FnOnce(&mut Store<StoreState>, &Exports) -> wasmtime::Result<Option<Result<Vec<T>, String>>>,
    ) -> Result<Vec<T>> {
        let outcome = self.call(call, batch.len(), || batch.digest().to_vec(), run)?;
        let values = match outcome {
            None => bail!("{}: is a {}, it has no `{call}`", self.label(), self.kind()),
            Some(Err(message)) => bail!("{}: {call} returned an error: {}", self.label(), shown(&message)),
            Some(Ok(values)) => values,
        };
        ensure!(
            values.len() == batch.len(),
            "{}: {call} returned {} values for a batch of {} samples (one per sample is required)",
            self.label(),
            values.len(),
            batch.len()
        );
        Ok(values)
    }
}

impl Live {
    fn kind(&self) -> PluginKind {
        self.exports.kind()
    }
}

/// `scores` (of `call`), each present: a sample without a score (contract 0.5's none) is an
/// error naming the plugin (`label`) and the sample; the caller names the step.
pub fn every_score(label: &str, call: &str, scores: Vec<Option<f64>>) -> Result<Vec<f64>> {
    let missing = scores.iter().position(Option::is_none);
    match missing {
        Some(index) => bail!("{label}: {call} gave sample {index} no score (contract 0.5's none), and a run trains only on samples with a score"),
        None => Ok(scores.into_iter().flatten().collect()),
    }
}

/// Why an instantiation failed, and whether it was the memory limit (the store, which saw
/// the refused growth, is gone by the time the error is read).
struct InstantiateFailure {
    error: wasmtime::Error,
    /// The memory the component asked for when it was refused, in bytes.
    memory_wanted: Option<usize>,
}

/// The contract version a component was built against, from the version of the
/// `smallrl:reward` interfaces it exports; None when it exports none this host runs.
fn contract_of_component(component: &Component, engine: &wasmtime::Engine) -> Option<Contract> {
    exported_versions(component, engine).iter().find_map(|version| contract_of(version))
}

/// What a plugin's stores are made with.
struct StoreKind {
    limits: PluginLimits,
    /// The component file's SHA-256 when it imports WASI (it seeds the sandbox); None: no WASI.
    wasi_sha256: Option<String>,
    /// A Python component's own files (`python_sources.rs`), preopened in its sandbox.
    sources: Option<super::python_sources::SourcesDir>,
}

/// The trial instantiation that tells the worlds apart: an export-name check alone would accept
/// a wrong signature, which only instantiation (typed lookup of each export) catches.
fn instantiate_any_world(pre: &InstancePre<StoreState>, store_kind: &StoreKind, contract: Contract) -> Result<Live, InstantiateFailure> {
    let reward_failure = match instantiate_world(pre, store_kind, PluginKind::Reward, contract) {
        Ok(live) => return Ok(live),
        Err(failure) if failure.memory_wanted.is_some() => return Err(failure),
        Err(failure) => failure,
    };
    let detector_failure = match instantiate_world(pre, store_kind, PluginKind::Detector, contract) {
        Ok(live) => return Ok(live),
        Err(failure) if failure.memory_wanted.is_some() => return Err(failure),
        Err(failure) => failure,
    };
    let environment_failure = match contract {
        Contract::Current | Contract::V0_5 | Contract::V0_4 | Contract::V0_3 => match instantiate_world(pre, store_kind, PluginKind::Environment, contract) {
            Ok(live) => return Ok(live),
            Err(failure) if failure.memory_wanted.is_some() => return Err(failure),
            Err(failure) => format!("{:#}", anyhow::Error::from(failure.error)),
        },
        _ => format!("contract {} has no environment world", contract.version()),
    };
    Err(InstantiateFailure {
        memory_wanted: None,
        error: wasmtime::format_err!(
            "not a reward ({:#}), not a detector ({:#}) and not an environment ({environment_failure})",
            anyhow::Error::from(reward_failure.error),
            anyhow::Error::from(detector_failure.error)
        ),
    })
}

/// The episode-environment world (contract 0.6, or the frozen 0.5), or why not.
fn instantiate_episode_world(pre: &InstancePre<StoreState>, store_kind: &StoreKind, contract: Contract) -> Result<Live, InstantiateFailure> {
    instantiate_as(pre, store_kind, |pre, store| match contract {
        Contract::V0_5 => v0_5::EpisodeEnvironmentPre::new(pre.clone()).and_then(|pre| pre.instantiate(store)).map(Exports::V05EpisodeEnvironment),
        _ => EpisodeEnvironmentPre::new(pre.clone()).and_then(|pre| pre.instantiate(store)).map(Exports::EpisodeEnvironment),
    })
}

/// An episode environment has every export of the environment world too: tried first. A
/// component that exports `episodes` but does not instantiate as that world is refused with
/// why (never loaded as a single-turn environment instead).
fn instantiate_world(pre: &InstancePre<StoreState>, store_kind: &StoreKind, kind: PluginKind, contract: Contract) -> Result<Live, InstantiateFailure> {
    if kind == PluginKind::Environment && matches!(contract, Contract::Current | Contract::V0_5) {
        match instantiate_episode_world(pre, store_kind, contract) {
            Ok(live) => return Ok(live),
            Err(failure) if failure.memory_wanted.is_some() || exports_episodes(pre) => return Err(failure),
            Err(_) => {}
        }
    }
    instantiate_as(pre, store_kind, |pre, store| instantiate_exports(pre, store, kind, contract))
}

/// Whether the component exports the `episodes` interface (of any version).
fn exports_episodes(pre: &InstancePre<StoreState>) -> bool {
    let exports = pre.component().component_type().exports(pre.engine()).map(|(name, _)| name.to_string()).collect::<Vec<_>>();
    exports.iter().any(|name| name.strip_prefix(super::wit::INTERFACE_PREFIX).is_some_and(|rest| rest.starts_with("episodes@")))
}

/// A fresh store with `store_kind`'s sandbox and limits, and `exports` instantiated in it.
fn instantiate_as(
    pre: &InstancePre<StoreState>,
    store_kind: &StoreKind,
    exports: impl FnOnce(&InstancePre<StoreState>, &mut Store<StoreState>) -> wasmtime::Result<Exports>,
) -> Result<Live, InstantiateFailure> {
    let sandbox = store_kind.wasi_sha256.as_deref().map(|sha256| Sandbox::new(sha256, store_kind.sources.as_ref().map(|s| s.path()))).transpose();
    let sandbox = sandbox.map_err(|error| InstantiateFailure { error: wasmtime::Error::msg(format!("{error:#}")), memory_wanted: None })?;
    let state = StoreState::new(store_kind.limits.max_memory_bytes, sandbox);
    let mut store = Store::new(pre.engine(), state);
    store.limiter(|state| state);
    let seed = CallSeed::new(store_kind.wasi_sha256.as_deref().unwrap_or_default(), "instantiate", &[]);
    let instantiated = set_budget(&mut store, store_kind.limits, 1, seed).and_then(|()| exports(pre, &mut store));
    match instantiated {
        Ok(exports) => Ok(Live { store, exports }),
        Err(error) => Err(InstantiateFailure { error, memory_wanted: store.data().memory_limit_hit() }),
    }
}

/// Gives the store the fuel and judge budget of a call over `samples` samples, a fresh
/// wall-clock deadline (which the judge's time counts against) and (with WASI) the clock and
/// random stream of `seed`.
fn set_budget(store: &mut Store<StoreState>, limits: PluginLimits, samples: usize, seed: CallSeed) -> wasmtime::Result<()> {
    let fuel = limits.fuel_for(samples);
    store.set_fuel(fuel)?;
    store.data_mut().start_call(fuel, seed);
    *store.data_mut().judge_budget_mut() = super::judge::JudgeBudget::for_call(&limits, samples);
    store.data_mut().set_program_limits(limits.programs);
    store.set_epoch_deadline(deadline_ticks(limits));
    Ok(())
}

/// Ticks until the deadline, plus one because the current tick may end at once.
fn deadline_ticks(limits: PluginLimits) -> u64 {
    (limits.max_call_time.as_nanos() / EPOCH_TICK.as_nanos()) as u64 + 1
}


thread_local! {
    static REFUSE_ANOTHER_INSTANCE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A test hook: the next [`Plugin::another_instance`] on this thread fails to instantiate.
#[doc(hidden)]
pub fn refuse_another_instance_for_tests() {
    REFUSE_ANOTHER_INSTANCE.set(true);
}

/// The sampler thread of a run owns an instance (`Plugin::another_instance`).
const _: fn() = || {
    fn send<T: Send>() {}
    send::<Plugin>();
};
