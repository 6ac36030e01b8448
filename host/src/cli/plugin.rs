//! `smallrl plugin ...`: scaffold, inspect, run and benchmark reward / detector plugins and
//! environments.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};

use crate::model::tokenizer::Tokenizer;
use crate::defaults as d;
use super::plugin_samples::{completion_only, read_samples};
use super::plugin_snapshot::{SnapshotArgs, default_snapshot_path, snapshot};
use crate::plugins::text::shown;
use crate::plugins::python::ModuleKind;
use crate::plugins::{NO_PARAMS, Plugin, PluginInfo, PluginKind, PluginLimits, bench, python, scaffold, scaffold_python};

/// The sandbox's per-call limits as flags (`smallrl train` and
/// `smallrl plugin info|score|snapshot|bench`); the same names are keys of a run config.
/// Defaults: `defaults.rs` (`PLUGIN_*`).
#[derive(Args, Debug, Default, Serialize)]
pub struct PluginLimitArgs {
    /// Fuel (about one unit per WebAssembly instruction) a plugin call may use per sample: the
    /// deterministic bound on a plugin's work.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugin_fuel_per_sample: Option<u64>,
    /// Wall-clock seconds a plugin call may run, the backstop behind fuel.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugin_max_call_seconds: Option<f64>,
    /// Largest plugin memory in MiB, its initial memory included.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plugin_max_memory_mb: Option<usize>,
    /// Fuel of each program the plugin runs through the program runner.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub program_fuel: Option<u64>,
    /// Largest memory of each program's interpreter in MiB.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub program_max_memory_mb: Option<usize>,
    /// Most KiB each program may write to stdout and stderr together.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub program_max_output_kib: Option<usize>,
}

impl PluginLimitArgs {
    /// The limits given, the defaults for the others.
    pub fn limits(&self) -> Result<PluginLimits> {
        PluginLimits::new(
            self.plugin_max_call_seconds.unwrap_or(d::PLUGIN_MAX_CALL_SECONDS),
            self.plugin_max_memory_mb.unwrap_or(d::PLUGIN_MAX_MEMORY_MB),
            self.plugin_fuel_per_sample.unwrap_or(d::PLUGIN_FUEL_PER_SAMPLE),
        )?
        .with_program_limits(
            self.program_fuel.unwrap_or(d::PROGRAM_FUEL),
            self.program_max_memory_mb.unwrap_or(d::PROGRAM_MAX_MEMORY_MB),
            self.program_max_output_kib.unwrap_or(d::PROGRAM_MAX_OUTPUT_KIB),
        )
    }
}

