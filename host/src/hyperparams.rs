//! One declaration per hyperparameter. [`hyperparameters!`] takes a table of keys (name, type,
//! default, doc line, run-name label, properties, the parts that read it) and writes everything
//! that follows from it:
//!
//! - the configuration struct (serde: the YAML key, the resolved `config.yaml`, sweep keys),
//!   with its `Default`;
//! - an overlay struct of the same keys as `Option`s deriving `clap::Args` (the CLI flag,
//!   `--key-name` in kebab-case, with the doc line as its help);
//! - [`Hyperparameters::KEYS`]: names, labels, docs, rules and properties ([`Prop`]: may
//!   change on resume, must be equal in a pack, reset without routing), which run names,
//!   `--set`, `--grid`, `--fixed`, `--resume`, packs, sweeps' baselines and the key reference
//!   ([`key_reference`]) read;
//! - for a row with `#[rule(..)]`, the key's own validity check ([`Rule`]), run by the
//!   configuration's `check_rules` and shown in the key reference;
//! - for a row ending `=> Part`, the accessor `Part::key()` through which the part that reads
//!   the key gets its value ([`Part`]).
//!
//! Precedence is defaults < YAML file < flags < `--set` ([`resolve`]). Run directory names list
//! every key whose value differs from its default, plus the seed ([`run_name`]).
//!
//! API boundary: the generic functions here know keys and JSON values only; what a key means
//! (cross-key validation, which keys a resume may change) belongs to the config that declares it.
//!
//! Its tests (`hyperparams/tests.rs`) declare a test-only configuration to show that one entry
//! gives a key everything.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// How a key appears in run directory names, when its value differs from the default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Label {
    /// `<key><value>`: `lr1e-3`.
    Key,
    /// `<short><value>`: `bs64`; `Short("")` writes the value alone (`classic`).
    Short(&'static str),
    /// Left out: the key says where or how fast a run executes (or the name already says it).
    Omit,
}

/// What a key is besides its value and label: the hyperparameter table's other columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prop {
    /// May differ when a run is resumed: it does not change what the run computes (another
    /// thread count changes float summation order, which the log records).
    Resume,
    /// Fixes a run's tensor shapes or its schedule of steps: packed runs must agree on it.
    Pack,
    /// Routing or another intervention: the same run without them has it at its default.
    Routing,
}

/// One declared key.
#[derive(Debug)]
pub struct Key {
    pub name: &'static str,
    pub label: Label,
    pub doc: &'static str,
    /// Has a command-line flag (`--name`); file-only keys are set in YAML or with `--set`.
    pub flag: bool,
    pub props: &'static [Prop],
    /// The parts that read the key (the row's `=> Part, ...`), each through the accessor the
    /// table gives it ([`Part`]).
    pub parts: &'static [&'static str],
    /// The key's own rule (the row's `#[rule(..)]`; none or one).
    pub rules: &'static [Rule],
}

/// What a key's value must be on its own (the table's `#[rule(..)]` column): checked on every
/// resolved configuration (the generated `check_rules`) and shown in the key reference. Rules
/// across keys are the declaring configuration's (`train/config/checks.rs`). Checked on the
/// typed value ([`RuleValue`]), so NaN fails every rule; an optional key left unset has none.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    /// Above 0.
    Positive,
    /// At least this.
    AtLeast(f64),
    /// Between `low` and `high`, each end included or not.
    Within { low: f64, high: f64, low_in: bool, high_in: bool },
    /// Finite and above 0.
    FinitePositive,
    /// Neither infinite nor NaN.
    Finite,
}

impl Rule {
    /// `[low, high]`.
    pub const fn closed(low: f64, high: f64) -> Rule {
        Rule::Within { low, high, low_in: true, high_in: true }
    }

    /// `[low, high)`.
    pub const fn closed_open(low: f64, high: f64) -> Rule {
        Rule::Within { low, high, low_in: true, high_in: false }
    }

