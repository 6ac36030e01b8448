//! Adding a hyperparameter is one entry in a table: this test-only configuration declares
//! `dummy_knob` once, and the YAML key, the flag, `--set`, the run-name label, the saved
//! config, the sweep keys, its rule, the key reference and the accessor of the part that
//! reads it all follow.

use clap::Parser;

use super::Label::{Key, Omit, Short};
use super::*;

hyperparameters! {
    /// A test-only configuration.
    pub struct DummyConfig;
    /// Its flags.
    pub struct DummyFlags;
    flags {
        /// Experiment name.
        name: Option<String> = None, Omit;
        /// Random seed.
        seed: u64 = 42, Omit;
        /// Learning rate.
        lr: f64 = 1e-5, Key;
        /// A knob added by one line.
        #[rule(Rule::AtLeast(1.0))]
        dummy_knob: usize = 3, Short("dk") => DummyPart;
    }
    file_only {
        /// A structured value.
        #[serde(skip_serializing_if = "Option::is_none")]
        extra: Option<Value> = None, Omit;
    }
}

/// A part of a run that reads `dummy_knob`: it declares no field for it; its row does.
struct DummyPart {
    table: DummyConfig,
}

impl Part<DummyConfig> for DummyPart {
    fn table(&self) -> &DummyConfig {
        &self.table
    }
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    flags: DummyFlags,
}

#[test]
fn one_declaration_gives_the_yaml_key_flag_set_run_name_and_sweep_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("exp.yaml");
    std::fs::write(&file, "dummy_knob: 5\nlr: 0.001\n").unwrap();

    let from_yaml: DummyConfig = resolve(Some(&file), Map::new(), "dummy configuration").unwrap();
    assert_eq!((from_yaml.dummy_knob, from_yaml.name.as_deref()), (5, Some("exp")));
    assert_eq!(run_name(&from_yaml).unwrap(), "exp_dk5_lr1e-3_s42");

    let cli = Cli::try_parse_from(["x", "--dummy-knob", "7"]).unwrap();
    let mut overrides = cli.flags.to_map().unwrap();
    assert_eq!(overrides, serde_json::json!({"dummy_knob": 7}).as_object().unwrap().clone());
    let from_flag: DummyConfig = resolve(Some(&file), overrides.clone(), "dummy configuration").unwrap();
    assert_eq!(from_flag.dummy_knob, 7);

    let (key, value) = parse_override("dummy-knob=9").unwrap();
    overrides.insert(key, value);
    let from_set: DummyConfig = resolve(None, overrides, "dummy configuration").unwrap();
    assert_eq!(run_name(&from_set).unwrap(), "run_dk9_s42");

    let saved = crate::yaml::to_string(&from_set).unwrap();
    assert!(saved.contains("dummy_knob: 9") && !saved.contains("extra"), "{saved}");
    let reread: DummyConfig = crate::yaml::from_str(&saved).unwrap();
    assert_eq!(reread, from_set);

    check_key::<DummyConfig>("dummy_knob", "--grid").unwrap();
    check_key::<DummyConfig>("extra", "--fixed").unwrap();
    let typo = check_key::<DummyConfig>("dummy_knb", "--grid dummy_knb=1").unwrap_err().to_string();
    assert!(typo.contains("unknown key `dummy_knb`") && typo.contains("dummy_knob"), "{typo}");
    assert!(Cli::try_parse_from(["x", "--extra", "1"]).is_err(), "file-only keys have no flag");
    assert_eq!(DummyConfig::key("dummy_knob").unwrap().doc, " A knob added by one line.");
}

#[test]
fn one_row_gives_the_part_that_reads_the_key_and_the_reference_its_line() {
    let cli = Cli::try_parse_from(["x", "--dummy-knob", "11"]).unwrap();
    let config: DummyConfig = resolve(None, cli.flags.to_map().unwrap(), "dummy configuration").unwrap();
    assert_eq!(run_name(&config).unwrap(), "run_dk11_s42");
    let part = DummyPart { table: config };
    assert_eq!(part.dummy_knob(), 11, "the part reads the flag's value through the accessor its row gives it");
    assert_eq!(DummyPart { table: DummyConfig::default() }.dummy_knob(), 3, "and the default where no layer sets it");
    assert_eq!(DummyConfig::key("dummy_knob").unwrap().parts, ["DummyPart"]);
    assert!(DummyConfig::key("lr").unwrap().parts.is_empty());
    let reference = key_reference::<DummyConfig>();
    assert!(reference.contains("| `dummy_knob` | `--dummy-knob` | `3` | at least 1 | A knob added by one line. |\n"), "{reference}");
    assert!(reference.contains("| `extra` | YAML or `--set` | (none) |  | A structured value. |\n"), "{reference}");
}

#[test]
fn a_rows_rule_checks_its_key_and_names_it() {
    let config = |knob: usize| DummyConfig { dummy_knob: knob, ..DummyConfig::default() };
    config(1).check_rules().unwrap();
    assert_eq!(config(0).check_rules().unwrap_err().to_string(), "dummy_knob must be at least 1, got 0");
    assert_eq!(DummyConfig::key("dummy_knob").unwrap().rules, [Rule::AtLeast(1.0)]);
    assert!(DummyConfig::key("lr").unwrap().rules.is_empty());
}

/// Each rule against values on both sides of its bounds, NaN and an unset optional key.
#[test]
fn rules_hold_inside_their_bounds_only_and_refuse_nan() {
    let cases: [(Rule, &str, &[f64], &[f64]); 7] = [
        (Rule::Positive, "positive", &[1e-300, 5.0], &[0.0, -1.0]),
        (Rule::AtLeast(2.0), "at least 2", &[2.0, 3.0], &[1.999]),
        (Rule::closed(0.0, 1.0), "in [0, 1]", &[0.0, 1.0], &[-1e-9, 1.000001]),
        (Rule::closed_open(0.0, 1.0), "in [0, 1)", &[0.0, 0.999], &[1.0]),
        (Rule::open_closed(0.0, 1.0), "in (0, 1]", &[1e-9, 1.0], &[0.0]),
        (Rule::FinitePositive, "finite and above 0", &[1.0], &[0.0, f64::INFINITY]),
        (Rule::Finite, "finite", &[-1e300, 0.0], &[f64::NEG_INFINITY]),
    ];
    for (rule, says, inside, outside) in cases {
        assert_eq!(rule.to_string(), says);
        assert!(inside.iter().all(|&x| rule.holds(x)), "{says}: {inside:?}");
        assert!(outside.iter().chain(&[f64::NAN]).all(|&x| !rule.holds(x)), "{says}: {outside:?}");
        assert_eq!(rule.check("k", &f64::NAN).unwrap_err().to_string(), format!("k must be {says}, got NaN"));
        rule.check("k", &None::<f64>).unwrap();
    }
}

#[test]
fn unknown_keys_and_ill_typed_values_name_the_source() {
    let error = resolve::<DummyConfig>(None, serde_json::json!({"dummy_knob": "x"}).as_object().unwrap().clone(), "dummy configuration");
    let error = error.unwrap_err().to_string();
    assert!(error.contains("invalid dummy configuration (the command line)") && error.contains("invalid type"), "{error}");
}