#[derive(Subcommand)]
pub enum PluginCommand {
    /// Create a plugin crate that builds (`./build.sh` writes NAME.wasm); see plugins/README.md.
    New {
        /// snake_case name of the plugin (and its crate).
        name: String,
        /// Directory in which the crate directory is created.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        #[arg(long, value_enum, default_value_t = Kind::Reward)]
        kind: Kind,
        /// The same as `--kind environment`: a whole task (prompts, rewards, monitor, ground truth).
        #[arg(long, conflicts_with = "kind")]
        environment: bool,
        /// The same as `--kind episode`: a multi-turn environment (a Rust crate; with `--python` a module).
        #[arg(long, conflicts_with_all = ["kind", "environment"])]
        episode: bool,
        /// A Python module and its tests (`smallrl plugin build NAME/NAME.py` builds it)
        /// instead of a Rust crate.
        #[arg(long)]
        python: bool,
    },
    /// Build a Python module (the SDK in plugins/python, or a TRL reward function) into a
    /// component: componentize-py builds a base once per set of imports (cached); a rebuild after an edit writes the module's files after the cached base, in about a second.
    Build {
        /// The module, e.g. my_reward.py.
        path: PathBuf,
        /// The component to write [default: the module's path with .wasm].
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// The world to build against [default: the SDK declaration the module uses, else reward].
        #[arg(long, value_enum)]
        kind: Option<Kind>,
        /// A pip requirements file of pure-Python packages to bundle (pinned in `plugin info`).
        #[arg(long)]
        requirements: Option<PathBuf>,
        /// A pure-Python package to bundle: a wheel or a source directory (repeatable).
        #[arg(long = "package")]
        packages: Vec<PathBuf>,
    },
    /// Where the Python SDK (the `smallrl` package) is: a module's own tests put it on
    /// PYTHONPATH, e.g. `PYTHONPATH=$(smallrl plugin sdk --path) python3 test_my_reward.py`.
    Sdk {
        /// Print only the directory that holds the `smallrl` package.
        #[arg(long)]
        path: bool,
    },
    /// The Python caches beside the compiled-code cache (`python-sources/`, `python-builds/`,
    /// `python-deps/`): where they are; `--prune` removes what no live plugin holds, bases unused
    /// for `--keep-days` and packages folders no cached base names and no build used for
    /// `--keep-days` (plugins/README.md, "The edit cycle").
    Cache {
        /// Remove every entry no live plugin needs (see above).
        #[arg(long)]
        prune: bool,
        /// With --prune: keep base components and packages folders used within this many days.
        #[arg(long, default_value_t = d::PYTHON_CACHE_KEEP_DAYS)]
        keep_days: u64,
    },
    /// Print what a plugin is (reward or detector), its description and its parameters.
    Info {
        path: PathBuf,
        #[command(flatten)]
        limits: PluginLimitArgs,
    },
    /// Print an environment's generated prompts, one JSON line each ({"content", "metadata"}),
    /// as a run would draw them (`--split eval` for evaluation prompts).
    Prompts {
        path: PathBuf,
        /// Parameters as a JSON object (the run's `environment_params`).
        #[arg(long)]
        params: Option<String>,
        #[arg(long, value_enum, default_value_t = Split::Train)]
        split: Split,
        #[arg(long, default_value_t = 10)]
        count: usize,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// The share of hackable prompts the generator is asked for [default: the `hack_frac`
        /// key's].
        #[arg(long)]
        hack_frac: Option<f64>,
        #[command(flatten)]
        limits: PluginLimitArgs,
    },
    /// Score texts (or a JSONL file of samples) with a plugin and print one line per sample.
    Score {
        path: PathBuf,
        /// Parameters as a JSON object, e.g. '{"max_count": 3}'.
        #[arg(long)]
        params: Option<String>,
        /// A completion to score (repeatable).
        #[arg(long = "text")]
        texts: Vec<String>,
        /// JSONL, one sample per line: {"prompt": .., "completion": .., "ended_with_eos": ..}.
        #[arg(long)]
        file: Option<PathBuf>,
        /// tokenizer.json used for completion tokens (sentence_length counts tokens); without
        /// it, words and punctuation marks are the tokens.
        #[arg(long)]
        tokenizer: Option<PathBuf>,
        #[command(flatten)]
        limits: PluginLimitArgs,
    },
    /// Score a file of texts and write the results as an insta snapshot (`.snap`), or with
    /// `--check` compare them with it; see plugins/README.md ("Pin a built plugin in CI").
    Snapshot {
        path: PathBuf,
        /// One completion per line, or (`.jsonl`) one sample per line as for `score --file`.
        #[arg(long)]
        texts: PathBuf,
        /// Parameters as a JSON object, e.g. '{"max_count": 3}'.
        #[arg(long)]
        params: Option<String>,
        /// tokenizer.json used for completion tokens (as for `score`).
        #[arg(long)]
        tokenizer: Option<PathBuf>,
        /// The snapshot file [default: snapshots/<plugin file stem>.snap beside the plugin].
        #[arg(long)]
        out: Option<PathBuf>,
        /// Compare with the stored snapshot instead of writing it: a changed result fails with
        /// a diff and leaves the new results in <out>.new for `cargo insta review`.
        #[arg(long)]
        check: bool,
        #[command(flatten)]
        limits: PluginLimitArgs,
    },
    /// Run Python programs through the program runner, each in a fresh sandboxed interpreter
    /// (what a plugin's `programs` import does), and print one JSON outcome per line.
    Programs {
        /// A JSON list of programs: each a source string or an object {"source", "stdin",
        /// "files": {name: text}}.
        file: PathBuf,
        #[command(flatten)]
        limits: PluginLimitArgs,
    },
    /// Scoring throughput of a wasm plugin against the same function in native Rust.
    Bench {
        #[arg(long, default_value = "plugins/happy_count.wasm")]
        path: PathBuf,
        #[arg(long, default_value_t = 512)]
        samples: usize,
        #[arg(long, default_value_t = 100)]
        words: usize,
        #[arg(long, default_value_t = 200)]
        iterations: u32,
        /// Parameters of the plugin at --path (and of --port) as a JSON object.
        #[arg(long)]
        params: Option<String>,
        /// Also time one `RewardModel::score` call of this config's `reward:` and
        /// `rh_detector:` (plugin names resolve in plugins/).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Also time a port of happy_count built in another language (e.g. the component of
        /// plugins/python/happy_count.py): its compile, its cached load and its scoring.
        #[arg(long)]
        port: Option<PathBuf>,
        /// Instead, time the program runner on this many graded programs (a 10-line function
        /// and 5 asserts each) beside one `python3` subprocess per program.
        #[arg(long)]
        programs: Option<usize>,
        #[command(flatten)]
        limits: PluginLimitArgs,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Kind {
    Reward,
    Detector,
    Environment,
    // A multi-turn episode environment (issue 48). A plain comment: a doc comment here would
    // switch clap's help to its long form.
    Episode,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Split {
    Train,
    Eval,
}

pub fn run(command: PluginCommand) -> Result<()> {
    match command {
        PluginCommand::Prompts { path, params, split, count, seed, hack_frac, limits } => {
            let split = match split {
                Split::Train => crate::plugins::EnvSplit::Train,
                Split::Eval => crate::plugins::EnvSplit::Eval,
            };
            let hack_frac = hack_frac.unwrap_or(crate::train::TrainConfig::default().hack_frac);
            prompts(&path, params.as_deref().unwrap_or(NO_PARAMS), split, count, seed, hack_frac, limits.limits()?)
        }
        PluginCommand::New { name, dir, kind, environment, episode, python } => {
            let kind = if environment { Kind::Environment } else if episode { Kind::Episode } else { kind };
            match python {
                true => new_python(&name, &dir, kind.into()),
                false => new(&name, &dir, kind),
            }
        }
        PluginCommand::Build { path, output, kind, requirements, packages } => {
            build(&path, output.as_deref(), kind.map(ModuleKind::from), &python::Packages { requirements, paths: packages })
        }
        PluginCommand::Sdk { path } => sdk(path),
        PluginCommand::Cache { prune, keep_days } => cache(prune, keep_days),
        PluginCommand::Info { path, limits } => info(&path, limits.limits()?),
        PluginCommand::Score { path, params, texts, file, tokenizer, limits } => {
            score(&path, params.as_deref(), &texts, file.as_deref(), tokenizer.as_deref(), limits.limits()?)
        }
        PluginCommand::Snapshot { path, texts, params, tokenizer, out, check, limits } => {
            let out = out.unwrap_or_else(|| default_snapshot_path(&path));
            let args = SnapshotArgs { plugin: &path, texts: &texts, params: params.as_deref(), tokenizer: tokenizer.as_deref(), out: &out };
            snapshot(&args, limits.limits()?, check)
        }
        PluginCommand::Programs { file, limits } => {
            crate::plugins::programs::run_file(&file, limits.limits()?.programs)?.iter().for_each(|outcome| println!("{outcome}"));
            Ok(())
        }
        PluginCommand::Bench { path, samples, words, iterations, params, config, port, programs, limits } => {
            let limits = limits.limits()?;
            if let Some(count) = programs {
                return Ok(println!("{}", crate::plugins::programs_bench::bench(count, 3, limits.programs, Path::new("python3"))?));
            }
            let params = params.as_deref().unwrap_or(NO_PARAMS);
            run_bench(&path, params, samples, words, iterations, limits)?;
            if let Some(port) = port {
                bench_port(&port, params, samples, words, iterations, limits)?;
            }
            config.map_or(Ok(()), |config| bench_config(&config, samples, words, iterations, limits))
        }
    }
}

impl From<Kind> for ModuleKind {
    fn from(kind: Kind) -> Self {
        match kind {
            Kind::Reward => ModuleKind::Reward,
            Kind::Detector => ModuleKind::Detector,
            Kind::Environment => ModuleKind::Environment,
            Kind::Episode => ModuleKind::EpisodeEnvironment,
        }
    }
}

fn new(name: &str, dir: &Path, kind: Kind) -> Result<()> {
    let kind = match kind {
        Kind::Reward => PluginKind::Reward,
        Kind::Detector => PluginKind::Detector,
        Kind::Environment => PluginKind::Environment,
        Kind::Episode => return new_episode(name, dir),
    };
    let crate_dir = scaffold::scaffold(name, dir, kind)?;
    println!("created {kind} plugin crate {}", crate_dir.display());
    println!("next:");
    println!("  {}/build.sh                 # builds {name}.wasm (about a minute the first time)", crate_dir.display());
    match kind {
        PluginKind::Environment => println!("  smallrl plugin info {}/{name}.wasm   # its components and metrics", crate_dir.display()),
        _ => println!("  smallrl plugin score {}/{name}.wasm --text \"a happy happy day\"", crate_dir.display()),
    }
    println!("  (cd {} && cargo test)         # native tests, with a snapshot of fixed texts", crate_dir.display());
    Ok(())
}

fn new_episode(name: &str, dir: &Path) -> Result<()> {
    let crate_dir = scaffold::scaffold_episode(name, dir)?;
    println!("created episode environment crate {}", crate_dir.display());
    println!("next:");
    println!("  {}/build.sh                 # builds {name}.wasm (about a minute the first time)", crate_dir.display());
    println!("  smallrl plugin prompts {}/{name}.wasm   # its prompts", crate_dir.display());
    println!("  (cd {} && cargo test)         # native tests: episodes played by hand", crate_dir.display());
    Ok(())
}

fn new_python(name: &str, dir: &Path, kind: ModuleKind) -> Result<()> {
    let module_dir = scaffold_python::scaffold(name, dir, kind)?;
    let module = module_dir.join(format!("{name}.py"));
    println!("created {kind} plugin module {}", module.display());
    println!("next:");
    println!("  PYTHONPATH=$(smallrl plugin sdk --path) python3 {}/test_{name}.py   # its tests, in plain Python", module_dir.display());
    println!("  smallrl plugin build {}          # writes {name}.wasm (about 15 s the first time)", module.display());
    match kind {
        ModuleKind::Environment | ModuleKind::EpisodeEnvironment => println!("  smallrl plugin prompts {}/{name}.wasm   # its prompts", module_dir.display()),
        _ => println!("  smallrl plugin score {}/{name}.wasm --text \"a happy happy day\"", module_dir.display()),
    }
    Ok(())
}

fn sdk(path_only: bool) -> Result<()> {
    let dir = python::sdk_path()?;
    match path_only {
        true => println!("{}", dir.display()),
        false => {
            println!("the Python SDK (package `smallrl`) is in {}", dir.display());
            println!("  PYTHONPATH=$(smallrl plugin sdk --path) python3 test_my_reward.py   # a module's own tests, from any folder");
        }
    }
    Ok(())
}

fn cache(prune: bool, keep_days: u64) -> Result<()> {
    let root = crate::plugins::python_cache::root()?;
    if !prune {
        return Ok(println!("the Python caches are in {} (`smallrl plugin cache --prune` bounds them)", root.display()));
    }
    let pruned = crate::plugins::python_cache::prune(&root, std::time::Duration::from_secs(keep_days * 86_400))?;
    pruned.removed.iter().for_each(|path| println!("removed {}", path.display()));
    pruned.in_use.iter().for_each(|path| println!("kept {} (a live plugin holds it)", path.display()));
    println!("freed {:.1} MiB under {}", pruned.bytes_freed as f64 / (1u64 << 20) as f64, root.display());
    Ok(())
}

fn build(path: &Path, output: Option<&Path>, kind: Option<ModuleKind>, packages: &python::Packages) -> Result<()> {
    let built = python::build(path, output, kind, packages)?;
    let how = if built.cached { "on the cached base" } else { "base built by componentize-py" };
    println!("{} ({}, {how} in {:.1} s)", built.output.display(), built.kind, built.took.as_secs_f64());
    Ok(())
}

fn prompts(path: &Path, params: &str, split: crate::plugins::EnvSplit, count: usize, seed: u64, hack_frac: f64, limits: PluginLimits) -> Result<()> {
    let mut plugin = Plugin::load(path, params, limits)?;
    anyhow::ensure!(plugin.environment_info().is_some(), "{} is a {}, not an environment: only environments generate prompts", path.display(), plugin.kind());
    for prompt in plugin.generate(split, count, seed, hack_frac)? {
        let content = match prompt.content {
            crate::plugins::EnvPromptContent::Text(text) => serde_json::Value::from(text),
            crate::plugins::EnvPromptContent::Messages(messages) => messages.into_iter().map(|(role, content)| serde_json::json!({"role": role, "content": content})).collect(),
        };
        println!("{}", serde_json::json!({"content": content, "metadata": prompt.metadata}));
    }
    Ok(())
}

fn info(path: &Path, limits: PluginLimits) -> Result<()> {
    let plugin = Plugin::load(path, NO_PARAMS, limits)?;
    print!("{}", describe(plugin.info()));
    if let Some(environment) = plugin.environment_info() {
        println!("reward components (score):");
        for component in &environment.components {
            let role = match component.role {
                crate::plugins::ComponentRole::Retain => "retain",
                crate::plugins::ComponentRole::Forget => "forget",
            };
            println!("  {:<18} {role:<13} {}", component.name, shown(&component.description));
        }
        match environment.metrics.is_empty() {
            true => println!("metrics: none"),
            false => println!("metrics (env/{}/<name>): {}", plugin.info().name, environment.metrics.join(", ")),
        }
        if plugin.imports_judge() {
            println!("imports the host's judge: a run needs `judge:` (docs/src/environments.md, \"The judge\")");
        }
    }
    if let Some(record) = std::fs::read(path).ok().as_deref().and_then(crate::plugins::python_deps::record_of) {
        let list = |items: &[String]| if items.is_empty() { "none".to_string() } else { items.join(", ") };
        println!("bundled Python modules: {}", list(&record.modules));
        println!("bundled Python packages: {}", list(&record.packages));
    }
    println!("contract {}, sha256 {}", plugin.contract_version(), plugin.sha256());
    Ok(())
}

/// The plugin's self-description. Names, version and types were checked at load; the
/// descriptions and defaults are the plugin's own text, bounded and cleaned for the terminal.
fn describe(info: &PluginInfo) -> String {
    let mut text = format!("{} {} ({})\n  {}\n", info.name, info.version, info.kind, shown(&info.description));
    text.push_str(if info.params.is_empty() { "parameters: none\n" } else { "parameters (--params JSON):\n" });
    for param in &info.params {
        let (name, type_name, default) = (&param.name, &param.type_name, shown(&param.default_json));
        text.push_str(&format!("  {name:<18} {type_name:<13} default {default:<10} {}\n", shown(&param.description)));
    }
    text
}

fn score(path: &Path, params: Option<&str>, texts: &[String], file: Option<&Path>, tokenizer: Option<&Path>, limits: PluginLimits) -> Result<()> {
    let tokenizer = tokenizer.map(Tokenizer::from_file).transpose()?;
    let mut samples = texts.iter().map(|text| completion_only(text, tokenizer.as_ref())).collect::<Result<Vec<_>>>()?;
    if let Some(file) = file {
        samples.extend(read_samples(file, tokenizer.as_ref())?);
    }
    anyhow::ensure!(!samples.is_empty(), "nothing to score: give --text TEXT (repeatable) or --file samples.jsonl");
    if tokenizer.is_none() {
        eprintln!("note: no --tokenizer, so words and punctuation marks are the tokens");
    }
    let mut plugin = Plugin::load(path, params.unwrap_or(NO_PARAMS), limits)?;
    // Samples the plugin gives no score (contract 0.5's none) are printed as `none` and counted.
    let mut unscored = 0;
    let results: Vec<String> = match plugin.kind() {
        PluginKind::Reward => {
            let scores = plugin.score_optional(&samples)?;
            unscored = scores.iter().filter(|score| score.is_none()).count();
            scores.iter().map(|&score| crate::plugins::score_text(score)).collect()
        }
        PluginKind::Detector => plugin.detect(&samples)?.iter().map(bool::to_string).collect(),
        PluginKind::Environment => {
            let batch = crate::plugins::Batch::new(&samples);
            let (scores, monitor, truth) = (plugin.score_environment(&batch)?, plugin.monitor(&batch)?, plugin.ground_truth(&batch)?);
            let info = plugin.environment_info().expect("an environment has its info").clone();
            let names: Vec<String> = info.components.iter().map(|c| c.name.clone()).chain(info.metrics.iter().cloned()).collect();
            println!("{}\tmonitor\tground_truth\tcompletion", names.join("\t"));
            unscored = (0..samples.len()).filter(|&i| scores.components.iter().any(|column| column[i].is_none())).count();
            (0..samples.len())
                .map(|i| {
                    let components = scores.components.iter().map(|column| crate::plugins::score_text(column[i]));
                    let values: Vec<String> = components.chain(scores.metrics.iter().map(|column| format!("{:.6}", column[i]))).collect();
                    format!("{}\t{}\t{}", values.join("\t"), monitor[i], truth[i])
                })
                .collect()
        }
    };
    for (result, sample) in results.iter().zip(&samples) {
        println!("{result}\t{}", sample.completion);
    }
    if unscored > 0 {
        eprintln!("{}", no_score_note(unscored, samples.len()));
    }
    Ok(())
}

/// The line `plugin score` and `plugin bench` print when samples have no score.
fn no_score_note(unscored: usize, samples: usize) -> String {
    format!("no score: {unscored} of {samples} samples (contract 0.5's none; a run trains on them only within max_no_score_frac)")
}

fn run_bench(path: &Path, params: &str, samples: usize, words: usize, iterations: u32, limits: PluginLimits) -> Result<()> {
    let report = bench::bench_happy_count(path, params, samples, words, iterations, limits)?;
    println!("happy_count on {samples} completions of {words} words ({iterations} iterations):");
    println!("  load (compile or cache hit + instantiate): {:.2} ms", report.load.as_secs_f64() * 1e3);
    println!(
        "  wasm:   {:>9.3} ms/batch {:>12.0} completions/s",
        report.wasm_per_batch.as_secs_f64() * 1e3,
        report.wasm_per_second()
    );
    println!(
        "  native: {:>9.3} ms/batch {:>12.0} completions/s",
        report.native_per_batch.as_secs_f64() * 1e3,
        report.native_per_second()
    );
    println!("  wasm / native time: {:.2}x", report.wasm_per_batch.as_secs_f64() / report.native_per_batch.as_secs_f64());
    println!("  wasm fuel: {:.0} per sample", report.wasm_fuel_per_sample);
    if report.no_score > 0 {
        println!("  {} (left out of the comparison)", no_score_note(report.no_score, samples));
    }
    Ok(())
}

fn bench_port(path: &Path, params: &str, samples: usize, words: usize, iterations: u32, limits: PluginLimits) -> Result<()> {
    let report = bench::bench_port(path, params, samples, words, iterations, limits)?;
    println!("port {} on the same batch:", path.display());
    println!("  first load (compile, no cache): {:.2} s", report.compile.as_secs_f64());
    println!("  cached load (+ instantiate, info, configure): {:.1} ms", report.cached_load.as_secs_f64() * 1e3);
    println!("  score: {:>9.3} ms/batch {:>12.0} completions/s", report.per_batch.as_secs_f64() * 1e3, samples as f64 / report.per_batch.as_secs_f64());
    println!("  fuel: {:.0} per sample", report.fuel_per_sample);
    if report.no_score > 0 {
        println!("  {} (left out of the comparison)", no_score_note(report.no_score, samples));
    }
    Ok(())
}

/// The sections of a run config that describe rewards; the training keys are ignored here.
#[derive(Deserialize)]
struct RewardSections {
    reward: crate::reward::RewardSpec,
    rh_detector: Option<crate::reward::DetectorSpec>,
}

fn bench_config(config: &Path, samples: usize, words: usize, iterations: u32, limits: PluginLimits) -> Result<()> {
    use crate::reward::{ProtocolKnobs, RewardModel};
    let text = std::fs::read_to_string(config).with_context(|| format!("cannot read {}", config.display()))?;
    anyhow::ensure!(
        !text.lines().any(|line| line.starts_with("environment:")),
        "{} configures an environment: `plugin bench --config` measures reward plugins on synthetic completions, which an \
         environment's prompts do not have (its own tests time it)",
        config.display()
    );
    let sections: RewardSections = crate::yaml::read_file(config)?;
    let knobs = ProtocolKnobs { false_positive_rate: 0.0, recall: 1.0, rh_eligible_frac: 1.0 };
    let detector = sections.rh_detector.as_ref();
    let mut model = RewardModel::load(&sections.reward, detector, knobs, Path::new("plugins"), limits)?;
    let batch = bench::synthetic_batch(samples, words);
    let (mut fastest, mut unscored) = (std::time::Duration::MAX, 0);
    for step in 0..iterations.max(1) {
        let started = std::time::Instant::now();
        // Every sample may lack a score here: they are counted, not refused.
        unscored = model.score_within(&batch, u64::from(step), 1.0)?.unscored.iter().filter(|u| **u).count();
        fastest = fastest.min(started.elapsed());
    }
    let plugins = model.components().len() + usize::from(model.has_detector());
    println!(
        "RewardModel::score of {} ({plugins} plugins) on {samples} completions: {:.3} ms",
        config.display(),
        fastest.as_secs_f64() * 1e3
    );
    if unscored > 0 {
        println!("  {}", no_score_note(unscored, samples));
    }
    Ok(())
}