    /// `(low, high]`.
    pub const fn open_closed(low: f64, high: f64) -> Rule {
        Rule::Within { low, high, low_in: false, high_in: true }
    }

    pub fn holds(&self, x: f64) -> bool {
        match *self {
            Rule::Positive => x > 0.0,
            Rule::AtLeast(min) => x >= min,
            Rule::Within { low, high, low_in, high_in } => (if low_in { x >= low } else { x > low }) && (if high_in { x <= high } else { x < high }),
            Rule::FinitePositive => x.is_finite() && x > 0.0,
            Rule::Finite => x.is_finite(),
        }
    }

    /// `key`'s `value` against the rule: `<key> must be <rule>, got <value>` when it fails.
    pub fn check(&self, key: &str, value: &impl RuleValue) -> Result<()> {
        match value.number() {
            Some(x) if !self.holds(x) => bail!("{key} must be {self}, got {x}"),
            _ => Ok(()),
        }
    }
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Rule::Positive => write!(f, "positive"),
            Rule::AtLeast(min) => write!(f, "at least {min}"),
            Rule::Within { low, high, low_in, high_in } => write!(f, "in {}{low}, {high}{}", if low_in { '[' } else { '(' }, if high_in { ']' } else { ')' }),
            Rule::FinitePositive => write!(f, "finite and above 0"),
            Rule::Finite => write!(f, "finite"),
        }
    }
}

/// A key type a [`Rule`] can check: its value as a number (`None`: an optional key unset).
pub trait RuleValue {
    fn number(&self) -> Option<f64>;
}

macro_rules! number_rule_values {
    ($($t:ty),*) => { $(impl RuleValue for $t { fn number(&self) -> Option<f64> { Some(*self as f64) } })* };
}
number_rule_values!(f64, usize, u64);

impl<T: RuleValue> RuleValue for Option<T> {
    fn number(&self) -> Option<f64> {
        self.as_ref().and_then(T::number)
    }
}

impl Key {
    pub fn has(&self, prop: Prop) -> bool {
        self.props.contains(&prop)
    }
}

/// A configuration declared with [`hyperparameters!`].
pub trait Hyperparameters: Serialize + DeserializeOwned + Default {
    /// Every key, in declaration order.
    const KEYS: &'static [Key];

    fn key(name: &str) -> Option<&'static Key> {
        Self::KEYS.iter().find(|k| k.name == name)
    }

    /// The names of the keys with `prop`, in declaration order.
    fn keys_with(prop: Prop) -> Vec<&'static str> {
        Self::KEYS.iter().filter(|k| k.has(prop)).map(|k| k.name).collect()
    }
}

/// A part of a run (the step's keys, say) built from configuration `C`, reading its keys from
/// the table: a row that ends `=> Part` gives `Part` a method named after the key that returns
/// its value, so a key a part reads is one row, with no field or copy in the part. The part
/// holds the resolved configuration and hands it over here, and reads nothing else of it.
pub trait Part<C> {
    fn table(&self) -> &C;
}

/// `config` with every key that has `prop` at its default value.
pub fn reset<C: Hyperparameters>(config: &C, prop: Prop) -> Result<C> {
    let (mut values, defaults) = (object(config)?, object(&C::default())?);
    for name in C::keys_with(prop) {
        match defaults.get(name) {
            Some(default) => values.insert(name.to_string(), default.clone()),
            None => values.remove(name),
        };
    }
    serde_json::from_value(Value::Object(values)).context("a configuration with keys reset to their defaults")
}

/// The type a key's flag takes: `T` for an optional key `Option<T>`, the key's type otherwise
/// (clap reads `Option<Option<T>>` as a flag with an optional value, which no key means).
pub trait FlagValue {
    type Flag;
}

impl<T: FlagValue> FlagValue for Option<T> {
    type Flag = T::Flag;
}

macro_rules! plain_flag_values {
    ($($t:ty),*) => { $(impl FlagValue for $t { type Flag = $t; })* };
}
plain_flag_values!(String, PathBuf, usize, u64, f64, bool);

/// Declares a configuration: see the module documentation. Every key needs a doc line.
/// `flags { ... }` keys get a command-line flag; `file_only { ... }` keys (structured values
/// such as the reward spec) are set in YAML or with `--set key=<YAML>`. After its doc lines a
/// flag may carry `#[arg(...)]` attributes for its flag (a switch with an optional value), a
/// file-only key `#[serde(...)]` attributes. A flag's doc lines may be followed by
/// `#[rule(..)]`, the key's own validity rule ([`Rule`]). A row may end `=> Part, ...`: the
/// parts that read the key ([`Part`]), each given an accessor named after it.
macro_rules! hyperparameters {
    (
        $(#[$meta:meta])*
        pub struct $config:ident;
        $(#[$ometa:meta])*
        pub struct $overrides:ident;
        flags {
            $( $(#[doc = $doc:literal])+ $(#[rule($rule:expr)])? $(#[arg($($arg:tt)*)])* $(#[serde($($kserde:tt)*)])* $key:ident : $ty:ty = $default:expr, $label:expr $(, [$($prop:ident),*])? $(=> $($part:ident),+)?; )*
        }
        file_only {
            $( $(#[doc = $fdoc:literal])+ $(#[serde($($fserde:tt)*)])* $fkey:ident : $fty:ty = $fdefault:expr, $flabel:expr $(, [$($fprop:ident),*])? $(=> $($fpart:ident),+)?; )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
        #[serde(deny_unknown_fields, default)]
        pub struct $config {
            $( $(#[doc = $doc])+ $(#[serde($($kserde)*)])* pub $key: $ty, )*
            $( $(#[doc = $fdoc])+ $(#[serde($($fserde)*)])* pub $fkey: $fty, )*
        }

        impl Default for $config {
            fn default() -> Self {
                Self { $( $key: $default, )* $( $fkey: $fdefault, )* }
            }
        }

        impl $crate::hyperparams::Hyperparameters for $config {
            const KEYS: &'static [$crate::hyperparams::Key] = &[
                $( $crate::hyperparams::Key {
                    name: stringify!($key), label: $label, doc: concat!($($doc),+), flag: true,
                    props: &[$($($crate::hyperparams::Prop::$prop),*)?], parts: &[$($(stringify!($part)),+)?],
                    rules: &[$($rule)?],
                }, )*
                $( $crate::hyperparams::Key {
                    name: stringify!($fkey), label: $flabel, doc: concat!($($fdoc),+), flag: false,
                    props: &[$($($crate::hyperparams::Prop::$fprop),*)?], parts: &[$($(stringify!($fpart)),+)?],
                    rules: &[],
                }, )*
            ];
        }

        impl $config {
            /// Every key's own rule (the rows' `#[rule(..)]`), in declaration order: the first
            /// value that breaks its rule fails, naming the key.
            pub fn check_rules(&self) -> anyhow::Result<()> {
                $( $( $crate::hyperparams::Rule::check(&$rule, stringify!($key), &self.$key)?; )? )*
                Ok(())
            }
        }

        $( $( $( $crate::hyperparams::part_reads!($config, $part, $key, $ty); )+ )? )*
        $( $( $( $crate::hyperparams::part_reads!($config, $fpart, $fkey, $fty); )+ )? )*

        $(#[$ometa])*
        #[derive(clap::Args, Debug, Default, Clone, serde::Serialize)]
        pub struct $overrides {
            $(
                $(#[doc = $doc])+
                #[arg(long)]
                $(#[arg($($arg)*)])*
                #[serde(skip_serializing_if = "Option::is_none")]
                pub $key: Option<<$ty as $crate::hyperparams::FlagValue>::Flag>,
            )*
        }

        impl $overrides {
            /// The flags given, as config keys.
            pub fn to_map(&self) -> anyhow::Result<serde_json::Map<String, serde_json::Value>> {
                $crate::hyperparams::object(self)
            }
        }
    };
}
pub(crate) use hyperparameters;

/// The accessor a row's `=> Part` gives its part: the key's value, read from the table the part
/// holds ([`Part::table`]).
macro_rules! part_reads {
    ($config:ident, $part:ident, $key:ident, $ty:ty) => {
        impl $part {
            #[doc = concat!("The `", stringify!($key), "` key of [`", stringify!($config), "`] (its row names this part).")]
            pub fn $key(&self) -> $ty {
                ::core::clone::Clone::clone(&<Self as $crate::hyperparams::Part<$config>>::table(self).$key)
            }
        }
    };
}
pub(crate) use part_reads;

/// A struct as a JSON object.
pub fn object<T: Serialize>(value: &T) -> Result<Map<String, Value>> {
    match serde_json::to_value(value)? {
        Value::Object(map) => Ok(map),
        other => bail!("expected a mapping of keys to values, got {other}"),
    }
}

/// Parses `key=value` (the CLI's `--set`, sweeps' `--grid`/`--fixed`): the value is read as
/// YAML, so numbers, booleans, strings and mappings all work; `-` in the key reads as `_`.
pub fn parse_override(text: &str) -> Result<(String, Value)> {
    let (key, value) = text.split_once('=').with_context(|| format!("override {text:?} is not key=value"))?;
    let value: Value = crate::yaml::from_str(value).with_context(|| format!("override {text:?}: bad value"))?;
    Ok((key.trim().replace('-', "_"), value))
}

/// A key that `C` does not declare fails here, naming `flag` and every declared key.
pub fn check_key<C: Hyperparameters>(key: &str, flag: &str) -> Result<()> {
    if C::key(key).is_none() {
        let mut known: Vec<&str> = C::KEYS.iter().map(|k| k.name).collect();
        known.sort_unstable();
        bail!("{flag}: unknown key `{key}`; sweep keys are training config keys (snake_case): {}", known.join(", "));
    }
    Ok(())
}

/// Layers a YAML file's keys (if any) and then `overrides` over the defaults. A file without
/// `name` is named by its stem, and overrides of its `reward` / `rh_detector` extend that name
/// (see [`changed_specs`]). `what` names the configuration in errors.
pub fn resolve<C: Hyperparameters>(file: Option<&Path>, overrides: Map<String, Value>, what: &str) -> Result<C> {
    let mut merged = Map::new();
    if let Some(path) = file {
        match crate::yaml::read_file(path)? {
            Value::Object(map) => merged.extend(map),
            Value::Null => {}
            _ => bail!("{}: a {what} must be a mapping of keys to values", path.display()),
        }
        if !merged.contains_key("name") {
            let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
            merged.insert("name".into(), stem.into());
        }
        if !overrides.contains_key("name") {
            let changed = changed_specs(&merged, &overrides);
            if let (Some(Value::String(name)), false) = (merged.get("name"), changed.is_empty()) {
                let renamed = format!("{name}_{changed}");
                merged.insert("name".into(), renamed.into());
            }
        }
    }
    merged.extend(overrides);
    serde_json::from_value(Value::Object(merged)).map_err(|e| {
        let source = file.map_or("the command line".to_string(), |p| p.display().to_string());
        anyhow::anyhow!("invalid {what} ({source}): {e}")
    })
}

/// The key reference of the book (docs/src/reference.md, kept equal by tests/docs.rs): one
/// Markdown row per key, in declaration order, with its flag, default, rule and doc line.
pub fn key_reference<C: Hyperparameters>() -> String {
    let defaults = serde_json::to_value(C::default()).expect("a configuration serializes");
    let mut table = String::from("| key | flag | default | rule | what it is |\n|---|---|---|---|---|\n");
    for key in C::KEYS {
        let flag = if key.flag { format!("`--{}`", key.name.replace('_', "-")) } else { "YAML or `--set`".to_string() };
        let default = match &defaults[key.name] {
            Value::Null => "(none)".to_string(),
            value => format!("`{}`", value.to_string().trim_matches('"')),
        };
        let doc = key.doc.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "\\|");
        let rule = key.rules.iter().map(Rule::to_string).collect::<String>();
        table.push_str(&format!("| `{}` | {flag} | {default} | {rule} | {doc} |\n", key.name));
    }
    table
}

/// The first part of the run name of a configuration without `name`.
pub const UNNAMED_RUN: &str = "run";

/// `<name>_<label><value>..._s<seed>` with every key that differs from its default and has a
/// label, in alphabetical order of the keys.
pub fn run_name<C: Hyperparameters>(config: &C) -> Result<String> {
    let (here, defaults) = (object(config)?, object(&C::default())?);
    let name = here.get("name").and_then(Value::as_str).unwrap_or(UNNAMED_RUN);
    let mut parts = vec![name.to_string()];
    let mut keys: Vec<&String> = here.keys().collect();
    keys.sort_unstable();
    for key in keys {
        let value = &here[key];
        let label = C::key(key).map_or(Label::Key, |k| k.label);
        let short = match label {
            Label::Omit => continue,
            Label::Key => key.as_str(),
            Label::Short(short) => short,
        };
        if defaults.get(key) != Some(value) {
            parts.push(format!("{short}{}", compact(value)));
        }
    }
    let seed = here.get("seed").context("a configuration with run names has a `seed` key")?;
    parts.push(format!("s{}", compact(seed)));
    Ok(parts.join("_").replace(['/', ' '], "-"))
}

/// The config file's name stands for its reward and detector, so a run that overrides either
/// (flags, `--set`, a sweep's grid) says so in its name: `rew<label>` / `det<label>` for each one
/// that differs from the file's; empty when neither does.
fn changed_specs(from_file: &Map<String, Value>, overrides: &Map<String, Value>) -> String {
    let mut parts = Vec::new();
    for (key, short) in [("reward", "rew"), ("rh_detector", "det")] {
        if let Some(value) = overrides.get(key).filter(|v| from_file.get(key) != Some(*v)) {
            parts.push(format!("{short}-{}", spec_label(value)));
        }
    }
    parts.join("_")
}

/// Plugin names and parameter values of a reward or detector spec, joined by `-`
/// (`happy_count-threshold1`); `none` for null.
fn spec_label(value: &Value) -> String {
    fn walk(value: &Value, key: Option<&str>, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                // Which plugin first, then its parameters (maps iterate alphabetically).
                let (names, rest): (Vec<_>, Vec<_>) = map.iter().partition(|(k, _)| matches!(k.as_str(), "plugin" | "name"));
                names.into_iter().chain(rest).for_each(|(k, v)| walk(v, Some(k), out));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, None, out)),
            Value::Null => out.push("none".into()),
            leaf => match key {
                Some("plugin" | "name" | "role") | None => out.push(compact(leaf)),
                Some(k) => out.push(format!("{k}{}", compact(leaf))),
            },
        }
    }
    let mut out = Vec::new();
    walk(value, None, &mut out);
    out.join("-")
}

/// A value as it appears in a run name: `3e-4` rather than `0.0003`.
fn compact(value: &Value) -> String {
    match value {
        Value::Number(n) if n.is_f64() => {
            let x = n.as_f64().expect("f64 numbers convert");
            if x != 0.0 && (x.abs() < 1e-2 || x.abs() >= 1e5) {
                let s = format!("{x:e}");
                s.replace("e-0", "e-")
            } else {
                format!("{x}")
            }
        }
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests;
